"""The recorder and `fasta-sm record`: tables in the replay format, failures kept as data."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from triton_device import DEVICE

from fasta_sm.backends.replay import load_table
from fasta_sm.errors import ConfigError
from fasta_sm.triton import record as recorder
from fasta_sm.triton import zoo
from fasta_sm.triton.cli import record_command
from fasta_sm.triton.record import record, spread, write_table


def test_record_writes_a_table_the_replay_backend_loads(tmp_path):
    spec = zoo.spec_softmax(M=5, N=300)
    spec.configs = spread(spec.configs, 3)
    table = record(spec, device=DEVICE, warmup_ms=0, rep_ms=0)
    assert table["kernel"] == "softmax_fp32_5x300" and len(table["configs"]) == 3
    assert table["timing"]["method"].startswith("host-clock" if DEVICE == "cpu" else "triton.testing.do_bench")
    for row in table["configs"]:
        assert row["error"] is None and len(row["duration_us"]) == 2 and row["compile_s"] >= 0
    path = write_table(table, tmp_path / "softmax.json")
    assert load_table(path) is not None
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda" or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_a_recording_on_another_gpu_than_the_current_one_runs_there_and_names_it():
    """Triton compiles for, launches on and names the current device: `--device cuda:N` must make it current."""
    other = torch.cuda.device_count() - 1
    spec = zoo.spec_softmax(M=5, N=300)
    spec.configs = spread(spec.configs, 2)
    table = record(spec, device=f"cuda:{other}", warmup_ms=0, rep_ms=0)
    assert all(row["error"] is None for row in table["configs"])
    assert table["device"] == torch.cuda.get_device_name(other) and torch.cuda.current_device() == 0


def test_a_config_with_a_wrong_result_is_recorded_as_failed():
    # N_CTX smaller than BLOCK_M: the grid is empty, nothing is written.
    spec = zoo.spec_attention(Z=1, H=1, N_CTX=32, HEAD_DIM=16)
    spec.configs = [c for c in spec.configs if c.kwargs["BLOCK_N"] == 16 and c.num_stages == 1 and c.num_warps == 4]
    table = record(spec, device=DEVICE, warmup_ms=0, rep_ms=0)
    by_block = {row["kwargs"]["BLOCK_M"]: row for row in table["configs"]}
    assert by_block[32]["error"] is None and len(by_block[32]["duration_us"]) == 2
    assert by_block[64]["error"].startswith("WrongResult") and by_block[64]["duration_us"] == []


def test_a_kernel_at_another_shape_than_the_data_sets_gets_a_table_of_its_own():
    assert zoo.spec_rmsnorm().name == "rmsnorm_bf16"
    assert zoo.spec_rmsnorm(M=32768, N=2048).name == "rmsnorm_bf16_32768x2048"
    assert zoo.spec_mm_skinny_bf16(M=16).name == "mm_skinny_bf16_m16"
    assert zoo.spec_mm_skinny_bf16(M=32, N=4096, K=14336).name == "mm_skinny_bf16_m32_4096x14336"


@pytest.mark.parametrize(("spec", "sizes", "says"), [
    (zoo.spec_row_sum, {"M": 0}, "M=0"),
    (zoo.spec_mm_fp16, {"K": -4}, "K=-4"),
    (zoo.spec_attention, {"N_CTX": 2.5}, "N_CTX=2.5"),
], ids=["empty", "negative", "fractional"])
def test_a_zoo_kernel_at_a_size_that_is_no_size_is_refused_naming_it(spec, sizes, says):
    """A zero-size problem would record a table of timings of nothing."""
    with pytest.raises(ConfigError, match=f"{says} must be a whole number of at least 1"):
        spec(**sizes)


def test_a_limited_recording_is_named_as_a_subset_and_leaves_the_full_table_in_place(tmp_path):
    full = tmp_path / "row_sum_fp32_3x700.json"
    full.write_text("the whole space, recorded before")
    result = record_row_sum(tmp_path)
    assert result.exit_code == 0, result.output
    assert "recording row_sum_fp32_3x700_subset1: 1 configs (an evenly spaced subset of" in result.output
    assert json.loads((tmp_path / "row_sum_fp32_3x700_subset1.json").read_text())["kernel"] == (
        "row_sum_fp32_3x700_subset1")
    assert full.read_text() == "the whole space, recorded before"


def test_spread_keeps_an_evenly_spaced_subset():
    configs = zoo.spec_transpose().configs
    assert spread(configs, 5)[0] == configs[0] and len(spread(configs, 5)) == 5
    assert spread(configs, None) == configs


def test_record_command_writes_one_table_per_spec(tmp_path):
    result = CliRunner().invoke(record_command, [
        "fasta_sm.triton.zoo:spec_row_sum", "rmsnorm", "--out", str(tmp_path), "--param", "M=3",
        "--param", "N=700", "--limit", "2", "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE,
    ])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.glob("*.json"))
    assert names == ["rmsnorm_bf16_3x700_subset2.json", "row_sum_fp32_3x700_subset2.json"]
    table = json.loads((tmp_path / "row_sum_fp32_3x700_subset2.json").read_text())
    assert table["shape"] == {"M": 3, "N": 700, "dtype": "fp32"} and len(table["configs"]) == 2


def test_a_kernel_already_in_tritons_cache_is_recorded_with_a_warning_naming_the_cache(tmp_path):
    cache = tmp_path / "cache"
    (cache / "0abc").mkdir(parents=True)
    (cache / "0abc" / "row_sum_kernel.json").write_text("{}")  # a build of the same kernel, from an earlier run
    result = CliRunner().invoke(record_command, [
        "row_sum", "--out", str(tmp_path / "out"), "--param", "M=3", "--param", "N=700", "--limit", "1",
        "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE,
    ], env={"TRITON_CACHE_DIR": str(cache)})
    assert result.exit_code == 0, result.output
    assert f"row_sum_fp32_3x700_subset1: Triton's cache {cache} already holds 1 build of its kernel" in result.output


def test_a_recording_whose_two_passes_disagree_past_noise_ends_with_a_warning_to_record_it_again(
    tmp_path, monkeypatch
):
    def disturbed(*args, **kwargs):
        table = record(*args, **kwargs)
        table["timing"]["method"] = "triton.testing.do_bench median, 2 passes in opposite orders"  # as on a GPU
        for row in table["configs"]:
            if row["duration_us"]:
                row["duration_us"][1] = 2 * row["duration_us"][0]  # the second pass ran through a disturbance
        return table

    monkeypatch.setattr(recorder, "record", disturbed)
    result = CliRunner().invoke(record_command, [
        "row_sum", "--out", str(tmp_path / "out"), "--param", "M=3", "--param", "N=700", "--limit", "2",
        "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE,
    ], env={"TRITON_CACHE_DIR": str(tmp_path / "empty")})
    assert result.exit_code == 0, result.output
    table = tmp_path / "out" / "row_sum_fp32_3x700_subset2.json"
    assert f"warning: {table}: 2 of 2 configs were timed over 1.5x apart" in result.output.replace("\n", "")


def test_a_kernel_new_to_the_cache_is_recorded_without_the_warm_cache_warning(tmp_path):
    """Only that warning: timed with no repeats, as here, a microsecond kernel's two passes may differ past noise
    on a GPU, and the recorder rightly warns of that."""
    result = CliRunner().invoke(record_command, [
        "row_sum", "--out", str(tmp_path / "out"), "--param", "M=3", "--param", "N=700", "--limit", "1",
        "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE,
    ], env={"TRITON_CACHE_DIR": str(tmp_path / "empty")})
    assert result.exit_code == 0 and "already holds" not in result.output


@pytest.mark.parametrize(
    ("spec", "params", "says"),
    [
        ("nosuch", [], "zoo kernel (add_gelu"),
        ("no_such_module:spec", [], "cannot import 'no_such_module'"),
        ("fasta_sm.triton.zoo:nofunc", [], "has no function 'nofunc'"),
        ("os:getpid", [], "spec 'os:getpid' returned int "),
        ("mm_fp16", ["--param", "X=1"], "'X'"),
        ("softmax", ["--param", "M=abc"], "softmax_fp32_abcx8192: cannot make its inputs at"),
        ("softmax", ["--param", "M=-4"], "spec_softmax' called with {'M': -4}: shape {'M': -4, 'N': 8192, 'dtype': "
                                         "'fp32'}: M=-4 must be a whole number of at least 1"),
    ],
)
def test_record_with_a_bad_spec_is_a_clear_error_naming_it(spec, params, says, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "from fasta_sm.cli import run; run()", "record", spec, *params, "--out", str(tmp_path),
         "--device", DEVICE],
        capture_output=True, text=True,
    )
    assert done.returncode in (1, 2) and says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_record_refuses_an_empty_out_rather_than_writing_into_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(record_command, ["row_sum", "--out", "", "--device", DEVICE, "--limit", "1"])
    assert result.exit_code == 2 and "'--out': is empty" in result.output and not list(tmp_path.iterdir())


def test_record_without_a_gpu_says_how_to_record_on_a_cpu(tmp_path, monkeypatch):
    """`--device` defaults to cuda: on a CPU box the error is the user's first, for an option never typed."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(record_command, ["row_sum", "--out", str(tmp_path / "out"), "--limit", "1"])
    assert result.exit_code == 2, result.output
    assert "cuda: torch sees no CUDA device here" in result.output
    assert "TRITON_INTERPRET=1 with --device cpu" in result.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize("device", ["cpu0", "bogus"])
def test_record_refuses_a_device_torch_does_not_know_before_making_the_out_folder(device, tmp_path):
    result = CliRunner().invoke(record_command, ["row_sum", "--out", str(tmp_path / "out"), "--device", device,
                                                 "--limit", "1"])
    assert result.exit_code == 2, result.output
    assert f"{device}: not a device torch knows" in result.output and not (tmp_path / "out").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the count of GPUs is what is checked")
def test_record_refuses_a_gpu_this_host_lacks_naming_the_ones_it_has(tmp_path):
    missing = f"cuda:{torch.cuda.device_count()}"
    result = CliRunner().invoke(record_command, ["row_sum", "--out", str(tmp_path / "out"), "--device", missing,
                                                 "--limit", "1"])
    assert result.exit_code == 2 and "(cuda:0 to cuda:" in result.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [("--warmup-ms", "inf"), ("--warmup-ms", "-5"), ("--rep-ms", "nan"), ("--rep-ms", "-1"), ("--workers", "0"),
     ("--deadline-s", "0"), ("--deadline-s", "-1")],
)
def test_record_refuses_an_option_out_of_range_naming_it_before_recording(option, value, tmp_path):
    result = CliRunner().invoke(record_command, ["row_sum", "--out", str(tmp_path), "--device", DEVICE, "--limit", "1",
                                                 option, value])
    assert result.exit_code == 2 and option in result.output and not list(tmp_path.iterdir()), result.output


def test_ctrl_c_while_recording_says_the_rest_wants_an_empty_cache(monkeypatch, capsys, tmp_path):
    import fasta_sm.triton.record
    from fasta_sm.cli import run

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fasta_sm.triton.record, "record", interrupted)
    monkeypatch.setattr(sys, "argv", ["fasta-sm", "record", "row_sum", "--out", str(tmp_path), "--device", DEVICE,
                                      "--limit", "1", "--param", "M=3", "--param", "N=700"])
    with pytest.raises(SystemExit) as exit_:
        run()
    assert exit_.value.code == 130 and "record the rest from an empty TRITON_CACHE_DIR" in capsys.readouterr().err


def test_record_refuses_timing_settings_that_are_not_finite_and_non_negative():
    with pytest.raises(ConfigError, match=r"softmax_fp32_5x300: warmup_ms=inf"):
        record(zoo.spec_softmax(M=5, N=300), device=DEVICE, warmup_ms=float("inf"), rep_ms=0)


@pytest.mark.parametrize("device", ["bogus", f"cuda:{torch.cuda.device_count()}"], ids=["no device", "no such GPU"])
def test_a_device_that_cannot_be_made_current_is_a_config_error_naming_the_kernel(device):
    """`record` skips such a kernel with its reason and goes on to the next, as for inputs it cannot make."""
    with pytest.raises(ConfigError, match=rf"softmax_fp32_5x300: cannot record on '{device}': "):
        record(zoo.spec_softmax(M=5, N=300), device=device, warmup_ms=0, rep_ms=0)


def test_a_table_names_the_fasta_sm_record_command_that_made_it(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "fasta_sm.triton.cli", "row_sum", "--out", str(tmp_path), "--param", "M=3",
         "--param", "N=700", "--limit", "1", "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    command = json.loads((tmp_path / "row_sum_fp32_3x700_subset1.json").read_text())["command"]
    assert command.startswith("fasta-sm record row_sum --out ")


def test_a_command_line_with_bytes_no_text_holds_is_kept_escaped_and_the_table_reads_back(tmp_path):
    out = tmp_path / os.fsdecode(b"tables-\xff")  # a directory name that is not UTF-8
    done = subprocess.run(
        [sys.executable, "-m", "fasta_sm.triton.cli", "row_sum", "--out", str(out), "--param", "M=3",
         "--param", "N=700", "--limit", "1", "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE],
        capture_output=True, text=True, errors="surrogateescape",
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},  # as a UTF-8 locale has it (not C's surrogateescape)
    )
    assert done.returncode == 0, done.stderr
    assert "tables-\\udcff" in done.stdout  # "wrote ...": the path printed, its byte escaped
    table = load_table(out / "row_sum_fp32_3x700_subset1.json")
    assert "tables-\\udcff" in table.meta["command"]


def test_a_config_whose_error_text_holds_undecodable_bytes_is_recorded_with_it_escaped(monkeypatch):
    def check(backend, spec, config, expected):  # a compiler's message read with surrogateescape
        return "WrongResult in " + os.fsdecode(b"/tmp/cache-\xff") if config.kwargs["BLOCK"] == 64 else None

    monkeypatch.setattr(recorder, "check_output", check)
    table = record(accumulate_spec(), device=DEVICE, warmup_ms=0, rep_ms=0)
    by_block = {row["kwargs"]["BLOCK"]: row for row in table["configs"]}
    assert by_block[64]["error"] == "WrongResult in /tmp/cache-\\udcff" and len(by_block[128]["duration_us"]) == 2


def test_a_spec_with_a_config_twice_is_refused_before_anything_is_recorded():
    spec = zoo.spec_softmax(M=5, N=300)
    spec.configs = [spec.configs[0], spec.configs[1], spec.configs[0]]
    with pytest.raises(ConfigError, match=r"configs #0 and #2 are the same config"):
        record(spec, device=DEVICE, warmup_ms=0, rep_ms=0)


def test_the_recorder_module_run_as_a_script_shows_errors_as_fasta_sm_record_does(tmp_path):
    done = subprocess.run([sys.executable, "-m", "fasta_sm.triton.cli", "nosuch:spec", "--out", str(tmp_path),
                           "--device", DEVICE], capture_output=True, text=True)
    assert done.returncode == 2 and "cannot import 'nosuch'" in done.stderr and "Traceback" not in done.stderr


def test_the_output_check_zeroes_an_accumulated_output_so_right_configs_pass():
    from kernels import accumulate_kernel, grid

    from fasta_sm.config import Config
    from fasta_sm.triton.spec import KernelSpec

    def make_args(device):
        return (torch.arange(300, dtype=torch.float32, device=device), torch.zeros(300, device=device), 300, 2.0)

    spec = KernelSpec(
        name="accumulate", fn=accumulate_kernel, configs=[Config({"BLOCK": b}, num_warps=1) for b in (64, 128)],
        make_args=make_args, grid=grid, shape={"n": 300}, reference=lambda args: 2.0 * args[0], output=1,
        reset_to_zero=["out_ptr"],
    )
    table = record(spec, device=DEVICE, warmup_ms=0, rep_ms=0)
    assert [row["error"] for row in table["configs"]] == [None, None]


def test_the_output_check_keeps_an_output_updated_in_place_so_right_configs_pass():
    from kernels import accumulate_kernel, grid

    from fasta_sm.config import Config
    from fasta_sm.triton.spec import KernelSpec

    def make_args(device):
        return (torch.arange(300, dtype=torch.float32, device=device), torch.ones(300, device=device), 300, 2.0)

    spec = KernelSpec(
        name="accumulate", fn=accumulate_kernel, configs=[Config({"BLOCK": b}, num_warps=1) for b in (64, 128)],
        make_args=make_args, grid=grid, shape={"n": 300}, reference=lambda args: args[1] + 2.0 * args[0], output=1,
        restore_value=["out_ptr"],
    )
    table = record(spec, device=DEVICE, warmup_ms=0, rep_ms=0)
    assert [row["error"] for row in table["configs"]] == [None, None]


def test_a_zoo_matmul_recorded_at_another_shape_is_named_for_it():
    from fasta_sm.triton import zoo

    assert zoo.spec_mm_fp16().name == "mm_fp16_4096"  # the shipped table's name
    assert zoo.spec_mm_fp16(M=2048).name == "mm_fp16_2048x4096x4096"


def test_a_type_error_inside_a_spec_function_is_its_own_not_a_bad_parameter(tmp_path, monkeypatch):
    from fasta_sm.triton.spec import load_spec

    (tmp_path / "broken_specs.py").write_text("def spec(N=1):\n    return len(N)  # a bug in the spec itself\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError, match="has no len"):
        load_spec("broken_specs:spec", N=3)
    with pytest.raises(ConfigError, match=r"called with \{'M': 3\}"):
        load_spec("broken_specs:spec", M=3)


def accumulate_spec(**overrides):
    from kernels import accumulate_kernel, grid

    from fasta_sm.config import Config
    from fasta_sm.triton.spec import KernelSpec

    def make_args(device):
        return (torch.arange(300, dtype=torch.float32, device=device), torch.zeros(300, device=device), 300, 2.0)

    configs = [Config({"BLOCK": b}, num_warps=1) for b in (64, 128)]
    fields = dict(name="accumulate", fn=accumulate_kernel, configs=configs, make_args=make_args, grid=grid,
                  shape={"n": 300}, reference=lambda args: 2.0 * args[0], output=1, reset_to_zero=["out_ptr"])
    return KernelSpec(**{**fields, **overrides})


def test_a_recording_in_which_every_config_failed_is_refused_not_written_unreadable():
    from fasta_sm.errors import TableError

    wrong = accumulate_spec(reference=lambda args: 5.0 * args[0])  # every config fails the output check
    with pytest.raises(TableError, match=r"accumulate: every config failed"):
        record(wrong, device=DEVICE, warmup_ms=0, rep_ms=0)


def test_configs_the_format_cannot_tell_apart_are_refused_before_anything_is_compiled():
    from fasta_sm.config import Config

    twins = accumulate_spec(configs=[Config({"BLOCK": 64}, num_warps=1), Config({"BLOCK": 64}, num_warps=1,
                                                                                options={"maxnreg": 128})])
    twins.make_args = None  # nothing may run: making the inputs would raise
    with pytest.raises(ConfigError, match=r"accumulate: configs #0 and #1 differ only in launch options"):
        record(twins, device=DEVICE, warmup_ms=0, rep_ms=0)


@pytest.mark.parametrize("shape", [{"dtype": torch.float32}, {"eps": float("nan")}, {1: "a", "1": "b"}],
                         ids=["an object", "nan", "a key that is no string"])
def test_a_shape_a_table_cannot_hold_is_refused_before_anything_is_compiled(shape):
    spec = accumulate_spec(shape=shape)
    spec.make_args = None
    with pytest.raises(ConfigError, match=r"accumulate: shape .* (cannot be written to a table|string keys)"):
        record(spec, device=DEVICE, warmup_ms=0, rep_ms=0)


def test_a_table_is_written_readable_by_others(tmp_path):
    path = write_table({"kernel": "k"}, tmp_path / "k.json")
    assert path.stat().st_mode & 0o777 == 0o644


def record_row_sum(out, *more):
    return CliRunner().invoke(record_command, [
        "row_sum", "--out", str(out), "--param", "M=3", "--param", "N=700", "--limit", "1",
        "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE, *more,
    ])


def test_record_refuses_to_replace_a_table_already_in_out_without_force(tmp_path):
    table = tmp_path / "row_sum_fp32_3x700_subset1.json"
    table.write_text("a recording that took GPU minutes")
    refused = record_row_sum(tmp_path)
    assert refused.exit_code == 1 and f"{table} exists; pass --force to replace it" in refused.output
    assert table.read_text() == "a recording that took GPU minutes"
    assert record_row_sum(tmp_path, "--force").exit_code == 0 and load_table(table) is not None


def test_a_spec_parameter_its_inputs_cannot_take_is_one_line_naming_it(tmp_path):
    result = CliRunner().invoke(record_command, [
        "row_sum", "--out", str(tmp_path), "--param", "M=bad", "--param", "N=700", "--limit", "1",
        "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE,
    ])
    error = next(line for line in result.output.splitlines() if "cannot make its inputs" in line)
    assert error.startswith("error: row_sum_fp32_badx700_subset1: cannot make its inputs at {'M': 'bad'")
    assert error.endswith("; no table written") and result.exit_code == 1


def test_the_recorder_module_takes_the_record_word_its_usage_line_shows(tmp_path):
    done = subprocess.run([sys.executable, "-m", "fasta_sm.triton.cli", "record", "nosuch:spec", "--out",
                           str(tmp_path), "--device", DEVICE], capture_output=True, text=True)
    assert done.returncode == 2 and "cannot import 'nosuch'" in done.stderr


def test_the_recorder_times_the_space_twice_the_second_time_in_reverse(monkeypatch):
    from fasta_sm.triton.backend import TritonBackend

    passes, benchmark = [], TritonBackend.benchmark

    def logged(self, configs, *args, **kwargs):
        passes.append([c.identity for c in configs])
        return benchmark(self, configs, *args, **kwargs)

    monkeypatch.setattr(TritonBackend, "benchmark", logged)
    spec = zoo.spec_softmax(M=5, N=300)
    spec.configs = spread(spec.configs, 3)
    record(spec, device=DEVICE, warmup_ms=0, rep_ms=0, check=False)
    assert len(passes) == 2 and len(passes[0]) == 3 and passes[1] == passes[0][::-1]


@pytest.mark.parametrize("bad", ["bogus", "no_such_module:spec", "fasta_sm.triton.zoo:no_such_spec"])
def test_a_spec_that_cannot_be_resolved_is_refused_before_any_kernel_is_recorded(bad, tmp_path):
    """A recording costs GPU minutes: a typo in the last spec must not come to light after the first ones."""
    result = CliRunner().invoke(record_command, [
        "row_sum", bad, "--out", str(tmp_path / "out"), "--param", "M=3", "--param", "N=700", "--limit", "1",
        "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE,
    ])
    assert result.exit_code != 0 and bad.split(":")[-1] in result.output
    assert "recording" not in result.output and not (tmp_path / "out").exists()


def test_an_out_dir_no_table_can_be_written_to_is_refused_before_any_kernel_is_recorded(tmp_path):
    (tmp_path / "a_file").write_text("")
    result = CliRunner().invoke(record_command, [
        "row_sum", "--out", str(tmp_path / "a_file" / "out"), "--param", "M=3", "--param", "N=700", "--limit", "1",
        "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE,
    ])
    assert result.exit_code == 2 and "--out" in result.output and "no table can be written there" in result.output
    assert "recording" not in result.output


def test_a_spec_param_given_twice_is_refused_not_taken_last(tmp_path):
    result = CliRunner().invoke(record_command, [
        "row_sum", "--out", str(tmp_path / "out"), "--param", "M=3", "--param", "M=4", "--device", DEVICE,
    ])
    assert result.exit_code == 2 and "M is given twice" in result.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize("shape", [{"n": 300, "extra": {1: "a", "1": "b"}}, {"n": 300, "dtype": "\ud800"}],
                         ids=["nested keys that collide", "a lone surrogate"])
def test_a_shape_the_reader_would_refuse_is_refused_before_anything_is_compiled(shape):
    """json.dumps turns a nested key 1 into "1": beside a key "1" the written object names a key twice,
    which load_table refuses; a lone surrogate it refuses as no Unicode text. Both were found only after
    the whole space was compiled and timed (or, for the first, not at all: the table was written)."""
    spec = accumulate_spec(shape=shape)
    spec.make_args = None  # nothing may run: refused before anything compiles
    with pytest.raises(ConfigError, match=r"accumulate: shape .*"):
        record(spec, device=DEVICE, warmup_ms=0, rep_ms=0)


@pytest.mark.parametrize("name", ["", "\ud800", 7], ids=["empty", "lone surrogate", "not a string"])
def test_a_kernel_name_a_table_cannot_hold_is_refused_before_anything_is_compiled(name):
    spec = accumulate_spec(name=name)
    spec.make_args = None  # nothing may run: making the inputs would raise
    with pytest.raises(ConfigError, match=r"kernel name"):
        record(spec, device=DEVICE, warmup_ms=0, rep_ms=0)


@pytest.mark.parametrize("spec", [zoo.spec_softmax, zoo.spec_mm_fp16, zoo.spec_attention_d128],
                         ids=["softmax", "mm_fp16", "attention_d128"])
def test_a_zoo_kernel_given_an_empty_config_list_is_refused_not_recorded_over_its_whole_space(spec):
    """`configs or default` took an empty list for no list at all: the whole space (hundreds of configs,
    GPU minutes) was recorded instead of the nothing asked for."""
    empty = spec(configs=[])
    assert empty.configs == []
    empty.make_args = None  # nothing may run: refused before the inputs are made
    with pytest.raises(ConfigError, match=rf"kernel '{empty.name}': the config list is empty"):
        record(empty, device=DEVICE, warmup_ms=0, rep_ms=0)


def test_a_recording_in_which_every_config_failed_says_why_they_failed(tmp_path, monkeypatch):
    """No table is written for it, so the refusal is the only place left to say what went wrong: without the
    configs' errors the whole recording must be run again, under a debugger, to learn it."""
    from fasta_sm.errors import TableError

    wrong = accumulate_spec(reference=lambda args: 5.0 * args[0])
    with pytest.raises(TableError, match=r"accumulate: every config failed \(2 × WrongResult: relative error "):
        record(wrong, device=DEVICE, warmup_ms=0, rep_ms=0)

    monkeypatch.setattr(zoo, "spec_row_sum", lambda **sizes: accumulate_spec(
        name="accumulate", reference=lambda args: 5.0 * args[0]))
    result = CliRunner().invoke(record_command, [
        "fasta_sm.triton.zoo:spec_row_sum", "rmsnorm", "--out", str(tmp_path), "--param", "M=3", "--param", "N=700",
        "--limit", "1", "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE,
    ], env={"TRITON_CACHE_DIR": str(tmp_path / "empty")})
    assert result.exit_code == 1 and "every config failed (1 × WrongResult: relative error" in result.output
    assert "no table for accumulate_subset1 (above)" in result.output  # reported, and the next kernel recorded
    assert sorted(path.name for path in tmp_path.glob("*.json")) == ["rmsnorm_bf16_3x700_subset1.json"]


@pytest.mark.parametrize("broken", [
    lambda **sizes: accumulate_spec(configs=[]),  # refused by load_spec: an empty config list
    lambda **sizes: accumulate_spec(make_args=lambda device: 1 / 0),  # refused by record: no inputs
], ids=["empty config list", "inputs it cannot make"])
def test_a_kernel_refused_at_its_turn_is_reported_and_the_next_is_recorded(broken, tmp_path, monkeypatch):
    """docs/cli.md: `record` goes on to the next kernel after one that failed, and names at the end every kernel
    left without a table. A ConfigError at a kernel's turn stopped the whole run instead."""
    monkeypatch.setattr(zoo, "spec_row_sum", broken)
    result = CliRunner().invoke(record_command, [
        "fasta_sm.triton.zoo:spec_row_sum", "rmsnorm", "--out", str(tmp_path), "--param", "M=3", "--param", "N=700",
        "--limit", "1", "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE,
    ], env={"TRITON_CACHE_DIR": str(tmp_path / "empty")})
    assert result.exit_code == 1, result.output
    assert sorted(path.name for path in tmp_path.glob("*.json")) == ["rmsnorm_bf16_3x700_subset1.json"]
    assert "accumulate" in result.output and "no table written" in result.output
    assert "Error: no table for fasta_sm.triton.zoo:spec_row_sum (above)" in result.output \
        or "Error: no table for accumulate_subset1 (above)" in result.output


def test_a_table_path_taken_by_a_directory_is_refused_before_recording_even_with_force(tmp_path):
    """--force replaces a table, not a directory: it was recorded whole, then the write failed (IsADirectoryError),
    losing the recording and stopping every kernel after it."""
    (tmp_path / "row_sum_fp32_3x700_subset1.json").mkdir()
    result = CliRunner().invoke(record_command, [
        "row_sum", "rmsnorm", "--out", str(tmp_path), "--param", "M=3", "--param", "N=700", "--limit", "1",
        "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE, "--force",
    ], env={"TRITON_CACHE_DIR": str(tmp_path / "empty")})
    assert result.exit_code == 1, result.output
    assert f"{tmp_path / 'row_sum_fp32_3x700_subset1.json'} is not a file" in result.output
    assert "recording row_sum" not in result.output
    assert "Error: no table for row_sum_fp32_3x700_subset1" in result.output
    assert load_table(tmp_path / "rmsnorm_bf16_3x700_subset1.json") is not None


def test_a_table_written_to_out_while_its_kernel_was_recorded_is_not_replaced_without_force(tmp_path, monkeypatch):
    """Another recording of the same kernel into the same --out (runs of one kernel per process, say) may finish
    first: the check for a table is made before recording, so it was replaced without --force."""
    target = tmp_path / "row_sum_fp32_3x700_subset1.json"

    def raced(*args, **kwargs):
        table = record(*args, **kwargs)
        target.write_text("the other process's table")
        return table

    monkeypatch.setattr(recorder, "record", raced)
    result = record_row_sum(tmp_path)
    assert target.read_text() == "the other process's table"
    assert result.exit_code == 1 and f"{target} was written meanwhile" in result.output, result.output
    [kept] = tmp_path.glob("row_sum_fp32_3x700_subset1.json.*.unplaced")  # this recording: nothing lost
    assert f"this recording is in {kept}" in result.output and load_table(kept).kernel == target.stem


def test_a_table_that_cannot_be_written_is_reported_and_the_next_kernel_is_recorded(tmp_path, monkeypatch):
    """A write that fails once recorded (a full disk) ended the run with one 'Error:' line: the kernels after it
    were never recorded, against docs/cli.md's 'goes on to the next kernel after one that failed'."""
    write = recorder.write_table

    def full_disk(table, path, **kwargs):
        if table["kernel"].startswith("row_sum"):
            raise OSError(28, "No space left on device", str(path))
        return write(table, path, **kwargs)

    monkeypatch.setattr(recorder, "write_table", full_disk)
    result = CliRunner().invoke(record_command, [
        "row_sum", "rmsnorm", "--out", str(tmp_path), "--param", "M=3", "--param", "N=700", "--limit", "1",
        "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE,
    ], env={"TRITON_CACHE_DIR": str(tmp_path / "empty")})
    assert result.exit_code == 1, result.output
    assert f"error: cannot write {tmp_path / 'row_sum_fp32_3x700_subset1.json'}: " in result.output
    assert "No space left on device" in result.output and "no table for row_sum_fp32_3x700_subset1" in result.output
    assert [path.name for path in tmp_path.glob("*.json")] == ["rmsnorm_bf16_3x700_subset1.json"]


def rename_row_sum(monkeypatch, name) -> None:
    """The zoo's row_sum spec, its kernel named `name`, as a user's spec module may name it."""
    original = zoo.spec_row_sum

    def renamed(**sizes):
        spec = original(**sizes)
        spec.name = name
        return spec

    monkeypatch.setattr(zoo, "spec_row_sum", renamed)


def record_whole_row_sum(out, cache_dir, *extra):
    """`fasta-sm record` of the row_sum spec by its module path, its whole space at a tiny shape, into `out`."""
    return CliRunner().invoke(record_command, [
        "fasta_sm.triton.zoo:spec_row_sum", *extra, "--out", str(out), "--param", "M=3", "--param", "N=700",
        "--rep-ms", "0", "--warmup-ms", "0", "--device", DEVICE,
    ], env={"TRITON_CACHE_DIR": str(cache_dir)})


@pytest.mark.parametrize("name", ["sub/row_sum", "../row_sum", "row\x00sum", "r" * 240, "r" * 300],
                         ids=["a separator", "up out of --out", "a NUL", "too long for its temporary file",
                              "too long for the file system"])
def test_a_kernel_name_no_table_file_in_out_can_take_is_refused_before_recording(name, tmp_path, monkeypatch):
    """A table is `--out/<kernel>.json`: a name with a separator wrote it into a subfolder or out of --out;
    one with a NUL or too long was found only once the whole space was recorded (a traceback, or the recording
    lost, the kernels after it too where `target.exists()` raised)."""
    rename_row_sum(monkeypatch, name)
    out, cache = tmp_path / "out", tmp_path / "cache"  # on a GPU Triton's cache holds JSON files of its own
    result = record_whole_row_sum(out, cache, "rmsnorm", "--limit", "1")
    assert result.exit_code == 1, result.output
    assert "cannot name a table" in result.output and result.output.count("recording ") == 1  # rmsnorm's alone
    assert sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*.json") if cache not in path.parents) \
        == ["out/rmsnorm_bf16_3x700_subset1.json"]
    assert not list(out.glob(".*.tmp"))


def test_a_kernel_name_that_makes_its_table_a_hidden_file_is_refused_before_recording(tmp_path, monkeypatch):
    """`bench --tables DIR` and `tables` leave hidden files out (an editor's `.#t.json`): a kernel named `.k`
    was recorded whole into `DIR/.k.json`, a table no listing of DIR would show."""
    rename_row_sum(monkeypatch, ".row_sum")
    result = record_whole_row_sum(tmp_path, tmp_path / "empty")
    assert result.exit_code == 1, result.output
    assert "hidden file" in result.output and "recording " not in result.output
    assert not [path for path in tmp_path.iterdir() if path.name != "empty"]


def test_a_spec_with_an_empty_name_is_refused_under_limit_too_not_recorded_as_a_subset(tmp_path, monkeypatch):
    """--limit names a subset `<name>_subsetN`: an empty name became `_subset1`, which passed every check."""
    rename_row_sum(monkeypatch, "")
    result = record_whole_row_sum(tmp_path, tmp_path / "empty", "--limit", "1")
    assert result.exit_code == 1, result.output
    assert "kernel name '' cannot name a table" in result.output and not list(tmp_path.glob("*.json"))


def test_a_spec_whose_name_is_no_string_is_named_at_the_end_as_left_without_a_table(tmp_path, monkeypatch):
    """The run's last line joined the unwritten kernels' names: a spec named 7 (refused by record) ended the
    run in a TypeError traceback instead of 'no table for 7'."""
    rename_row_sum(monkeypatch, 7)
    result = record_whole_row_sum(tmp_path, tmp_path / "empty")
    assert result.exit_code == 1 and not isinstance(result.exception, TypeError), result.output
    assert "kernel name 7 cannot name a table" in result.output and "no table for 7 (above)" in result.output


@pytest.mark.parametrize("name", ["", None], ids=["empty", "none"])
def test_a_spec_that_names_no_kernel_is_refused_before_recording_and_named_by_its_spec_at_the_end(
    name, tmp_path, monkeypatch
):
    """A spec whose KernelSpec.name was empty printed 'recording : 3 configs' before it was refused, and the run
    ended on 'no table for  (above)', naming nothing; None ended on 'no table for None'."""
    rename_row_sum(monkeypatch, name)
    result = record_whole_row_sum(tmp_path, tmp_path / "empty", "rmsnorm", "--limit", "1")
    assert result.exit_code == 1, result.output
    assert f"kernel name {name!r} cannot name a table" in result.output
    assert result.output.count("recording ") == 1  # rmsnorm's alone
    assert "Error: no table for fasta_sm.triton.zoo:spec_row_sum (above)" in result.output
