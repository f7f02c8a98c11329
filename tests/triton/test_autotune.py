"""`fasta_sm.autotune` end to end: tune, check the output, reuse, key separation, kill and resume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
from conftest import DEVICE
from kernels import CONFIGS, accumulate_kernel, grid, make_tuned

import fasta_sm
from fasta_sm.policies import make_policy
from fasta_sm.store import StateStore
from fasta_sm.triton.autotune import to_fasta_config, to_triton_config
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
    assert key[0] == 2048 and "torch.float32" in key and key[-1] == triton.__version__


def test_a_new_process_view_reuses_the_done_tune_and_times_nothing(tuned_dir, monkeypatch):
    state_dir, first, _, _ = tuned_dir

    def no_benchmark(self, *args, **kwargs):
        raise AssertionError("a DONE tune was benchmarked again")

    monkeypatch.setattr(TritonBackend, "benchmark", no_benchmark)
    monkeypatch.setattr(TritonBackend, "compile", no_benchmark)
    kernel = make_tuned(str(state_dir))
    x, out = launch(kernel)
    torch.testing.assert_close(out, 2.0 * x)
    (result,) = kernel.results.values()
    assert result.reused and kernel.best_config == first.best_config


def test_each_key_value_is_its_own_tune(tmp_path):
    kernel = make_tuned(str(tmp_path), policy="random", budget=0.1)
    for n in (100, 300):
        x, out = launch(kernel, n)
        torch.testing.assert_close(out, 2.0 * x)
    assert len(kernel.results) == 2
    assert len(StateStore(tmp_path).state_files()) == 2


def test_prune_configs_by_narrows_the_tuned_list(tmp_path):
    def early(configs, nargs, **kwargs):
        return [c for c in configs if c.kwargs["BLOCK"] >= 256]

    kernel = make_tuned(str(tmp_path), policy="exhaustive", prune_configs_by={"early_config_prune": early})
    launch(kernel, 1000)
    (result,) = kernel.results.values()
    assert result.state.n_configs == 12
    assert all(c.kwargs["BLOCK"] >= 256 for c in result.state.configs)


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
    with pytest.raises(ValueError, match="unknown arguments"):
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
    saved = {before.configs[i].identity for i in before.durations}
    assert len(saved) >= r1

    resumed = run_child(state_dir, second_log, kill_after=0)
    assert resumed.returncode == 0 and "OK False" in resumed.stdout, resumed.stderr[-2000:]
    after = store.read(state_file)
    assert after.done
    retimed = {after.configs[i].identity for r in after.rounds if r.retime for i in r.batch}
    measured_again = set(second_log.read_text().split()) & saved
    assert measured_again <= retimed, "configs measured before the kill were measured again"

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
