"""FastaCachingAutotuner through torch's real CachingAutotuner control flow, with compile and timing faked.

Compiling and timing need a GPU; everything around them is torch's own code
here: the decorator, the worker's precompile(warm_cache_only=True),
prepare_for_pickle and the pickle, the parent's precompile (launchers),
run() → autotune_to_one_config() → our benchmark_all_configs, the pruning
of compile results to the winner, and run()'s launch.
"""

from __future__ import annotations

import logging
import math
import pickle

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
import triton.language as tl
from torch._inductor.runtime import triton_heuristics
from torch._inductor.runtime.hints import DeviceProperties
from triton.runtime.jit import JITFunction

import fasta_sm.inductor as fi
from fasta_sm.driver import to_fasta_config
from fasta_sm.inductor.autotuner import FastaCachingAutotuner
from fasta_sm.store import StateStore


def reduce_source(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK: tl.constexpr, R0_BLOCK: tl.constexpr):
    pass


CPU = DeviceProperties(type="cpu", index=0, multi_processor_count=8, cc=0, warp_size=32, max_threads_per_block=1024)
CALLS = {"compile": 0, "bench": 0, "launch": 0}


def cost_us(config) -> float:
    """A smooth landscape with its optimum away from Inductor's own configs."""
    kw = config.kwargs
    return 10 + abs(math.log2(kw["XBLOCK"]) - 3) * 2 + abs(math.log2(kw["R0_BLOCK"]) - 7) + config.num_warps * 0.3


class FakeKernel:
    def __init__(self, config):
        self.hash = "h" + str(abs(hash(to_fasta_config(config).identity)))


class FakeLauncher:
    def __init__(self, config):
        self.config = config
        self.cache_hash = None
        self.store_cubin = False
        self.n_spills = self.n_regs = self.shared = 0

    def __call__(self, *args, stream=None, **kwargs):
        CALLS["launch"] += 1
        return self.config


class FakeResult:
    def __init__(self, config):
        self.config = config
        self.kernel = FakeKernel(config)

    def make_launcher(self):
        return FakeLauncher(self.config)


def fake_precompile_config(self, cfg):
    assert self.fn.fn is not None, "compiling needs the live kernel function"
    CALLS["compile"] += 1
    return FakeResult(cfg)


def fake_bench(self, launcher, *args, **kwargs):
    CALLS["bench"] += 1
    return cost_us(launcher.config) / 1000.0


class NoDeviceGuard:
    """CPU has no device to switch to (torch's CPU interface raises NotImplementedError)."""

    def __init__(self, interface, index):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def faked(monkeypatch, tmp_path):
    monkeypatch.setattr(triton_heuristics.CachingAutotuner, "_precompile_config", fake_precompile_config)
    monkeypatch.setattr(triton_heuristics.CachingAutotuner, "bench", fake_bench)
    monkeypatch.setattr(triton_heuristics.CachingAutotuner, "_build_fast_launcher", lambda self, launcher: None,
                        raising=False)
    monkeypatch.setattr(torch._dynamo.device_interface, "DeviceGuard", NoDeviceGuard)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    CALLS.update(compile=0, bench=0, launch=0)
    settings = fi.enable(state_dir=tmp_path / "states", max_configs=40)
    yield settings
    fi.disable()


def decorate(tmp_path, settings, autotune_local_cache=False):
    meta = {"kernel_name": "triton_red_fused_sum_0", "fasta_sm": settings.to_dict(),
            "autotune_local_cache": autotune_local_cache, "autotune_remote_cache": False}
    triton_meta = {"signature": {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32", "r0_numel": "i32"},
                   "device": CPU, "constants": {}, "configs": []}
    decorator = triton_heuristics.reduction(size_hints={"x": 4096, "r0_": 4096}, reduction_hint=0,
                                            triton_meta=triton_meta, inductor_meta=meta,
                                            filename=str(tmp_path / "cfake0001.py"))
    return decorator(JITFunction(reduce_source))  # a fresh module's function, as in a worker


def worker_then_parent(tmp_path, settings, **inductor_meta):
    worker = decorate(tmp_path, settings, **inductor_meta)
    worker.precompile(warm_cache_only=True)
    worker.prepare_for_pickle()
    parent = pickle.loads(pickle.dumps(worker))
    parent.restore_after_unpickle(old_values=None)
    parent.precompile(warm_cache_only=False, reload_kernel=lambda: decorate(tmp_path, settings, **inductor_meta))
    return worker, parent


def test_worker_parent_run_through_torchs_own_flow(tmp_path, faked):
    _, parent = worker_then_parent(tmp_path, faked)
    assert type(parent) is FastaCachingAutotuner
    plan = parent._fasta_plan
    state = StateStore(tmp_path / "states").load(plan.key)
    r1 = state.rounds[0].batch
    assert CALLS["compile"] == len(r1) and len(parent.launchers) == len(r1)
    assert set(plan.must) <= set(r1)

    CALLS["compile"] = 0
    winner_config = parent.run("in", "out", 4096, 4096, stream=0)
    done = StateStore(tmp_path / "states").load(plan.key)
    assert done.done and CALLS["launch"] == 1
    assert len(parent.launchers) == 1 and parent.launchers[0].config is winner_config
    assert to_fasta_config(winner_config) == done.configs[done.best]
    if hasattr(triton_heuristics.CachingAutotuner, "_prune_compile_results_to_launcher"):  # torch >= 2.13
        assert len(parent.compile_results) == 1, "torch pruned its compile results to the winner"
    assert CALLS["compile"] == len(done.compiled) - len(r1), "R2 compiled in the parent, after reloading the kernel"
    assert CALLS["bench"] == done.evaluations()
    assert done.best_us <= min(cost_us(parent._fasta_space[i]) for i in plan.must)
    assert done.measured_count() < done.n_configs

    CALLS.update(compile=0, bench=0)
    _, again = worker_then_parent(tmp_path, faked)
    assert CALLS["compile"] == 1 and len(again.launchers) == 1, "a finished tune compiles only its winner"
    assert to_fasta_config(again.run("in", "out", 4096, 4096, stream=0)) == done.configs[done.best]
    assert CALLS["bench"] == 0, "and benchmarks nothing"


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_inductor_reports_no_skipped_configs_for_a_tune_that_left_configs_untried(tmp_path, faked, monkeypatch):
    _, parent = worker_then_parent(tmp_path, faked)
    r1 = StateStore(tmp_path / "states").load(parent._fasta_plan.key).rounds[0].batch
    untried = [i for i in range(len(parent._fasta_space)) if i not in r1]
    parent.launchers.append(FakeLauncher(parent._fasta_space[untried[-1]]))  # compiled ahead, as a guess is
    recorder = Recorder()
    monkeypatch.setattr(triton_heuristics.log, "level", logging.INFO)  # torch's loggers do not propagate
    triton_heuristics.log.addHandler(recorder)
    try:
        parent.run("in", "out", 4096, 4096, stream=0)
    finally:
        triton_heuristics.log.removeHandler(recorder)
    done = StateStore(tmp_path / "states").load(parent._fasta_plan.key)
    assert done.measured_count() < done.n_configs and not done.failed
    assert not [m for m in recorder.messages if m.startswith("Skipped")]


def test_a_parent_that_gives_up_times_inductors_own_configs_alone(tmp_path, faked, monkeypatch):
    from fasta_sm import driver
    from fasta_sm.errors import LockTimeout

    _, parent = worker_then_parent(tmp_path, faked)
    own = [parent._fasta_space[i] for i in parent._fasta_plan.must]

    def held_elsewhere(plan, backend):
        raise LockTimeout("another process holds the lock")

    monkeypatch.setattr(driver, "parent_phase", held_elsewhere)
    CALLS.update(compile=0, bench=0)
    winner = parent.run("in", "out", 4096, 4096, stream=0)
    assert any(winner is config for config in own)
    assert CALLS["compile"] == 0, "Inductor's configs were compiled in R1 already"
    assert CALLS["bench"] == len(own)


def test_a_worker_that_gives_up_part_way_leaves_inductor_its_own_configs_to_compile(tmp_path, faked, monkeypatch):
    from fasta_sm.store import StateStore

    write = StateStore.write

    def full_disk_after_a_compile(self, *args, **kwargs):
        if CALLS["compile"] > 0:
            raise OSError(28, "No space left on device")
        return write(self, *args, **kwargs)

    monkeypatch.setattr(StateStore, "write", full_disk_after_a_compile)
    worker = decorate(tmp_path, faked)
    own = [worker._fasta_space[i] for i in worker._fasta_plan.must]
    worker.precompile(warm_cache_only=True)
    assert worker._fasta_plan is None
    assert [result.config for result in worker.compile_results] == own


def test_a_worker_whose_every_config_fails_to_compile_tries_none_twice_and_leaves_inductor_its_own(
    tmp_path, faked, monkeypatch, caplog
):
    from triton.runtime.errors import OutOfResources

    tried = []

    def out_of_resources(self, cfg):
        tried.append(to_fasta_config(cfg).identity)
        raise OutOfResources(10**6, 232448, "shared memory")

    monkeypatch.setattr(triton_heuristics.CachingAutotuner, "_precompile_config", out_of_resources)
    worker = decorate(tmp_path, faked)
    own = [worker._fasta_space[i] for i in worker._fasta_plan.must]
    with pytest.raises(Exception, match="OutOfResources"):  # Inductor's own error, over its own configs
        worker.precompile(warm_cache_only=True)
    fasta_tries = tried[: len(tried) - len(own)]
    assert len(set(fasta_tries)) == len(fasta_tries), "no config compiled twice by fasta-sm"
    assert worker._fasta_plan is None and worker.configs == own
    assert "none of the" in caplog.text and "using Inductor's own configs" in caplog.text


def test_a_parent_that_called_disable_after_its_worker_built_the_kernel_times_inductors_own_configs(
    tmp_path, faked
):
    worker = decorate(tmp_path, faked)
    worker.precompile(warm_cache_only=True)  # in a compile worker that never hears of disable()
    worker.prepare_for_pickle()
    fi.disable()
    parent = pickle.loads(pickle.dumps(worker))
    parent.restore_after_unpickle(old_values=None)
    parent.precompile(warm_cache_only=False, reload_kernel=lambda: decorate(tmp_path, faked))
    own = [parent._fasta_space[i] for i in parent._fasta_plan.must]
    key = parent._fasta_plan.key
    CALLS.update(compile=0, bench=0)
    winner = parent.run("in", "out", 4096, 4096, stream=0)
    assert any(winner is config for config in own) and CALLS["bench"] == len(own)
    assert parent._fasta_plan is None and not StateStore(tmp_path / "states").load(key).done


def test_a_worker_that_finds_the_tune_locked_compiles_each_of_inductors_configs_once_before_inductor_does(
    tmp_path, faked, monkeypatch
):
    from collections import Counter

    from triton.runtime.errors import OutOfResources

    from fasta_sm import driver
    from fasta_sm.errors import LockTimeout

    tried = []

    def out_of_resources(self, cfg):
        tried.append(to_fasta_config(cfg).identity)
        raise OutOfResources(10**6, 232448, "shared memory")

    def held_elsewhere(plan, backend):
        raise LockTimeout("another process holds the lock")

    monkeypatch.setattr(triton_heuristics.CachingAutotuner, "_precompile_config", out_of_resources)
    monkeypatch.setattr(driver, "worker_phase", held_elsewhere)
    worker = decorate(tmp_path, faked)
    with pytest.raises(Exception, match="OutOfResources"):
        worker.precompile(warm_cache_only=True)
    assert set(Counter(tried).values()) == {2}  # once by fasta-sm, once by Inductor


def test_a_warm_fx_graph_cache_finds_the_winner_in_inductors_autotune_cache_and_times_nothing(
        tmp_path, faked, monkeypatch):
    """On CUDA the FX graph cache keeps the autotuner as its worker compiled it (the first round); a later process
    rechecks Inductor's autotune cache from it, which the winner was written to under the whole space's hash."""
    monkeypatch.setattr(triton_heuristics.CachingAutotuner, "is_statically_launchable", lambda self: True)

    def with_local_cache():
        return decorate(tmp_path, faked, autotune_local_cache=True)

    worker = with_local_cache()
    worker.precompile(warm_cache_only=True)
    worker.prepare_for_pickle()
    parent = pickle.loads(pickle.dumps(worker))
    parent.restore_after_unpickle(old_values=None)
    old_values = parent.prepare_for_pickle()
    cached = pickle.dumps(parent)  # what the FX graph cache keeps: the round's compile results, no launchers
    parent.restore_after_unpickle(old_values)
    parent.precompile(warm_cache_only=False, reload_kernel=with_local_cache)
    winner = to_fasta_config(parent.run("in", "out", 4096, 4096, stream=0))

    later = pickle.loads(cached)
    later.restore_after_unpickle(old_values=None)
    CALLS.update(compile=0, bench=0)
    later.recheck_autotune_cache(reload_kernel_from_src=with_local_cache)
    later.precompile(warm_cache_only=False, reload_kernel=with_local_cache)
    assert later.autotune_cache_info.get("autotune_cache_state") == "hit"
    assert len(later.launchers) == 1 and to_fasta_config(later.run("in", "out", 4096, 4096, stream=0)) == winner
    assert CALLS["bench"] == 0 and CALLS["compile"] <= 1


def test_torch_releases_the_launchers_of_configs_the_tune_never_tried(tmp_path, faked, monkeypatch):
    """Torch closes every launcher in `launchers` but the winner's: one dropped from that list keeps its module."""
    if not hasattr(triton_heuristics.CachingAutotuner, "_close_static_launcher"):
        pytest.skip(f"torch {torch.__version__} closes no launcher after a tune (no _close_static_launcher)")
    _, parent = worker_then_parent(tmp_path, faked)
    r1 = StateStore(tmp_path / "states").load(parent._fasta_plan.key).rounds[0].batch
    index = [i for i in range(len(parent._fasta_space)) if i not in r1][-1]
    untried = FakeLauncher(parent._fasta_space[index])
    parent.launchers.append(untried)  # compiled ahead, as a guess is
    closed = []
    monkeypatch.setattr(triton_heuristics.CachingAutotuner, "_close_static_launcher", staticmethod(closed.append))
    parent.run("in", "out", 4096, 4096, stream=0)
    done = StateStore(tmp_path / "states").load(parent._fasta_plan.key)
    assert index not in done.durations and any(launcher is untried for launcher in closed)


def test_a_parent_that_gives_up_closes_the_launchers_it_leaves_out_of_inductors_timing(tmp_path, faked, monkeypatch):
    """The fallback times Inductor's own configs alone; torch closes only the launchers still listed, so the
    ones the fallback takes out of the list are closed by fasta-sm."""
    if not hasattr(triton_heuristics.CachingAutotuner, "_close_static_launcher"):
        pytest.skip(f"torch {torch.__version__} closes no launcher after a tune (no _close_static_launcher)")
    from fasta_sm import driver
    from fasta_sm.errors import LockTimeout

    _, parent = worker_then_parent(tmp_path, faked)
    own = {id(parent._fasta_space[index]) for index in parent._fasta_plan.must}
    extra = next(config for config in parent._fasta_space if id(config) not in own)
    guess = FakeLauncher(extra)
    parent.launchers.append(guess)  # compiled ahead, as a guess is
    closed = []
    monkeypatch.setattr(triton_heuristics.CachingAutotuner, "_close_static_launcher", staticmethod(closed.append))

    def held_elsewhere(plan, backend):
        raise LockTimeout("another process holds the lock")

    monkeypatch.setattr(driver, "parent_phase", held_elsewhere)
    parent.run("in", "out", 4096, 4096, stream=0)
    assert any(launcher is guess for launcher in closed)


def test_a_parent_that_gives_up_runs_on_when_closing_a_dropped_launcher_fails(tmp_path, faked, monkeypatch, caplog):
    """Tuning never breaks a run: a driver error unloading a guess's module is logged, and Inductor's timing of
    its own configs goes on."""
    if not hasattr(triton_heuristics.CachingAutotuner, "_close_static_launcher"):
        pytest.skip(f"torch {torch.__version__} closes no launcher after a tune (no _close_static_launcher)")
    from fasta_sm import driver
    from fasta_sm.errors import LockTimeout

    _, parent = worker_then_parent(tmp_path, faked)
    own = {id(parent._fasta_space[index]) for index in parent._fasta_plan.must}
    guess = FakeLauncher(next(c for c in parent._fasta_space if id(c) not in own))
    parent.launchers.append(guess)

    def unload_fails(launcher):  # for the guess alone: torch's own closing after its timing is torch's
        if launcher is guess:
            raise RuntimeError("CUDA error: unspecified launch failure")

    def held_elsewhere(plan, backend):
        raise LockTimeout("another process holds the lock")

    monkeypatch.setattr(triton_heuristics.CachingAutotuner, "_close_static_launcher", staticmethod(unload_fails))
    monkeypatch.setattr(driver, "parent_phase", held_elsewhere)
    kernel = parent._fasta_plan.kernel
    parent.run("in", "out", 4096, 4096, stream=0)
    assert f"kernel {kernel}: a dropped launcher" in caplog.text and "stays loaded: CUDA error" in caplog.text


def test_a_parent_that_gives_up_leaves_no_autotune_cache_entry_that_keeps_later_runs_from_tuning(
        tmp_path, faked, monkeypatch):
    """A fallback (here: another process holds the kernel's lock) times Inductor's own configs; writing that pick
    to Inductor's autotune cache, under the hash of the whole tuned space, would answer every later run's lookup
    with it, so the kernel would never be tuned again while the cache lives, though its tune is unfinished."""
    from fasta_sm import driver
    from fasta_sm.errors import LockTimeout

    _, parent = worker_then_parent(tmp_path, faked, autotune_local_cache=True)

    def held_elsewhere(plan, backend):
        raise LockTimeout("another process holds the lock")

    with monkeypatch.context() as patch:
        patch.setattr(driver, "parent_phase", held_elsewhere)
        parent.run("in", "out", 4096, 4096, stream=0)
    later = decorate(tmp_path, faked, autotune_local_cache=True)  # the next run, the lock free again
    assert later._fasta_plan is not None and len(later._fasta_space) == len(parent._fasta_space)
