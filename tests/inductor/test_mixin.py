"""FastaAutotunerMixin over a CachingAutotuner stand-in: worker process → pickle → parent run → DONE."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from fake_autotuner import CALLS, FastaFake

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.driver import to_fasta_config
from fasta_sm.store import StateStore
from fasta_sm.tuner import tune


def worker(table_file: Path, state_dir: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(HERE / "mixin_worker.py"), str(table_file), str(state_dir), str(out)],
                          check=False, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(autouse=True)
def reset_calls():
    CALLS.update(compile=0, bench=0, rescale=0)


def parent(out: Path):
    with open(out, "rb") as handle:
        kernel = pickle.load(handle)
    kernel.precompile(reload_kernel=kernel._reload_kernel)
    result = kernel.run("x", stream=0)
    return kernel, result


def test_worker_compiles_r1_and_parent_tunes_to_done(table_file, tmp_path):
    states, out = tmp_path / "states", tmp_path / "kernel.pkl"
    first = worker(table_file, states, out)
    state = StateStore(states).load("fake/toy")
    r1 = [i for i in state.rounds[0].batch if i not in state.failed]
    assert first["results"] == len(r1) and first["compiled"] == len(state.rounds[0].batch)

    kernel, result = parent(out)
    done = StateStore(states).load("fake/toy")
    assert done.done and kernel._fasta_finished
    assert len(kernel.launchers) == 1
    winner = to_fasta_config(kernel.launchers[0].config)
    assert winner == done.configs[done.best] and kernel.saved is kernel.launchers[0].config
    assert result == ("launched", winner.kwargs)
    table = load_table(table_file)
    assert done.best_us <= min(table.mean_us[i] for i in (0, 5)), "never slower than Inductor's own configs"
    assert CALLS["bench"] == done.evaluations(), "every timing is the tune's"
    assert CALLS["rescale"] == 0, "a tuned kernel never rescales R0_BLOCK outside its space"

    CALLS.update(compile=0, bench=0, rescale=0)
    second = worker(table_file, states, out)
    assert second["results"] == 1, "a finished tune compiles only its winner"
    kernel, _ = parent(out)
    assert CALLS == {"compile": 0, "bench": 0, "rescale": 0}, "a third run tunes nothing"
    assert to_fasta_config(kernel.launchers[0].config) == winner


def test_pickle_carries_no_launchers_locks_or_files(table_file, tmp_path):
    out = tmp_path / "kernel.pkl"
    worker(table_file, tmp_path / "states", out)
    kernel = pickle.loads(out.read_bytes())
    state = kernel.__getstate__()
    assert state["lock"] is None and state["launchers"] == []
    for value in state.values():
        assert not hasattr(value, "fileno") and not hasattr(value, "acquire")
    assert kernel._fasta_plan.key == "fake/toy"


def test_unusable_state_dir_falls_back_to_inductor_configs(table_file, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    kernel = FastaFake(table_file, blocker)
    kernel.precompile()
    kernel.run("x", stream=0)
    assert kernel._fasta_plan is None
    assert len(kernel.launchers) == 1
    table = load_table(table_file)
    best_default = min((0, 5), key=lambda i: table.mean_us[i])
    assert to_fasta_config(kernel.launchers[0].config) == table.configs[best_default]


def test_parent_without_worker_tunes_in_process(table_file, tmp_path):
    kernel = FastaFake(table_file, tmp_path / "states")
    kernel.precompile()  # the non-parallel path: worker and parent halves in one process
    kernel.run("x", stream=0)
    assert StateStore(tmp_path / "states").load("fake/toy").done
    assert len(kernel.launchers) == 1


@pytest.mark.parametrize("prior", [True, False])
def test_a_new_tune_starts_from_its_kernels_finished_tunes_where_the_settings_say_so(table_file, tmp_path, prior):
    states = tmp_path / "states"
    kernel = FastaFake(table_file, states, prior=prior)
    plan = kernel._fasta_plan
    tune("fake/another-shape", plan.kernel, plan.configs, ReplayBackend(load_table(table_file)),
         store=StateStore(states))
    kernel.precompile()
    kernel.run("x", stream=0)
    r1 = StateStore(states).load(plan.key).rounds[0]
    assert ("that earlier tunes of the kernel found fast" in r1.reason) is prior


@contextlib.contextmanager
def lock_held_elsewhere(lock_path: Path):
    """Another process holds the kernel's lock for as long as the block runs."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, filelock; lock = filelock.FileLock(sys.argv[1]); lock.acquire(); "
        "print('held', flush=True); time.sleep(60)"), str(lock_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()


def test_worker_that_finds_the_tune_locked_leaves_it_to_its_parent(table_file, tmp_path, monkeypatch):
    import fasta_sm.driver

    states = tmp_path / "states"
    kernel = FastaFake(table_file, states)
    lock_path = StateStore(states).lock_path_for(kernel._fasta_plan.key)
    monkeypatch.setattr(fasta_sm.driver, "WORKER_LOCK_TIMEOUT_S", 0.2)
    with lock_held_elsewhere(lock_path):
        kernel.precompile(warm_cache_only=True)
    assert kernel._fasta_plan is not None, "still tuned: the parent waits for the lock"
    assert CALLS["compile"] == 2, "the worker compiled Inductor's own configs only"
    kernel.precompile()
    kernel.run("x", stream=0)
    assert StateStore(states).load("fake/toy").done


def test_worker_that_finds_the_tune_locked_with_no_default_configs_leaves_it_to_its_parent(
    table_file, tmp_path, monkeypatch, caplog
):
    """A torch_npu kernel with no `from_expert` config has no default configs: the worker still leaves the tune
    to its parent, compiling one config for it, rather than giving the tune up as if nothing compiled."""
    import fasta_sm.driver

    states = tmp_path / "states"
    kernel = FastaFake(table_file, states, must=())
    lock_path = StateStore(states).lock_path_for(kernel._fasta_plan.key)
    monkeypatch.setattr(fasta_sm.driver, "WORKER_LOCK_TIMEOUT_S", 0.2)
    with lock_held_elsewhere(lock_path):
        kernel.precompile(warm_cache_only=True)
    assert kernel._fasta_plan is not None, "still tuned: the parent waits for the lock"
    assert "own configs" not in caplog.text
    assert CALLS["compile"] == 1, "the worker compiled one config, not the whole space"
    kernel.precompile()
    kernel.run("x", stream=0)
    assert StateStore(states).load("fake/toy").done


def test_a_rounds_configs_compile_in_parallel_threads_and_all_are_kept(table_file, tmp_path):
    """After the first config (alone, in the calling thread), two compiles meet at a barrier:
    run one after the other, the first of them would time out and fail. Only the calling
    thread writes the autotuner's compile results."""
    import threading

    class Recording(FastaFake):
        writers: list = []

        @property
        def compile_results(self):
            return self.__dict__.get("_results", [])

        @compile_results.setter
        def compile_results(self, value):
            self.writers.append(threading.current_thread())
            self.__dict__["_results"] = value

    kernel = Recording(table_file, tmp_path / "states")
    kernel.writers.clear()
    meet = threading.Barrier(2, timeout=10)
    real = kernel._precompile_config
    calls = []

    def compile_at_barrier(cfg):
        calls.append(threading.current_thread())
        if len(calls) > 1:
            meet.wait()
        return real(cfg)

    kernel._precompile_config = compile_at_barrier
    table = load_table(table_file)
    ok = [i for i, error in enumerate(table.errors) if not error][:3]
    outcomes = kernel._fasta_compile_all(ok)
    assert [outcomes[i][0] for i in ok] == [None, None, None]
    assert calls[0] is threading.current_thread()
    assert sorted(kernel._fasta_index_of(r.config) for r in kernel.compile_results) == sorted(ok)
    assert kernel.writers and set(kernel.writers) == {threading.current_thread()}


def test_compile_threads_one_compiles_in_the_calling_thread(table_file, tmp_path):
    import threading

    from fasta_sm.driver import DriverSettings

    kernel = FastaFake(table_file, tmp_path / "states")
    kernel._fasta_setup(DriverSettings(state_dir=str(tmp_path / "states"), compile_threads=1).to_dict(), [0], "fake")
    seen = []
    real = kernel._precompile_config
    kernel._precompile_config = lambda cfg: (seen.append(threading.current_thread()), real(cfg))[1]
    table = load_table(table_file)
    ok = [i for i, error in enumerate(table.errors) if not error][:3]
    kernel._fasta_compile_all(ok)
    assert seen == [threading.current_thread()] * 3


def test_the_config_optimizer_keeps_the_integrations_own_configs(table_file, tmp_path):
    kernel = FastaFake(table_file, tmp_path / "states", must=(0, 5))
    policy, params = kernel._fasta_plan.policy_args()
    assert policy == "must-measure" and params["params"]["expert_configs"] == [0, 5]


def test_must_measures_r1_reason_names_the_default_configs_and_how_many_it_added(table_file):
    import numpy as np

    from fasta_sm.policies import make_policy

    table = load_table(table_file)
    policy = make_policy("must-measure", table.configs, {"inner": "random", "must": [5, 0], "params": {"budget": 0.1}})
    decision = policy.plan(np.random.default_rng(0))
    sample = make_policy("random", table.configs, {"budget": 0.1}).plan(np.random.default_rng(0)).batch
    added = len({0, 5} - set(sample))
    assert f"default configs #0, #5 always measured ({added} added to the sample)" in decision.reason


def test_inductor_configs_that_differ_only_in_launch_options_are_different_configs():
    import triton

    plain = triton.Config({"XBLOCK": 64}, num_warps=4, num_stages=1)
    capped = triton.Config({"XBLOCK": 64}, num_warps=4, num_stages=1, maxnreg=128)
    assert to_fasta_config(capped).options == {"maxnreg": 128}
    assert to_fasta_config(plain).identity != to_fasta_config(capped).identity
