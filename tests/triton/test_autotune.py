"""`fasta_sm.autotune` end to end: tune, check the output, reuse, key separation, kill and resume."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import inspect
import os
import re
import signal
import subprocess
import sys
import time
import types
import weakref
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from kernels import CONFIGS, accumulate_kernel, grid, make_tuned
from triton_device import DEVICE, HAS_CUDA

import fasta_sm
from fasta_sm.errors import BackendError, PolicyError, StateDirError, TuneFailed, notes_of
from fasta_sm.policies import make_policy
from fasta_sm.store import StateStore
from fasta_sm.triton.autotune import _source_hash, to_fasta_config, to_triton_config
from fasta_sm.triton.backend import TritonBackend

HERE = Path(__file__).parent


def launch(kernel, n=2048):
    x = torch.randn(n, device=DEVICE)
    out = torch.zeros(n, device=DEVICE)
    kernel[grid](x, out, n, 2.0)
    return x, out


@pytest.fixture(scope="module")
def tuned_dir(tmp_path_factory):
    """One finished tune shared by the reuse tests (the interpreter is slow)."""
    state_dir = tmp_path_factory.mktemp("states")
    kernel = make_tuned(str(state_dir))
    x, out = launch(kernel)
    return state_dir, kernel, x, out


def test_tunes_then_launches_the_winner_with_the_right_output(tuned_dir):
    state_dir, kernel, x, out = tuned_dir
    torch.testing.assert_close(out, 2.0 * x)  # reset_to_zero undid the timed launches
    (result,) = kernel.results.values()
    assert not result.reused and result.state.done
    assert 0 < result.state.evaluations() <= len(CONFIGS)
    assert kernel.best_config in CONFIGS
    assert to_fasta_config(kernel.best_config) == result.best_config
    assert len(StateStore(state_dir).state_files()) == 1


def test_the_key_holds_key_values_dtypes_device_and_triton_version(tuned_dir):
    _, kernel, _, _ = tuned_dir
    (key,) = kernel.results
    assert key[0] == 2048 and "torch.float32" in key and key[-2] == triton.__version__


def test_a_new_process_view_reuses_the_done_tune_and_times_nothing(tuned_dir, monkeypatch):
    state_dir, first, _, _ = tuned_dir

    def no_benchmark(self, *args, **kwargs):
        raise AssertionError("a DONE tune was benchmarked again")

    monkeypatch.setattr(TritonBackend, "benchmark", no_benchmark)
    monkeypatch.setattr(TritonBackend, "compile", no_benchmark)
    monkeypatch.setattr(TritonBackend, "compile_first", no_benchmark)
    kernel = make_tuned(str(state_dir))
    x, out = launch(kernel)
    torch.testing.assert_close(out, 2.0 * x)
    (result,) = kernel.results.values()
    assert result.reused and kernel.best_config == first.best_config


def test_a_reused_tune_zeroes_reset_to_zero_arguments_before_its_first_launch_as_a_tune_would(tuned_dir):
    """Triton tunes each key again in every process and zeroes `reset_to_zero` after it: an output left
    uninitialised (torch.empty) is right there, and must be here when the tune is reused instead."""
    state_dir, _, _, _ = tuned_dir
    kernel = make_tuned(str(state_dir))
    x = torch.randn(2048, device=DEVICE)
    out = torch.full((2048,), 7.0, device=DEVICE)
    kernel[grid](x, out, 2048, 2.0)
    assert next(iter(kernel.results.values())).reused
    torch.testing.assert_close(out, 2.0 * x)


def test_decorating_a_kernel_converts_each_config_once(tmp_path, monkeypatch):
    """Checking for repeats and keeping the conversions for launches share one conversion per config."""
    from fasta_sm.config import Config

    built = []
    check = Config.__post_init__

    def counted(self):
        built.append(self)
        check(self)

    monkeypatch.setattr(Config, "__post_init__", counted)
    make_tuned(str(tmp_path))
    assert len(built) == len(CONFIGS)


def test_a_launch_that_reuses_a_done_tune_converts_none_of_the_decorated_configs_again(tuned_dir, monkeypatch):
    """The decorator converted its configs once; a warm first launch (the ≤ 5 ms target) must not redo it."""
    import fasta_sm.triton.autotune as decorator

    state_dir, _, _, _ = tuned_dir
    kernel = make_tuned(str(state_dir))
    converted = []

    def counted(config):
        converted.append(config)
        return to_fasta_config(config)

    monkeypatch.setattr(decorator, "to_fasta_config", counted)
    launch(kernel)
    (result,) = kernel.results.values()
    assert result.reused and converted == []


def test_a_launch_that_reuses_a_done_tune_reads_no_launch_options_but_the_winners(tuned_dir, monkeypatch):
    """What the configs set (checked against the launch's arguments) is listed at decoration, not per launch."""
    state_dir, _, _, _ = tuned_dir
    kernel = make_tuned(str(state_dir))
    read = []
    all_kwargs = triton.Config.all_kwargs

    def counted(self):
        read.append(self)
        return all_kwargs(self)

    monkeypatch.setattr(triton.Config, "all_kwargs", counted)
    launch(kernel)
    (result,) = kernel.results.values()
    assert result.reused and {id(config) for config in read} == {id(kernel.best_config)}


def test_a_pre_hook_given_to_a_config_after_decoration_runs_at_its_timed_launches_too(tmp_path):
    """As in triton.autotune, which reads each config's hook when it times it: not only the winner's launch."""
    configs = [triton.Config({"BLOCK": block}, num_warps=1) for block in (16, 32)]
    kernel = fasta_sm.autotune(configs, key=["n"], reset_to_zero=["out_ptr"], policy="exhaustive",
                               state_dir=str(tmp_path))(accumulate_kernel)
    calls = []
    for config in configs:
        config.pre_hook = lambda nargs, block=config.kwargs["BLOCK"]: calls.append(block)
    launch(kernel)
    assert set(calls) == {16, 32}


def test_a_config_list_assigned_after_decoration_is_the_one_tuned(tmp_path):
    kernel = make_tuned(str(tmp_path), policy="exhaustive")
    kernel.configs = CONFIGS[:4]
    x, out = launch(kernel)
    torch.testing.assert_close(out, 2.0 * x)
    (result,) = kernel.results.values()
    assert result.state.configs == [to_fasta_config(config) for config in CONFIGS[:4]]


def test_a_config_made_after_the_decorated_ones_are_freed_is_tuned_as_itself(tmp_path):
    """Conversions were kept by the decorated configs' ids: once a list assigned to `configs` had freed them, a
    new config given one of their ids was tuned as the freed one (its BLOCK and warps) and launched as itself.
    Whether a new config lands on a freed address is the allocator's choice (here, not at all in some runs):
    what cannot vary is that the kernel keeps the decorated configs alive, so that none of their ids is free."""
    configs = [triton.Config({"BLOCK": block}, num_warps=1) for block in (16, 32)]
    kernel = fasta_sm.autotune(configs, key=["n"], reset_to_zero=["out_ptr"], policy="exhaustive",
                               state_dir=str(tmp_path))(accumulate_kernel)
    del configs
    decorated = {id(config) for config in kernel.configs}
    alive = [weakref.ref(config) for config in kernel.configs]
    kernel.configs = [triton.Config({"BLOCK": block}, num_warps=1) for block in (64, 128)]
    launch(kernel, 300)  # the launch lists the assigned configs: nothing else holds the decorated ones
    gc.collect()
    assert all(ref() is not None for ref in alive)
    made = []
    while len(made) < 20_000 and (not made or id(made[-1]) not in decorated):
        made.append(triton.Config({"BLOCK": 256}, num_warps=2))  # kept: each takes a new address
    kernel.configs = [made[-1], triton.Config({"BLOCK": 512}, num_warps=1)]
    launch(kernel, 500)
    (result,) = (result for key, result in kernel.results.items() if 500 in key)
    assert result.state.configs == [to_fasta_config(config) for config in kernel.configs]


def test_a_relative_state_dir_is_where_it_named_at_decoration_after_a_change_of_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kernel = make_tuned("states", policy="exhaustive")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    launch(kernel)
    assert len(StateStore(tmp_path / "states").state_files()) == 1 and not (tmp_path / "elsewhere" / "states").exists()


def test_each_key_value_is_its_own_tune(tmp_path):
    kernel = make_tuned(str(tmp_path), policy="random", budget=0.1)
    for n in (100, 300):
        x, out = launch(kernel, n)
        torch.testing.assert_close(out, 2.0 * x)
    assert len(kernel.results) == 2
    assert len(StateStore(tmp_path).state_files()) == 2


def test_a_new_key_values_tune_starts_from_what_the_kernels_finished_tune_found_fast(tmp_path):
    kernel = make_tuned(str(tmp_path))
    for n in (1000, 3000):
        x, out = launch(kernel, n)
        torch.testing.assert_close(out, 2.0 * x)
    first, second = (result.state for result in kernel.results.values())
    fastest = sorted(first.durations, key=lambda i: (first.mean_us(i), i))[:3]
    assert set(fastest) <= set(second.rounds[0].batch)
    assert "that earlier tunes of the kernel found fast" in second.rounds[0].reason


def test_prune_configs_by_narrows_the_tuned_list(tmp_path):
    def early(configs, nargs, **kwargs):
        return [c for c in configs if c.kwargs["BLOCK"] >= 256]

    kernel = make_tuned(str(tmp_path), policy="exhaustive", prune_configs_by={"early_config_prune": early})
    launch(kernel, 1000)
    (result,) = kernel.results.values()
    assert result.state.n_configs == 12
    assert all(c.kwargs["BLOCK"] >= 256 for c in result.state.configs)


def test_a_prune_that_makes_twins_tunes_each_config_once_as_triton_does(tmp_path):
    def clamp(configs, nargs, **kwargs):  # a tile clamped to the problem: several configs become one
        return [triton.Config({"BLOCK": min(c.kwargs["BLOCK"], 256)}, num_warps=c.num_warps,
                              num_stages=c.num_stages) for c in configs]

    kernel = make_tuned(str(tmp_path), policy="exhaustive", prune_configs_by={"early_config_prune": clamp})
    x, out = launch(kernel, 1000)
    torch.testing.assert_close(out, 2.0 * x)
    (result,) = kernel.results.values()
    assert len({c.identity for c in result.state.configs}) == result.state.n_configs


def test_twins_a_prune_makes_with_pre_hooks_of_their_own_are_tuned_as_the_first(tmp_path):
    def clamp(configs, nargs, **kwargs):  # each twin with a hook of its own, as a list built in a loop has
        return [triton.Config({"BLOCK": min(c.kwargs["BLOCK"], 256)}, num_warps=c.num_warps,
                              num_stages=c.num_stages, pre_hook=lambda nargs: None) for c in configs]

    kernel = make_tuned(str(tmp_path), policy="exhaustive", prune_configs_by={"early_config_prune": clamp})
    x, out = launch(kernel, 1000)
    torch.testing.assert_close(out, 2.0 * x)


def test_prune_callbacks_get_the_arguments_triton_gives_them(tmp_path):
    seen = {}

    def early(configs, nargs, **kwargs):
        seen["early"] = (sorted(nargs), sorted(kwargs))
        return configs

    def perf_model(**kwargs):
        seen.setdefault("perf_model", sorted(kwargs))
        return kwargs["BLOCK"]

    kernel = small_tuned(tmp_path, prune_configs_by={"early_config_prune": early, "perf_model": perf_model,
                                                     "top_k": 2})
    x, out = torch.randn(512, device=DEVICE), torch.zeros(512, device=DEVICE)
    kernel[grid](x, out, 512, scale=2.0)
    assert seen["early"] == (["n", "out_ptr", "x_ptr"], ["grid", "scale", "warmup"])
    assert {"x_ptr", "scale", "grid", "warmup", "BLOCK", "num_warps"} <= set(seen["perf_model"])


def test_a_fractional_top_k_is_a_share_of_what_early_pruning_left_as_in_triton_3_9(tmp_path):
    """Triton 3.6 to 3.8 took the share of the whole list; 3.9 takes it of what early pruning left, at least one."""
    prune = {"early_config_prune": lambda configs, nargs, **kwargs: configs[: len(configs) // 2],
             "perf_model": lambda **kwargs: kwargs["BLOCK"], "top_k": 0.25}
    ours = fasta_sm.autotune(CONFIGS, key=["n"], prune_configs_by=prune, state_dir=str(tmp_path))(accumulate_kernel)
    ours.nargs = {"x_ptr": None, "out_ptr": None, "n": 512, "scale": 2.0}
    assert len(ours.prune_configs({})) == int(len(CONFIGS) // 2 * 0.25)
    tiny = {**prune, "top_k": 0.01}
    ours = fasta_sm.autotune(CONFIGS, key=["n"], prune_configs_by=tiny, state_dir=str(tmp_path))(accumulate_kernel)
    ours.nargs = {"x_ptr": None, "out_ptr": None, "n": 512, "scale": 2.0}
    assert len(ours.prune_configs({})) == 1


def test_prune_configs_takes_the_launch_kwargs_and_reads_the_positional_arguments_from_nargs_as_triton_does(
    tmp_path
):
    """Code written for Triton's Autotuner (jax-triton, precompile helpers) sets `nargs`, then calls this."""
    seen = {}

    def early(configs, named_args, **kwargs):
        seen.update(named=named_args, kwargs=kwargs)
        return configs[:3]

    ours = fasta_sm.autotune(CONFIGS, key=["n"], prune_configs_by={"early_config_prune": early},
                             state_dir=str(tmp_path))(accumulate_kernel)
    ours.nargs = {"x_ptr": None, "out_ptr": None, "n": 512}
    assert ours.prune_configs({"scale": 2.0}) == CONFIGS[:3]
    assert seen == {"named": {"x_ptr": None, "out_ptr": None, "n": 512}, "kwargs": {"scale": 2.0}}


def test_a_top_k_of_true_keeps_one_config_as_in_triton(tmp_path):
    prune = {"perf_model": lambda **kwargs: -kwargs["BLOCK"], "top_k": True}
    ours = fasta_sm.autotune(CONFIGS, key=["n"], prune_configs_by=prune, state_dir=str(tmp_path))(accumulate_kernel)
    ours.nargs = {"x_ptr": None, "out_ptr": None, "n": 512, "scale": 2.0}
    (kept,) = ours.prune_configs({})
    assert kept.kwargs["BLOCK"] == 512


@pytest.mark.skipif("ir_override" not in inspect.signature(triton.Config).parameters,
                    reason="this Triton's Config has no ir_override")
def test_an_ir_override_is_part_of_a_config_and_of_each_timed_launch():
    plain = triton.Config({"BLOCK": 64}, num_warps=1, num_stages=1)
    overridden = triton.Config({"BLOCK": 64}, num_warps=1, num_stages=1, ir_override="k.ttgir")
    ours = to_fasta_config(overridden)
    assert ours != to_fasta_config(plain)
    assert to_triton_config(ours).all_kwargs() == overridden.all_kwargs()
    backend = TritonBackend(accumulate_kernel, (torch.zeros(8), torch.zeros(8), 8, 2.0), grid)
    assert backend._launch_kwargs(ours)["ir_override"] == "k.ttgir"


def test_a_top_k_that_is_neither_a_share_nor_a_count_is_a_type_error_naming_it_as_in_triton(tmp_path):
    prune = {"perf_model": lambda **kwargs: kwargs["BLOCK"], "top_k": 2.0}
    ours = fasta_sm.autotune(CONFIGS, key=["n"], prune_configs_by=prune, state_dir=str(tmp_path))(accumulate_kernel)
    with pytest.raises(TypeError, match=r"accumulate_kernel: top_k=2\.0 must be a float ≤ 1\.0 or an int"):
        ours.nargs = {"x_ptr": None, "out_ptr": None, "n": 512, "scale": 2.0}
        ours.prune_configs({})


def test_a_prune_that_edits_configs_in_place_is_timed_and_launched_as_edited(tmp_path):
    configs = [triton.Config({"BLOCK": b}, num_warps=w, num_stages=1) for b in (64, 128) for w in (1, 4)]

    def at_most_2_warps(configs, nargs, **kwargs):
        for config in configs:
            config.num_warps = min(config.num_warps, 2)
        return configs

    kernel = fasta_sm.autotune(configs, key=["n"], reset_to_zero=["out_ptr"], policy="exhaustive",
                               prune_configs_by={"early_config_prune": at_most_2_warps},
                               state_dir=str(tmp_path))(accumulate_kernel)
    x, out = launch(kernel, 1000)
    torch.testing.assert_close(out, 2.0 * x)
    (result,) = kernel.results.values()
    assert sorted(c.num_warps for c in result.state.configs) == [1, 1, 2, 2]
    assert result.best_config == to_fasta_config(kernel.best_config)


def test_argument_names_given_as_one_shot_iterators_are_all_kept(tmp_path):
    kernel = fasta_sm.autotune(CONFIGS, key=iter(["n"]), reset_to_zero=(name for name in ["out_ptr"]),
                               restore_value=iter(["x_ptr"]), policy="random", budget=0.1,
                               state_dir=str(tmp_path))(accumulate_kernel)
    assert (kernel.keys, kernel.reset_to_zero, kernel.restore_value) == (["n"], ["out_ptr"], ["x_ptr"])
    x, out = launch(kernel)
    torch.testing.assert_close(out, 2.0 * x)


def test_a_single_config_is_launched_without_a_tune(tmp_path):
    kernel = fasta_sm.autotune(CONFIGS[:1], key=["n"], state_dir=str(tmp_path))(accumulate_kernel)
    x, out = launch(kernel)
    torch.testing.assert_close(out, 2.0 * x)
    assert kernel.results == {} and kernel.best_config == CONFIGS[0]


def test_custom_do_bench_and_hooks_as_in_triton(tmp_path):
    calls = {"bench": 0, "reset_only": 0}

    def do_bench(kernel_call, quantiles):
        calls["bench"] += 1
        kernel_call()
        return [1.0, 1.0, 1.0]

    def pre_hook(nargs, reset_only=False):
        nargs["out_ptr"].zero_()
        calls["reset_only"] += reset_only

    kernel = fasta_sm.autotune(CONFIGS, key=["n"], policy="random", budget=0.1, do_bench=do_bench,
                               pre_hook=pre_hook, state_dir=str(tmp_path))(accumulate_kernel)
    x, out = launch(kernel)
    torch.testing.assert_close(out, 2.0 * x)
    assert calls["bench"] == 4 and calls["reset_only"] == 1


def test_unknown_reset_argument_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="reset_to_zero names nope, not arguments of the kernel"):
        fasta_sm.autotune(CONFIGS, key=["n"], reset_to_zero=["nope"], state_dir=str(tmp_path))(accumulate_kernel)


def prewarm_child(*flags: str, **env: str) -> str:
    """Run prewarm_child.py outside the interpreter (Triton can decorate without a GPU) and return its verdict."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FASTA_PREWARM")}
    environ["PYTHONPATH"] = os.pathsep.join([str(HERE), *sys.path])
    done = subprocess.run([sys.executable, str(HERE / "prewarm_child.py"), *flags], capture_output=True, text=True,
                          timeout=300, env={**environ, **env}, cwd=HERE)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_decorating_a_kernel_starts_the_compile_workers_fork_server():
    assert prewarm_child() == "started"


def test_fasta_prewarm_0_leaves_the_fork_server_to_the_first_tune():
    assert prewarm_child(FASTA_PREWARM="0") == "not started"


def test_no_fork_server_is_started_ahead_under_the_interpreter():
    assert prewarm_child(TRITON_INTERPRET="1") == "not started"


def test_a_child_process_that_imports_the_kernel_starts_no_fork_server():
    assert prewarm_child("--nested") == "not started"


def test_a_kernel_the_workers_cannot_compile_starts_no_fork_server():
    assert prewarm_child("--wrapped") == "not started"


def test_a_kernel_defined_in_the_main_script_starts_no_fork_server():
    """The workers do not run the main script, so they cannot import its kernels: those compile in process."""
    assert prewarm_child("--in-main") == "not started"


def test_a_kernel_whose_module_uses_torch_on_import_has_the_fork_server_import_torch():
    """Once, in the server, rather than once per compile worker."""
    assert prewarm_child("--torch-table").splitlines() == ["started", "torch fasta_sm.triton.worker_preload"]


def run_child(state_dir: Path, log: Path, kill_after: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(HERE / "tune_child.py"), str(state_dir), str(log), str(kill_after)],
        capture_output=True, text=True, timeout=600,
    )


def test_killed_mid_r2_then_rerun_resumes_without_remeasuring(tmp_path):
    state_dir = tmp_path / "states"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    r1 = len(make_policy("fasta", [to_fasta_config(c) for c in CONFIGS]).plan(np.random.default_rng(0)).batch)
    killed = run_child(state_dir, first_log, kill_after=r1 + 2)  # all of R1 timed: dies in R2
    assert killed.returncode == 9, killed.stderr[-2000:]
    store = StateStore(state_dir)
    (state_file,) = store.state_files()
    before = store.read(state_file)
    assert not before.done and before.phase == "R2"
    assert len(before.durations) >= r1

    resumed = run_child(state_dir, second_log, kill_after=0)
    assert resumed.returncode == 0 and "OK False" in resumed.stdout, resumed.stderr[-2000:]
    after = store.read(state_file)
    assert after.done
    timed_after_kill = second_log.read_text().split()
    retimes_after_kill = [r for r in after.rounds[len(before.rounds):] if r.retime]
    for index, timings in before.durations.items():
        assert after.durations[index][: len(timings)] == timings, "a timing saved before the kill was lost"
        again = timed_after_kill.count(after.configs[index].identity)
        assert again == len(after.durations[index]) - len(timings), "a timing after the kill went unrecorded"
        assert again == sum(index in r.batch for r in retimes_after_kill), "measured again outside a re-time round"

    reused = run_child(state_dir, tmp_path / "third.log", kill_after=0)
    assert "OK True" in reused.stdout, reused.stderr[-2000:]
    assert not (tmp_path / "third.log").exists()


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
def test_gpu_matmul_tunes_in_the_pool_and_computes_the_product(tmp_path):
    from fasta_sm.triton import zoo

    spec = zoo.spec_mm_fp16(M=512, N=512, K=512)
    configs = [c for c in spec.configs if c.num_stages == 3][:12]
    kernel = fasta_sm.autotune([to_triton_config(c) for c in configs], key=["M", "N", "K"], budget=0.5,
                               state_dir=str(tmp_path))(spec.fn)
    args = spec.make_args("cuda")
    kernel[spec.grid](*args, **spec.kwargs)
    torch.testing.assert_close(args[2].float(), spec.reference(args), atol=1e-1, rtol=2e-2)
    (result,) = kernel.results.values()
    assert result.state.done and "do_bench" in result.state.backend


def test_fasta_tunes_start_from_live_retiming_and_the_user_overrides_it(tmp_path):
    from fasta_sm.policies.fasta.params import LIVE_DEFAULTS

    assert make_tuned(str(tmp_path)).policy_params == LIVE_DEFAULTS
    overridden = make_tuned(str(tmp_path), policy_params={"retime_cost": 0.1}, budget=0.3).policy_params
    assert overridden == {**LIVE_DEFAULTS, "retime_cost": 0.1, "budget": 0.3}
    assert make_tuned(str(tmp_path), policy="random").policy_params == {}


SMALL = [triton.Config({"BLOCK": b}, num_warps=1, num_stages=1) for b in (64, 128, 256)]


def once(fn, quantiles=None):
    """A do_bench that launches once: hook calls can be counted exactly."""
    fn()
    return [1.0, 1.0, 1.0]


def small_tuned(tmp_path, **options):
    options = {"key": ["n"], "reset_to_zero": ["out_ptr"], "policy": "exhaustive", "do_bench": once,
               "state_dir": str(tmp_path), **options}
    return fasta_sm.autotune(options.pop("configs", SMALL), **options)(accumulate_kernel)


def test_a_do_bench_that_times_every_config_as_infinite_fails_the_tune_saying_so(tmp_path):
    def infinite(fn, quantiles=None):
        fn()
        return [float("inf")] * 3

    with pytest.raises(TuneFailed, match="no config ran: 3 of 3 failed.*first error: do_bench returned inf"):
        launch(small_tuned(tmp_path, do_bench=infinite))


def test_a_do_bench_that_returns_its_quantiles_as_an_array_is_read_for_the_median(tmp_path):
    def as_array(fn, quantiles=None):
        fn()
        return np.array([1.0, 0.9, 1.1])

    kernel = small_tuned(tmp_path, do_bench=as_array)
    launch(kernel)
    assert all(result.state.done for result in kernel.results.values())


def test_a_do_bench_that_returns_no_number_is_named_with_what_it_returned(tmp_path):
    def words(fn, quantiles=None):
        fn()
        return "fast"

    with pytest.raises(BackendError, match=r"do_bench returned 'fast', not a time in ms \(a number, or a list"):
        launch(small_tuned(tmp_path, do_bench=words))


def test_a_configs_own_pre_hook_runs_before_each_of_its_timings_and_its_launch(tmp_path):
    calls = []
    configs = [triton.Config({"BLOCK": b}, num_warps=1, num_stages=1,
                             pre_hook=lambda nargs, b=b: calls.append((b, nargs["BLOCK"]))) for b in (64, 128, 256)]
    kernel = small_tuned(tmp_path, configs=configs)
    launch(kernel)
    winner = kernel.best_config.kwargs["BLOCK"]
    assert sorted(calls) == sorted([(64, 64), (128, 128), (256, 256), (winner, winner)])


def test_hooks_see_the_config_its_launch_options_and_the_grid_as_in_triton(tmp_path):
    seen = []
    kernel = small_tuned(tmp_path, pre_hook=lambda nargs, reset_only=False: seen.append((reset_only, dict(nargs))))
    launch(kernel)
    timed = [nargs for reset_only, nargs in seen if not reset_only]
    assert timed and all({"BLOCK", "num_warps", "num_stages", "grid", "out_ptr", "n"} <= set(n) for n in timed)
    (final,) = [nargs for reset_only, nargs in seen if reset_only]
    assert final["BLOCK"] == kernel.best_config.kwargs["BLOCK"] and "num_warps" in final


def test_an_error_in_a_hook_stops_the_tune_instead_of_failing_every_config(tmp_path):
    def broken(nargs, reset_only=False):
        raise KeyError("no such argument")

    with pytest.raises(KeyError, match="no such argument") as raised:
        launch(small_tuned(tmp_path, pre_hook=broken))
    assert re.fullmatch(r"fasta-sm: while timing config BLOCK=\d+ w1 s1", notes_of(raised.value)[0])


def test_warmup_compiles_every_config_and_neither_launches_nor_tunes(tmp_path):
    kernel = small_tuned(tmp_path)
    x, out = torch.randn(512, device=DEVICE), torch.zeros(512, device=DEVICE)
    compiled = kernel.warmup(x, out, 512, 2.0, grid=grid)
    assert isinstance(compiled, list) and len(compiled) == len(SMALL)
    assert float(out.abs().sum()) == 0.0 and not StateStore(tmp_path).state_files()


def test_a_key_name_that_is_no_argument_of_the_kernel_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="key names N_typo, not arguments of the kernel"):
        fasta_sm.autotune(SMALL, key=["N_typo"], state_dir=str(tmp_path))(accumulate_kernel)


def test_a_key_name_the_configs_set_is_warned_of_at_decoration(tmp_path):
    with pytest.warns(UserWarning, match=r"accumulate_kernel\): key names BLOCK, which the configs set, not the "
                                         r"caller: it stays out of the tuning key") as warned:
        fasta_sm.autotune(SMALL, key=["n", "BLOCK"], state_dir=str(tmp_path))(accumulate_kernel)
    assert warned[0].filename == __file__


def test_a_key_name_a_heuristic_sets_is_warned_of_at_decoration(tmp_path):
    scaled = triton.heuristics({"scale": lambda args: 2.0})(accumulate_kernel)
    with pytest.warns(UserWarning, match="key names scale, which the configs or heuristics set"):
        fasta_sm.autotune(SMALL, key=["scale"], state_dir=str(tmp_path))(scaled)


@pytest.mark.parametrize("what", ["key", "reset_to_zero", "restore_value"])
def test_argument_names_that_are_no_list_are_a_type_error_naming_the_kernel_and_the_value(what, tmp_path):
    options = {"key": ["n"], what: 5}
    with pytest.raises(TypeError, match=rf"accumulate_kernel\): {what} must be a list of argument names, not 5"):
        fasta_sm.autotune(SMALL, state_dir=str(tmp_path), **options)(accumulate_kernel)


def test_a_key_of_none_is_a_type_error_naming_the_kernel(tmp_path):
    with pytest.raises(TypeError, match=r"accumulate_kernel\): key must be a list of argument names, not None"):
        fasta_sm.autotune(SMALL, key=None, state_dir=str(tmp_path))(accumulate_kernel)


def test_a_key_name_that_is_no_string_is_named_as_no_argument_of_the_kernel(tmp_path):
    with pytest.raises(ValueError, match="key names 1, not arguments of the kernel"):
        fasta_sm.autotune(SMALL, key=[1], state_dir=str(tmp_path))(accumulate_kernel)


def test_one_config_not_in_a_list_is_a_type_error_naming_the_kernel(tmp_path):
    with pytest.raises(TypeError, match=r"accumulate_kernel\): configs must be a list of triton.Config, not one "
                                        r"config alone \(put it in a list\)"):
        fasta_sm.autotune(SMALL[0], key=["n"], state_dir=str(tmp_path))(accumulate_kernel)


def test_configs_of_none_is_a_type_error_naming_the_kernel(tmp_path):
    with pytest.raises(TypeError, match=r"accumulate_kernel\): configs must be a list of triton.Config, not None"):
        fasta_sm.autotune(None, key=["n"], state_dir=str(tmp_path))(accumulate_kernel)


def test_a_config_that_is_no_triton_config_is_a_type_error_naming_the_kernel_and_its_place(tmp_path):
    with pytest.raises(TypeError, match=r"accumulate_kernel\): configs\[1\] is a dict, not a triton.Config"):
        fasta_sm.autotune([SMALL[0], {"BLOCK": 128}], key=["n"], state_dir=str(tmp_path))(accumulate_kernel)


def test_an_empty_config_list_is_an_error_naming_the_kernel(tmp_path):
    with pytest.raises(ValueError, match=r"accumulate_kernel\): the config list is empty"):
        fasta_sm.autotune([], key=["n"], state_dir=str(tmp_path))(accumulate_kernel)


@pytest.mark.parametrize("settings, named", [
    ({"policy_params": {"retime_rounds": "x"}}, "retime_rounds='x'"),
    ({"seed": -1}, "seed=-1"),
    ({"seed": 2**64}, f"seed={2**64} must be a whole number ≤ {2**64 - 1}"),
    ({"policy": "no_such_policy"}, "no_such_policy"),
    ({"budget": 1.5}, "budget=1.5"),
    ({"policy_params": ["rounds", 2]}, "policy_params=['rounds', 2] must be a mapping"),
    ({"warmup": "x"}, "warmup='x'"),
    ({"policy": "must-measure"}, "unknown policy 'must-measure'"),
    ({"policy": ["fasta"]}, "unknown policy ['fasta']"),
    ({"budget": Fraction(1, 2)}, "budget=Fraction(1, 2): must be a plain, finite Python literal"),
], ids=["a parameter of the wrong kind", "a negative seed", "a seed no state file holds", "an unknown policy",
        "a budget over 1", "params that are no mapping", "a warmup that is no number", "a policy users cannot name",
        "a policy that is no name", "a budget no state file holds"])
def test_bad_tune_settings_are_refused_when_the_kernel_is_decorated(tmp_path, settings, named):
    with pytest.raises(ValueError, match=rf"accumulate_kernel\): .*{re.escape(named)}"):
        fasta_sm.autotune(SMALL, key=["n"], state_dir=str(tmp_path), **settings)(accumulate_kernel)


def expert_configs_past_the_end(index: int, count: int) -> str:
    return re.escape(f"fasta: expert_configs index {index} is past the end of the config list ({count} configs")


@pytest.mark.parametrize("prune", [None, {"perf_model": lambda **kwargs: kwargs["BLOCK"], "top_k": 2}],
                         ids=["no prune", "a perf_model, which keeps some of the configs"])
def test_an_expert_configs_index_past_the_config_list_is_refused_when_the_kernel_is_decorated(tmp_path, prune):
    with pytest.raises(ValueError, match=r"accumulate_kernel\): " + expert_configs_past_the_end(3, 3)):
        fasta_sm.autotune(SMALL, key=["n"], prune_configs_by=prune, state_dir=str(tmp_path),
                          policy_params={"expert_configs": [0, 3]})(accumulate_kernel)


def test_expert_configs_index_the_configs_left_once_repeats_are_dropped(tmp_path):
    with pytest.raises(ValueError, match=expert_configs_past_the_end(3, 3)):
        fasta_sm.autotune([*SMALL, SMALL[0]], key=["n"], state_dir=str(tmp_path),
                          policy_params={"expert_configs": [3]})(accumulate_kernel)


def test_an_expert_configs_index_past_what_the_prune_left_is_refused_when_that_tune_starts(tmp_path):
    """The indices name configs of the list the tune runs on: under `prune_configs_by`, the pruned one."""
    prune = {"perf_model": lambda **kwargs: kwargs["BLOCK"], "top_k": 2}
    kernel = fasta_sm.autotune(SMALL, key=["n"], prune_configs_by=prune, state_dir=str(tmp_path),
                               policy_params={"expert_configs": [2]})(accumulate_kernel)
    with pytest.raises(PolicyError, match=expert_configs_past_the_end(2, 2)):
        launch(kernel)


def test_an_early_config_prune_may_return_more_configs_than_the_decorator_was_given_for_expert_configs_to_name(
    tmp_path
):
    def widen(configs, nargs, **kwargs):
        return [*configs, triton.Config({"BLOCK": 512}, num_warps=1, num_stages=1)]

    kernel = fasta_sm.autotune(SMALL, key=["n"], prune_configs_by={"early_config_prune": widen},
                               reset_to_zero=["out_ptr"], state_dir=str(tmp_path),
                               policy_params={"optimize_configs": True, "expert_configs": [3]})(accumulate_kernel)
    x, out = launch(kernel)
    torch.testing.assert_close(out, 2.0 * x)
    (result,) = kernel.results.values()
    assert result.state.n_configs == 4 and result.state.policy_params["expert_configs"] == [3]


def test_numpy_numbers_in_policy_params_are_kept_as_the_python_numbers_a_state_file_can_hold(tmp_path):
    kernel = fasta_sm.autotune(SMALL, key=["n"], state_dir=str(tmp_path),
                               policy_params={"retime_rounds": np.int64(2)})(accumulate_kernel)
    assert type(kernel.policy_params["retime_rounds"]) is int


def test_numpy_numbers_inside_a_policy_params_list_are_kept_as_python_numbers(tmp_path):
    kernel = fasta_sm.autotune(SMALL, key=["n"], state_dir=str(tmp_path),
                               policy_params={"expert_configs": [np.int64(1), np.int32(2)]})(accumulate_kernel)
    assert kernel.policy_params["expert_configs"] == [1, 2]
    assert all(type(index) is int for index in kernel.policy_params["expert_configs"])


@pytest.mark.parametrize(("configs", "kept"), [(np.array([0, 1]), [0, 1]), (np.array([1]), [1])],
                         ids=["an array", "an array of one"])
def test_a_numpy_array_in_policy_params_is_kept_as_the_list_it_holds_as_tune_keeps_it(configs, kept, tmp_path):
    """`item()` refused an array of two ('can only convert an array of size 1', naming nothing) and made the
    number 1 of an array of one, which expert_configs then refused as no list."""
    kernel = fasta_sm.autotune(SMALL, key=["n"], state_dir=str(tmp_path),
                               policy_params={"expert_configs": configs})(accumulate_kernel)
    assert kernel.policy_params["expert_configs"] == kept


def test_a_numpy_budget_is_kept_as_the_python_number_a_state_file_can_hold(tmp_path):
    kernel = fasta_sm.autotune(SMALL, key=["n"], state_dir=str(tmp_path), budget=np.float32(0.5))(accumulate_kernel)
    assert kernel.policy_params["budget"] == 0.5 and type(kernel.policy_params["budget"]) is float


@pytest.mark.parametrize("state_dir, named", [("", "state dir '' is empty"),
                                               (3, "state dir 3 must be a path"),
                                               (b"/tmp/states", "state dir b'/tmp/states' must be a path")],
                         ids=["empty", "no path", "bytes"])
def test_a_state_dir_that_names_no_directory_is_refused_when_the_kernel_is_decorated(state_dir, named):
    with pytest.raises(ValueError, match=rf"accumulate_kernel\): {re.escape(named)}"):
        fasta_sm.autotune(SMALL, key=["n"], state_dir=state_dir)(accumulate_kernel)


def test_a_state_dir_that_is_a_file_is_refused_when_the_kernel_is_decorated(tmp_path):
    (tmp_path / "states").write_text("")
    with pytest.raises(ValueError, match=r"accumulate_kernel\): state dir .*states exists and is not a directory"):
        fasta_sm.autotune(SMALL, key=["n"], state_dir=str(tmp_path / "states"))(accumulate_kernel)


def test_a_state_dir_made_a_file_after_decorating_is_refused_at_launch_naming_the_kernel(tmp_path):
    kernel = fasta_sm.autotune(SMALL, key=["n"], state_dir=str(tmp_path / "states"))(accumulate_kernel)
    (tmp_path / "states").write_text("")
    with pytest.raises(StateDirError, match=r"accumulate_kernel: state dir .*states exists and is not a directory"):
        launch(kernel)


def test_policy_none_means_the_default_policy(tmp_path):
    kernel = fasta_sm.autotune(SMALL, key=["n"], state_dir=str(tmp_path), policy=None)(accumulate_kernel)
    assert kernel.policy == "fasta"


def test_a_repeated_config_is_kept_once_with_a_warning(tmp_path, caplog):
    repeated = [SMALL[0], SMALL[1], triton.Config({"BLOCK": 64}, num_warps=1, num_stages=1)]
    with caplog.at_level("WARNING", logger="fasta_sm.triton.autotune"):
        kernel = fasta_sm.autotune(repeated, key=["n"], state_dir=str(tmp_path))(accumulate_kernel)
    assert kernel.configs == [SMALL[0], SMALL[1]] and "1 repeated configs dropped" in caplog.text
    assert "kept once: BLOCK=64 w1 s1" in caplog.text


def test_the_repeated_configs_warning_names_five_and_counts_the_rest(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="fasta_sm.triton.autotune"):
        fasta_sm.autotune(SMALL * 4, key=["n"], state_dir=str(tmp_path))(accumulate_kernel)
    assert "9 repeated configs dropped" in caplog.text and caplog.text.count("BLOCK=") == 5
    assert "and 4 more" in caplog.text


def test_the_same_config_object_listed_twice_is_kept_once_too(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="fasta_sm.triton.autotune"):
        kernel = fasta_sm.autotune(SMALL + SMALL, key=["n"], state_dir=str(tmp_path))(accumulate_kernel)
    assert kernel.configs == SMALL and f"{len(SMALL)} repeated configs dropped" in caplog.text


def test_a_config_that_leaves_a_parameter_unset_is_refused_at_the_first_launch_naming_it(tmp_path):
    misspelt = [*SMALL, triton.Config({"BLOK": 512}, num_warps=1, num_stages=1)]
    kernel = fasta_sm.autotune(misspelt, key=["n"], state_dir=str(tmp_path))(accumulate_kernel)
    with pytest.raises(ValueError, match=r"config BLOK=512 w1 s1 leaves BLOCK unset"):
        launch(kernel)
    assert not list(tmp_path.glob("*.fsm"))


def test_a_budget_given_both_as_an_argument_and_in_policy_params_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"accumulate_kernel\): budget=0\.2 and policy_params\['budget'\]=0\.9"):
        fasta_sm.autotune(CONFIGS, key=["n"], budget=0.2, policy_params={"budget": 0.9})(accumulate_kernel)


def test_a_kwarg_every_config_misspells_is_named_beside_the_argument_it_leaves_unset(tmp_path):
    misspelt = [triton.Config({"BLOK": b}, num_warps=1, num_stages=1) for b in (256, 512)]
    kernel = fasta_sm.autotune(misspelt, key=["n"], state_dir=str(tmp_path))(accumulate_kernel)
    with pytest.raises(TypeError, match=r"leaves BLOCK unset, and no config sets it \(the configs set BLOK, which"):
        launch(kernel)


def test_an_argument_the_launch_leaves_out_is_the_launchs_error_not_a_configs(tmp_path):
    kernel = fasta_sm.autotune(SMALL, key=["n"], state_dir=str(tmp_path))(accumulate_kernel)
    x = torch.randn(256, device=DEVICE)
    with pytest.raises(TypeError, match=r"the launch leaves scale unset, and no config sets it"):
        kernel[grid](x, torch.zeros_like(x), 256)
    assert not list(tmp_path.glob("*.fsm"))


def test_a_parameter_set_by_triton_heuristics_needs_no_config_to_set_it(tmp_path):
    scaled = triton.heuristics({"scale": lambda args: 2.0})(accumulate_kernel)
    kernel = fasta_sm.autotune(SMALL, key=["n"], reset_to_zero=["out_ptr"], state_dir=str(tmp_path))(scaled)
    x = torch.randn(1024, device=DEVICE)
    out = torch.zeros(1024, device=DEVICE)
    kernel[grid](x, out, 1024)
    assert torch.allclose(out, 2.0 * x)


@pytest.mark.parametrize("name, value", [("FASTA_PREWARM", "flase"), ("FASTA_WORKER_TORCH", "ture"),
                                         ("FASTA_COMPILE_WORKERS", "x"), ("FASTA_SM_PRIOR", "maybe"),
                                         ("FASTA_SM_LOCK_TIMEOUT", "-1")])
def test_a_misspelt_setting_is_refused_when_decorating_even_under_the_interpreter(name, value, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"accumulate_kernel\): \${name}='{value}'"):
        fasta_sm.autotune(SMALL, key=["n"], state_dir=str(tmp_path))(accumulate_kernel)


def test_configs_that_differ_only_by_a_pre_hook_are_refused_when_decorating(tmp_path):
    hooked = triton.Config({"BLOCK": 64}, num_warps=1, num_stages=1, pre_hook=lambda args: None)
    with pytest.raises(ValueError, match=r"accumulate_kernel\): two configs differ only by a pre_hook"):
        fasta_sm.autotune([SMALL[0], hooked], key=["n"], state_dir=str(tmp_path))(accumulate_kernel)


def test_a_tuned_parameter_also_passed_at_launch_is_a_conflict_error(tmp_path):
    kernel = small_tuned(tmp_path)
    x, out = torch.randn(512, device=DEVICE), torch.zeros(512, device=DEVICE)
    with pytest.raises(ValueError, match="conflicting meta-parameters BLOCK"):
        kernel[grid](x, out, 512, 2.0, BLOCK=64)


def test_a_launch_option_the_configs_set_is_a_conflict_error_before_anything_is_tuned(tmp_path):
    kernel = small_tuned(tmp_path)
    x, out = torch.randn(512, device=DEVICE), torch.zeros(512, device=DEVICE)
    with pytest.raises(ValueError, match="conflicting meta-parameters num_warps"):
        kernel[grid](x, out, 512, 2.0, num_warps=8)
    assert not list(tmp_path.glob("*.fsm"))


def test_a_tuned_parameter_passed_by_position_is_a_conflict_error_before_anything_is_tuned(tmp_path):
    kernel = small_tuned(tmp_path)
    x, out = torch.randn(512, device=DEVICE), torch.zeros(512, device=DEVICE)
    with pytest.raises(ValueError, match="conflicting meta-parameters BLOCK"):
        kernel[grid](x, out, 512, 2.0, 64)
    assert not list(tmp_path.glob("*.fsm"))


KERNEL_SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def user_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=mask) + {factor} * scale * tl.load(x_ptr + offs, mask=mask),
             mask=mask)
'''


def test_an_edited_kernel_is_tuned_afresh_not_served_the_old_winner(tmp_path, monkeypatch):
    import importlib

    monkeypatch.syspath_prepend(str(tmp_path))
    results = []
    for factor in (1, 3):
        (tmp_path / "user_kernels_edit.py").write_text(KERNEL_SOURCE.format(factor=factor))
        sys.modules.pop("user_kernels_edit", None)
        module = importlib.import_module("user_kernels_edit")
        kernel = fasta_sm.autotune(SMALL, key=["n"], reset_to_zero=["out_ptr"], policy="exhaustive",
                                   do_bench=once, state_dir=str(tmp_path / "states"))(module.user_kernel)
        x, out = launch(kernel, n=512)
        torch.testing.assert_close(out, factor * 2.0 * x)
        results.append(next(iter(kernel.results.values())))
    sys.modules.pop("user_kernels_edit", None)
    assert not results[1].reused


def test_the_decorator_takes_triton_autotunes_arguments_in_its_order():
    import inspect

    ours = list(inspect.signature(fasta_sm.autotune).parameters)
    theirs = list(inspect.signature(triton.autotune).parameters)
    assert ours[: len(theirs)] == theirs


@pytest.mark.filterwarnings("ignore:warmup, rep, and use_cuda_graph:DeprecationWarning")
def test_use_cuda_graph_times_each_config_with_do_bench_cudagraph_over_rep(tmp_path, monkeypatch):
    import triton.testing

    reps = []

    def graph_bench(fn, rep=None, quantiles=None, **_):
        fn()
        reps.append(rep)
        return [1.0, 1.0, 1.0]

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", graph_bench)
    kernel = small_tuned(tmp_path, do_bench=None, use_cuda_graph=True, rep=7)
    launch(kernel)
    assert len(reps) == len(SMALL) and set(reps) == {7.0}


@pytest.mark.filterwarnings("ignore:warmup, rep, and use_cuda_graph:DeprecationWarning")
def test_rep_and_warmup_reach_the_timing_of_each_config(tmp_path, monkeypatch):
    from fasta_sm.triton import backend

    seen = []
    monkeypatch.setattr(backend.TritonBackend, "time_ms",
                        lambda self, config: seen.append((self.warmup_ms, self.rep_ms)) or 1e-3)
    launch(small_tuned(tmp_path, do_bench=None, warmup=3, rep=9))
    assert seen and set(seen) == {(3.0, 9.0)}


@pytest.mark.filterwarnings("ignore:warmup, rep, and use_cuda_graph:DeprecationWarning")
def test_the_deprecated_timing_knobs_replace_a_do_bench_given_beside_them_as_in_triton(tmp_path):
    calls = []

    def counted(fn, quantiles=None):
        calls.append(fn)
        return once(fn, quantiles)

    launch(small_tuned(tmp_path, do_bench=counted, warmup=1, rep=2))
    assert calls == []


def test_the_deprecated_timing_knobs_warn_where_the_kernel_is_decorated_as_in_triton(tmp_path):
    with pytest.warns(DeprecationWarning, match="warmup, rep, and use_cuda_graph parameters are deprecated") as seen:
        small_tuned(tmp_path, do_bench=None, rep=9)
    assert {Path(w.filename).name for w in seen} == {"test_autotune.py"}


@pytest.mark.parametrize("cache_results", [True, False])
def test_cache_results_is_accepted_and_the_tune_is_kept_either_way(tmp_path, cache_results):
    """It passed only False, the default, so the value a Triton user sets to keep results was never tried."""
    kernel = small_tuned(tmp_path, cache_results=cache_results)
    x, out = launch(kernel)
    torch.testing.assert_close(out, 2.0 * x)
    (result,) = kernel.results.values()
    assert not result.reused and len(StateStore(tmp_path).state_files()) == 1


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:warmup, rep, and use_cuda_graph:DeprecationWarning")
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
def test_gpu_use_cuda_graph_tunes_with_cuda_graph_timings_and_the_right_output(tmp_path):
    kernel = small_tuned(tmp_path, do_bench=None, use_cuda_graph=True, rep=20)
    x, out = launch(kernel)
    torch.testing.assert_close(out, 2.0 * x)  # reset_to_zero undid every replay of the graph
    (result,) = kernel.results.values()
    timings = [t for samples in result.state.durations.values() for t in samples]
    assert result.state.done and len(timings) >= len(SMALL) and all(t > 0 for t in timings)


@triton.jit
def increment_failing_late_kernel(x_ptr, n, BLOCK: tl.constexpr):
    """x += 1, in place; at BLOCK 16 the third program fails after the first two have written."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)
    if pid == 2:
        tl.static_assert(BLOCK != 16)


def test_a_launch_that_fails_part_way_has_its_restore_value_arguments_put_back(tmp_path):
    """Under the interpreter BLOCK 16's third program fails after two have written; on a GPU the assertion
    fails its compile instead, and this checks only that the winner's launch starts from the input."""
    configs = [triton.Config({"BLOCK": block}, num_warps=1) for block in (16, 32, 64)]
    kernel = fasta_sm.autotune(configs, key=["n"], restore_value=["x_ptr"], policy="exhaustive",
                               state_dir=str(tmp_path))(increment_failing_late_kernel)
    x = torch.zeros(64, device=DEVICE)
    kernel[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](x, 64)
    assert x.unique().tolist() == [1.0]  # the winner's one launch, on the input as it was


def test_an_error_in_the_post_hook_after_a_failed_launch_stops_the_tune_as_in_triton(tmp_path):
    """Triton's timed call runs `try: post_hook(..., exception=e) finally: raise`: the hook's own error is
    what propagates, and it is no config failure. On a GPU BLOCK 16 fails its compile ahead, and is left to its
    timed launch, which compiles it after the hooks as Triton's does."""

    def post_hook(nargs, exception):
        if exception is not None:
            raise KeyError("a bug in the post_hook")

    configs = [triton.Config({"BLOCK": block}, num_warps=1) for block in (16, 32, 64)]
    kernel = fasta_sm.autotune(configs, key=["n"], policy="exhaustive", do_bench=once, state_dir=str(tmp_path),
                               post_hook=post_hook)(increment_failing_late_kernel)
    with pytest.raises(KeyError, match="a bug in the post_hook"):
        kernel[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](torch.zeros(64, device=DEVICE), 64)


@triton.jit
def double_helper(x):
    return x * 2


@triton.jit
def triple_helper(x):
    return x * 3


@triton.jit
def kernel_with_helper(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, double_helper(tl.load(x_ptr + offs, mask=mask)), mask=mask)


def test_a_jit_helper_edited_makes_a_new_tuning_key(monkeypatch):
    before = _source_hash(kernel_with_helper)
    monkeypatch.setitem(globals(), "double_helper", triple_helper)  # as if its body had been edited
    assert _source_hash(kernel_with_helper) != before


def test_a_kernel_without_helpers_keeps_the_key_of_its_own_source():
    """State files written before helpers counted are still found."""
    source = getattr(accumulate_kernel, "src", None) or inspect.getsource(accumulate_kernel.fn)
    assert _source_hash(accumulate_kernel) == hashlib.sha256(source.encode()).hexdigest()[:12]


HELPERS = types.SimpleNamespace(triple=triple_helper)


@triton.jit
def kernel_with_two_helpers(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, double_helper(x) + HELPERS.triple(x), mask=offs < n)


def test_a_kernel_with_helpers_keys_its_source_then_each_helper_in_the_order_it_names_them():
    """The key's text is fixed, so a release that reads the source faster still finds the state files
    an earlier one wrote; a helper reached through an attribute (`HELPERS.triple`) counts as one named."""

    def source(jit):
        return getattr(jit, "src", None) or inspect.getsource(jit.fn)

    texts = [source(kernel_with_two_helpers), source(double_helper), source(triple_helper)]
    assert _source_hash(kernel_with_two_helpers) == hashlib.sha256("\0".join(texts).encode()).hexdigest()[:12]


def make_scaled_kernel(scale):
    """A kernel factory: each kernel it makes has the same name and text, and a scale of its own."""
    scale = tl.constexpr(scale)  # what a compiled kernel may capture

    @triton.jit
    def scaled_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale, mask=mask)

    return scaled_kernel


def test_kernels_a_factory_makes_with_different_captured_values_have_different_keys():
    assert _source_hash(make_scaled_kernel(2.0)) != _source_hash(make_scaled_kernel(3.0))
    assert _source_hash(make_scaled_kernel(2.0)) == _source_hash(make_scaled_kernel(2.0))


def make_typed_kernel(dtype):
    """A factory capturing a dtype, as a kernel specialised per precision does."""
    acc = tl.constexpr(dtype)

    @triton.jit
    def typed_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask).to(acc), mask=mask)

    return typed_kernel


def test_kernels_a_factory_makes_with_different_captured_dtypes_have_different_keys():
    assert _source_hash(make_typed_kernel(tl.float32)) != _source_hash(make_typed_kernel(tl.float16))


EXEC_KERNEL = """
@triton.jit
def exec_kernel(x_ptr, n, BLOCK: tl.constexpr, SCALE: tl.constexpr = DEFAULT):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * SCALE * FACTOR, mask=offs < n)
"""


def exec_kernel(factor="2", default="1"):
    """A kernel made by `exec`, which has no source file to read: its body's factor and its default given."""
    namespace = {"triton": triton, "tl": tl}
    exec(EXEC_KERNEL.replace("FACTOR", factor).replace("DEFAULT", default), namespace)
    return namespace["exec_kernel"]


@pytest.mark.skipif(HAS_CUDA, reason="only the interpreter takes a kernel whose source cannot be read")
def test_a_kernel_made_by_exec_is_keyed_by_its_code_so_an_edit_makes_a_new_key():
    assert _source_hash(exec_kernel(factor="2")) != _source_hash(exec_kernel(factor="3"))
    assert _source_hash(exec_kernel(factor="2")) == _source_hash(exec_kernel(factor="2"))


@pytest.mark.skipif(HAS_CUDA, reason="only the interpreter takes a kernel whose source cannot be read")
def test_a_kernel_made_by_exec_whose_default_is_edited_gets_a_new_key():
    assert _source_hash(exec_kernel(default="2")) != _source_hash(exec_kernel(default="3"))


GLOBAL_CONSTEXPR_MODULE = '''
import triton
import triton.language as tl

SCALE = tl.constexpr(VALUE)


@triton.jit
def scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * SCALE, mask=offs < n)
'''


def test_a_module_constexpr_edited_makes_a_new_tuning_key(tmp_path, monkeypatch):
    import importlib

    monkeypatch.syspath_prepend(str(tmp_path))
    hashes = []
    for value, name in ((2, "constexpr_two"), (3, "constexpr_three")):
        (tmp_path / f"{name}.py").write_text(GLOBAL_CONSTEXPR_MODULE.replace("VALUE", str(value)))
        hashes.append(_source_hash(importlib.import_module(name).scale_kernel))
    assert hashes[0] != hashes[1]


LATER_HELPER_MODULE = '''
import triton
import triton.language as tl

import fasta_sm


@fasta_sm.autotune([triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"], state_dir=STATE_DIR)
@triton.jit
def kern(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, later(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


@triton.jit
def later(x):
    return x * 2
'''


def test_a_helper_defined_after_the_kernel_is_in_its_tuning_key(tmp_path, monkeypatch):
    import importlib

    source = LATER_HELPER_MODULE.replace("STATE_DIR", repr(str(tmp_path / "states")))
    (tmp_path / "later_helper_kernels.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    kern = importlib.import_module("later_helper_kernels").kern
    source = getattr(kern.fn, "src", None) or inspect.getsource(kern.fn.fn)  # as for a kernel without helpers
    assert kern.source_hash != hashlib.sha256(source.encode()).hexdigest()[:12]  # the later helper counts


def test_triton_print_autotuning_prints_the_tune_as_triton_does_and_not_its_reuse(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_PRINT_AUTOTUNING", "1")
    knobs = getattr(getattr(triton, "knobs", None), "autotuning", None)
    if knobs is not None and hasattr(knobs, "print"):
        monkeypatch.setattr(knobs, "print", True)
    launch(make_tuned(str(tmp_path), policy="random", budget=0.1))
    assert "Triton autotuning for function accumulate_kernel" in capsys.readouterr().out
    launch(make_tuned(str(tmp_path), policy="random", budget=0.1))
    assert "Triton autotuning" not in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (the interpreter cannot launch from two threads)")
def test_gpu_threads_launching_one_key_at_once_leave_the_result_of_the_tune_not_of_a_reuse(tmp_path):
    import threading

    kernel = make_tuned(str(tmp_path), policy="random", budget=0.1)
    threads = [threading.Thread(target=launch, args=(kernel,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (result,) = kernel.results.values()
    assert not result.reused


@triton.jit
def head_bound_kernel(x_ptr, out_ptr, n, HEAD_D: tl.constexpr, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK * HEAD_D <= 256)  # as a tile that no longer fits once HEAD_D grows
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def larger_blocks_faster() -> dict:
    """Hooks under which a config's time is 1/BLOCK ms: the largest BLOCK wins, whatever order configs are timed in.

    The live pool times each config as its compile finishes, so an order-based fake would not say which one wins.
    """
    launched = {}

    def pre_hook(nargs, reset_only=False):
        launched["BLOCK"] = nargs.get("BLOCK")

    def do_bench(fn, quantiles=None):
        fn()
        ms = 1.0 / launched["BLOCK"]
        return [ms, ms, ms] if quantiles else ms

    return {"pre_hook": pre_hook, "do_bench": do_bench}


def test_a_reused_winner_that_fails_with_these_arguments_names_its_state_file_and_says_key_lacks_an_argument(
        tmp_path):
    from fasta_sm.triton.fork_server import interpreting
    from fasta_sm.triton.worker import config_failures

    configs = [triton.Config({"BLOCK": b}, num_warps=1, num_stages=1) for b in (16, 32, 64)]

    def decorated():  # each call stands for a new process: its own kernel object over one state dir
        return fasta_sm.autotune(configs, key=["n"], policy="exhaustive", state_dir=str(tmp_path),
                                 **larger_blocks_faster())(head_bound_kernel)

    x = torch.arange(256, dtype=torch.float32, device=DEVICE)
    out = torch.zeros_like(x)
    first = decorated()
    first[lambda meta: (triton.cdiv(256, meta["BLOCK"]),)](x, out, 256, HEAD_D=4)
    assert first.best_config.kwargs == {"BLOCK": 64}
    later = decorated()
    with pytest.raises(config_failures(interpreting())) as raised:
        later[lambda meta: (triton.cdiv(256, meta["BLOCK"]),)](x, out, 256, HEAD_D=8)
    (note,) = [n for n in notes_of(raised.value) if "earlier tune" in n]
    (state_file,) = tmp_path.glob("*.fsm")
    assert "BLOCK=64" in note and str(state_file) in note and "missing from `key`" in note


def test_a_config_with_zero_stages_is_tuned_like_any_other(tmp_path):
    """Triton's AMD backend takes num_stages=0; the configs of such kernels must decorate and tune."""
    configs = [triton.Config({"BLOCK": b}, num_warps=1, num_stages=0) for b in (64, 128)]
    kernel = fasta_sm.autotune(configs, key=["n"], policy="exhaustive", reset_to_zero=["out_ptr"],
                               state_dir=str(tmp_path))(accumulate_kernel)
    x, out = launch(kernel)
    torch.testing.assert_close(out, 2.0 * x)
    assert kernel.best_config.num_stages == 0


def test_a_config_without_a_warp_count_is_an_error_naming_the_kernel():
    configs = [triton.Config({"BLOCK": b}, num_warps=None) for b in (64, 128)]
    with pytest.raises(fasta_sm.errors.ConfigError, match=r"accumulate_kernel\): .*num_warps=None"):
        fasta_sm.autotune(configs, key=["n"])(accumulate_kernel)


def test_a_tuple_config_kwarg_holding_a_dtype_is_an_error_naming_the_item_not_the_tuple():
    """The error said `has type tuple; config values must be int, float, bool or str`, as if no tuple were
    taken, where a tuple of ints is."""
    configs = [triton.Config({"BLOCK": b, "PAIR": (3, tl.float32)}) for b in (64, 128)]
    with pytest.raises(fasta_sm.errors.ConfigError,
                       match=r"accumulate_kernel\): .*PAIR=.* holds triton\.language\.float32 of type dtype; "
                             r"config values must be int, float, bool or str, or tuples and lists of them"):
        fasta_sm.autotune(configs, key=["n"])(accumulate_kernel)


def test_after_a_stale_winner_failed_a_failure_of_a_config_pruned_to_alone_carries_no_stale_winner_note(tmp_path):
    from fasta_sm.triton.fork_server import interpreting
    from fasta_sm.triton.worker import config_failures

    configs = [triton.Config({"BLOCK": b}, num_warps=1, num_stages=1) for b in (16, 32, 64)]

    def only_64_at_head_16(configs, named_args, **kwargs):  # an argument outside `key` decides the prune
        return [c for c in configs if c.kwargs["BLOCK"] == 64] if kwargs.get("HEAD_D") == 16 else configs

    def decorated():
        return fasta_sm.autotune(configs, key=["n"], policy="exhaustive", state_dir=str(tmp_path),
                                 prune_configs_by={"early_config_prune": only_64_at_head_16},
                                 **larger_blocks_faster())(head_bound_kernel)

    x = torch.arange(256, dtype=torch.float32, device=DEVICE)
    out = torch.zeros_like(x)
    launch_grid = lambda meta: (triton.cdiv(256, meta["BLOCK"]),)  # noqa: E731
    decorated()[launch_grid](x, out, 256, HEAD_D=4)
    later = decorated()
    with pytest.raises(config_failures(interpreting())):
        later[launch_grid](x, out, 256, HEAD_D=8)  # the reused BLOCK=64 fails: the stale-winner note
    with pytest.raises(config_failures(interpreting())) as raised:
        later[launch_grid](x, out, 256, HEAD_D=16)  # the prune leaves BLOCK=64 alone: nothing was reused
    assert not [note for note in notes_of(raised.value) if "earlier tune" in note]


def test_configs_timings_holds_each_timed_config_as_mean_fastest_slowest_ms_in_the_config_lists_order(tuned_dir):
    _, kernel, _, _ = tuned_dir
    (result,) = kernel.results.values()
    state = result.state
    assert len(kernel.configs_timings) == len(state.durations) + len(state.failed)
    indices = [state.configs.index(to_fasta_config(config)) for config in kernel.configs_timings]
    assert indices == sorted(indices)
    for index, (mean, fastest, slowest) in zip(indices, kernel.configs_timings.values()):
        samples = state.durations[index]
        assert fastest == min(samples) / 1000 and slowest == max(samples) / 1000
        assert mean == pytest.approx(sum(samples) / len(samples) / 1000)


def test_the_first_config_of_configs_timings_with_the_lowest_mean_is_the_winner_ties_included(tuned_dir):
    """As the engine breaks a tie (the config listed first): a GPU timer's steps make ties between configs timed
    once common."""
    _, kernel, _, _ = tuned_dir
    timings = kernel.configs_timings
    assert min(timings, key=lambda config: timings[config][0]) == kernel.best_config


def test_configs_timings_of_a_reused_tune_are_those_of_the_tune_it_reuses(tuned_dir):
    state_dir, first, _, _ = tuned_dir
    kernel = make_tuned(str(state_dir))
    launch(kernel)
    assert kernel.configs_timings == first.configs_timings


def test_configs_timings_assigned_while_another_thread_makes_them_is_what_a_later_read_returns(
        tuned_dir, monkeypatch):
    """A reader making the pending timings must not undo an assignment (or a later tune's) made meanwhile."""
    import threading

    from fasta_sm.triton import autotune as autotune_module

    state_dir, _, _, _ = tuned_dir
    kernel = make_tuned(str(state_dir))
    launch(kernel)  # a reuse: its timings are Triton's dict once read
    making, go = threading.Event(), threading.Event()
    made = autotune_module._configs_timings

    def slowly(*args):
        making.set()
        go.wait(10)
        return made(*args)

    monkeypatch.setattr(autotune_module, "_configs_timings", slowly)
    reader = threading.Thread(target=lambda: kernel.configs_timings)
    reader.start()
    making.wait(2)  # none made at a read where the tune made them itself
    mine = {}
    kernel.configs_timings = mine
    go.set()
    reader.join(10)
    assert kernel.configs_timings is mine


def test_configs_timings_score_a_config_that_failed_as_three_infinities_as_triton_does(tmp_path):
    configs = [triton.Config({"BLOCK": block}, num_warps=1) for block in (16, 32, 64)]
    kernel = fasta_sm.autotune(configs, key=["n"], restore_value=["x_ptr"], policy="exhaustive", do_bench=once,
                               state_dir=str(tmp_path))(increment_failing_late_kernel)
    kernel[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](torch.zeros(64, device=DEVICE), 64)
    assert kernel.configs_timings[configs[0]] == [float("inf")] * 3
    assert all(np.isfinite(kernel.configs_timings[config]).all() for config in configs[1:])


needs_listener = pytest.mark.skipif(not hasattr(getattr(triton, "knobs", None), "autotuning")
                                    or not hasattr(triton.knobs.autotuning, "listener"),
                                    reason="this Triton has no triton.knobs.autotuning.listener")


@pytest.fixture
def listened(monkeypatch):
    """What `triton.knobs.autotuning.listener` is called with, a dict per call."""
    calls = []
    monkeypatch.setattr(triton.knobs.autotuning, "listener", lambda **kwargs: calls.append(kwargs))
    return calls


@needs_listener
def test_the_autotuning_listener_hears_a_tune_with_its_duration_and_no_cache_hit(tmp_path, listened):
    kernel = make_tuned(str(tmp_path), policy="exhaustive", do_bench=once)
    launch(kernel)
    launch(kernel)  # this process's cache: Triton calls the listener only for a key it settles
    ((key, result),) = kernel.results.items()
    (call,) = listened
    assert call["fn"] is accumulate_kernel and call["key"] == key
    assert call["best_config"] == kernel.best_config and call["configs_timings"] is kernel.configs_timings
    assert call["duration"] == kernel.bench_time and call["cache_hit"] is False


@needs_listener
def test_the_autotuning_listener_hears_a_reused_tune_as_a_cache_hit_without_a_duration(tuned_dir, listened):
    state_dir, _, _, _ = tuned_dir
    kernel = make_tuned(str(state_dir))
    launch(kernel)
    (call,) = listened
    assert call["cache_hit"] is True and call["duration"] is None and call["best_config"] == kernel.best_config


@pytest.mark.parametrize("what", ["key", "reset_to_zero"])
def test_a_string_naming_one_argument_is_that_argument_as_in_triton_for_a_one_letter_name(what, tmp_path):
    kernel = fasta_sm.autotune(CONFIGS, **{"key": ["n"], what: "n"}, state_dir=str(tmp_path))(accumulate_kernel)
    assert getattr(kernel, "keys" if what == "key" else what) == ["n"]


def test_a_string_that_names_no_argument_is_a_type_error_naming_it(tmp_path):
    with pytest.raises(TypeError, match=r"accumulate_kernel\): key must be a list of argument names, not the "
                                        r"string 'n,x_ptr'"):
        fasta_sm.autotune(CONFIGS, key="n,x_ptr", state_dir=str(tmp_path))(accumulate_kernel)


@triton.jit
def increment_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def test_restore_value_saves_each_timed_launchs_input_after_the_configs_pre_hook_as_triton_does(tmp_path):
    def add_100(nargs):
        nargs["x_ptr"].add_(100)

    configs = [triton.Config({"BLOCK": b}, num_warps=1, num_stages=1, pre_hook=add_100) for b in (16, 32)]
    launch_grid = lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)  # noqa: E731
    ends = []
    for decorate in (triton.autotune(configs, key=["n"], restore_value=["x_ptr"], do_bench=once),
                     fasta_sm.autotune(configs, key=["n"], restore_value=["x_ptr"], do_bench=once,
                                       policy="exhaustive", state_dir=str(tmp_path))):
        x = torch.zeros(40, device=DEVICE)
        decorate(increment_kernel)[launch_grid](x, 40)
        ends.append(x.sum().item())
    assert ends[1] == ends[0]


@triton.jit
def tma_matmul_kernel(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    """c = a @ b through host TMA descriptors, whose block shapes a config pre_hook sets (Triton's tutorials)."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        acc = tl.dot(a_desc.load([pid_m * BLOCK_M, k]), b_desc.load([k, pid_n * BLOCK_N]), acc)
    c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.float16))


def set_tma_blocks(nargs):
    m, n, k = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [m, k]
    nargs["b_desc"].block_shape = [k, n]
    nargs["c_desc"].block_shape = [m, n]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or torch.cuda.get_device_capability()[0] < 9, reason="TMA needs a CUDA GPU of sm_90+")
def test_gpu_a_tma_kernel_whose_config_pre_hook_sets_the_block_shapes_tunes_and_computes_right(tmp_path):
    """Compiled ahead without its hook, every config's descriptors are the [1, 1] placeholder and tl.dot refuses
    them; as in Triton, each config must compile as launched, after its pre_hook."""
    TensorDescriptor = pytest.importorskip("triton.tools.tensor_descriptor").TensorDescriptor
    size = 256
    a, b = (torch.randn(size, size, device="cuda", dtype=torch.float16) for _ in range(2))
    c = torch.empty(size, size, device="cuda", dtype=torch.float16)
    descriptors = [TensorDescriptor.from_tensor(t, [1, 1]) for t in (a, b, c)]
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": 64}, num_warps=4, num_stages=3,
                             pre_hook=set_tma_blocks) for m in (64, 128) for n in (64, 128)]
    kernel = fasta_sm.autotune(configs, key=["K"], policy="exhaustive", state_dir=str(tmp_path))(tma_matmul_kernel)
    kernel[lambda meta: (size // meta["BLOCK_M"], size // meta["BLOCK_N"])](*descriptors, size)
    (result,) = kernel.results.values()
    assert result.state.failed == {} and len(result.state.durations) == len(configs)
    torch.testing.assert_close(c, (a.float() @ b.float()).half(), atol=0.1, rtol=0.01)


def test_configs_timings_puts_a_tied_config_after_the_winner_the_engine_chose_whatever_order_they_were_timed_in():
    from fasta_sm.state import TuneState
    from fasta_sm.triton.autotune import _configs_timings

    first, second = SMALL[:2]
    state = TuneState(key="k", kernel="k", configs=[to_fasta_config(first), to_fasta_config(second)],
                      policy="exhaustive", durations={1: [8.72], 0: [8.72]}, compiled={0: 1.0, 1: 1.0}, best=0,
                      best_us=8.72)
    timings = _configs_timings(state, {to_fasta_config(c).identity: c for c in (first, second)})
    assert min(timings, key=lambda config: timings[config][0]) is first


def _running(pid: int) -> bool:
    """Whether `pid` runs: neither gone nor a zombie (an orphan's exit is reaped by whoever adopted it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self/stat").exists(), reason="needs os.fork, /proc")
def test_the_fork_server_ends_with_its_process_though_a_child_that_process_forked_lives_on():
    environ = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FASTA_PREWARM")}
    with subprocess.Popen([sys.executable, str(HERE / "fork_server_child.py")], stdout=subprocess.PIPE,
                          text=True, env=environ) as program:  # its output is not read to the end: the child holds it
        server, child = map(int, program.stdout.readline().split())
        assert program.wait(timeout=60) == 0
    try:
        deadline = time.monotonic() + 20
        while _running(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(server), "the forked child kept the fork server alive"
        assert _running(child)
    finally:
        for pid in (server, child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@triton.jit
def scale_by_first_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, PAIR: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * PAIR[0], mask=mask)


def test_a_tuple_config_kwarg_reaches_each_timed_launch_and_hook_as_the_tuple_as_in_triton(tmp_path):
    """A fasta config holds a tuple kwarg as its repr, which keys the state; timed as that string, every config
    failed (`'str' object has no attribute 'dtype'`) and the tune stopped, where Triton's ran."""
    seen = []
    configs = [triton.Config({"BLOCK": b, "PAIR": (3, 1)}, num_warps=1, num_stages=1,
                             pre_hook=lambda nargs: seen.append(nargs["PAIR"])) for b in (16, 32)]
    kernel = fasta_sm.autotune(configs, key=["n"], policy="exhaustive", do_bench=once,
                               state_dir=str(tmp_path))(scale_by_first_kernel)
    x, out = torch.ones(64, device=DEVICE), torch.zeros(64, device=DEVICE)
    kernel[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](x, out, 64)
    torch.testing.assert_close(out, 3.0 * x)
    assert seen and set(seen) == {(3, 1)}
    (result,) = kernel.results.values()
    assert result.state.failed == {} and {c.kwargs["PAIR"] for c in result.state.configs} == {"(3, 1)"}


def test_a_prune_that_returns_its_configs_in_another_order_in_a_new_process_reuses_the_done_tune(tmp_path):
    """A prune that drops twins through a set returns them in an order that follows the process's string
    hashing (PYTHONHASHSEED): each new process superseded the finished tune and tuned again."""

    def decorated(order):  # each call stands for a new process: its own kernel object over one state dir
        return fasta_sm.autotune(SMALL, key=["n"], reset_to_zero=["out_ptr"], do_bench=once,
                                 prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: order(configs)},
                                 state_dir=str(tmp_path))(accumulate_kernel)

    first = decorated(list)
    launch(first, 512)
    later = decorated(lambda configs: configs[::-1])
    x, out = launch(later, 512)
    torch.testing.assert_close(out, 2.0 * x)
    (result,) = later.results.values()
    assert result.reused and later.best_config == first.best_config
    assert [path.name for path in tmp_path.iterdir() if ".superseded-" in path.name] == []
