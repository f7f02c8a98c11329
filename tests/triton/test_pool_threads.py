"""Two threads on one CompilePool: a run isolating a crash while another thread starts, fails or closes the pool.

No worker process is made: `FakeExecutor` stands in for ProcessPoolExecutor, and the
test decides when each future ends, so every interleaving below is forced, not hoped for.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool

import pytest

from fasta_sm.triton import compile_pool
from fasta_sm.triton.compile_pool import CompilePool
from fasta_sm.triton.worker import CompileJob, WorkerResult, do_nothing

JOIN_S = 5.0


class FakeExecutor:
    """ProcessPoolExecutor without processes. Executors made while `hold` is true keep every future
    running until the test ends it (as jobs handed to a worker: `shutdown(cancel_futures=True)`
    cannot cancel them); later ones finish each job at once (a compile: no error)."""

    made: list[FakeExecutor] = []
    hold = True

    def __init__(self, max_workers, mp_context=None, initializer=None, initargs=()):
        self.held = FakeExecutor.hold
        self.futures: list[tuple[object, Future]] = []
        self.shut = False
        FakeExecutor.made.append(self)

    def submit(self, fn, *args):
        if self.shut:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future: Future = Future()
        future.set_running_or_notify_cancel()
        self.futures.append((fn, future))
        if not self.held:
            future.set_result(None if fn is do_nothing else WorkerResult(None, 0.0))
        return future

    def shutdown(self, wait=True, *, cancel_futures=False):
        self.shut = True  # running futures are not cancelled; they end when their worker does

    def break_(self, fn=None):
        """A worker died: every job still in this executor (of `fn` only, if given) fails."""
        for function, future in self.futures:
            if not future.done() and (fn is None or function is fn):
                future.set_exception(BrokenProcessPool("A process in the process pool was terminated abruptly"))


@pytest.fixture
def fake_pool(monkeypatch):
    FakeExecutor.made, FakeExecutor.hold = [], True
    monkeypatch.setattr(compile_pool, "ProcessPoolExecutor", FakeExecutor)
    monkeypatch.setattr(compile_pool, "worker_context", lambda: multiprocessing.get_context("spawn"))  # its Pipe
    monkeypatch.setattr(compile_pool, "warm_triton_key", lambda: None)
    pool = CompilePool(2)
    yield pool
    pool.close()


def _eventually(condition, timeout=JOIN_S):
    event = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return True
        event.wait(0.01)
    return condition()


def _stale_start_fails_after_a_crash_replaced_its_executor(pool):
    """Thread S starts the pool (executor 1); thread A collects a compile started in executor 1. A worker
    of executor 1 dies: A's `restart` replaces the executor (executor 2, ready) and only then does S see
    its own start jobs fail. Returns (A's thread, its results); A is left just after
    `replace_executor`, so S's handling of its failure runs first."""
    starter = threading.Thread(target=pool._start_quietly, daemon=True)  # what start_in_background runs
    starter.start()
    assert _eventually(lambda: FakeExecutor.made and len(FakeExecutor.made[0].futures) == 2)
    first = FakeExecutor.made[0]
    job = CompileJob("kernels", "accumulate_kernel", (), {})
    started = pool.submit(job)  # a compile already in executor 1 (a guess the run takes over)
    FakeExecutor.hold = False  # executors from now on: workers that compile at once

    replaced, go_on = threading.Event(), threading.Event()
    replace = pool.replace_executor

    def replace_then_pause():
        replace()
        replaced.set()
        go_on.wait(JOIN_S)

    pool.replace_executor = replace_then_pause
    results: list = []
    runner = threading.Thread(
        target=lambda: results.extend(pool.run([job], started={0: started}, in_process=lambda i: (None, 0.0))),
        daemon=True,
    )
    runner.start()
    first.break_(compile_pool.compile_in_worker)  # the worker running A's compile died
    assert replaced.wait(JOIN_S)
    assert pool.ready and FakeExecutor.made[-1] is not first
    first.break_(do_nothing)  # the same death, as S's thread sees it now
    starter.join(JOIN_S)
    assert not starter.is_alive()
    go_on.set()
    return runner, results


def test_a_run_isolating_a_crash_ends_though_another_threads_start_failed_meanwhile(fake_pool):
    runner, results = _stale_start_fails_after_a_crash_replaced_its_executor(fake_pool)
    runner.join(JOIN_S)
    hung = runner.is_alive()
    fake_pool._ready.set()  # let a hung run end, not spin on after the test
    assert not hung, "the run hung: its suspect waits for a shared pool that nothing will start"
    assert results == [(0, None, 0.0)]


def test_a_start_whose_executor_was_replaced_leaves_the_new_one_alone(fake_pool, caplog):
    runner, _ = _stale_start_fails_after_a_crash_replaced_its_executor(fake_pool)
    runner.join(JOIN_S)
    ready = fake_pool.ready
    fake_pool._ready.set()  # let a hung run end
    assert ready and fake_pool._executor is FakeExecutor.made[1] and not FakeExecutor.made[1].shut
    assert fake_pool._failed_at is None and "the compile pool did not start" not in caplog.text


def test_a_run_isolating_a_crash_ends_though_another_thread_closed_the_pool(fake_pool):
    """As at exit: threading's atexit hook closes every pool while a non-daemon thread still tunes."""
    FakeExecutor.hold = False
    fake_pool.start()
    assert fake_pool.ready
    jobs = [CompileJob("kernels", "accumulate_kernel", (), {}) for _ in range(2)]
    run = compile_pool._Run(fake_pool, jobs, in_process=lambda i: (None, 0.0))
    run.restart([0, 1])  # a crash took both jobs down: two suspects, compiled one at a time
    fake_pool.close()  # another thread closes the shared pool (not the run's isolation pool)
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(run.drive()), daemon=True)
    runner.start()
    runner.join(JOIN_S)
    hung, suspects = runner.is_alive(), list(run.suspects)
    fake_pool._ready.set()  # let a hung run end, not spin on after the test
    runner.join(JOIN_S)
    run.stop()
    assert not hung, f"the run hung with suspects {suspects}: the shared pool, closed, is never ready again"
    assert sorted(results) == [(0, None, 0.0), (1, None, 0.0)]


def test_a_submit_racing_another_threads_replacement_goes_to_the_new_executor(fake_pool):
    FakeExecutor.hold = False
    fake_pool.start()
    get = fake_pool._get

    def get_then_replaced():
        got = get()
        fake_pool._get = get
        fake_pool.replace_executor()  # another thread, between this submit's `_get` and its submit
        return got

    fake_pool._get = get_then_replaced
    future = fake_pool.submit(CompileJob("kernels", "accumulate_kernel", (), {}))
    assert future.result() == WorkerResult(None, 0.0)
    assert not fake_pool.stale(future) and len(FakeExecutor.made) == 2


def test_a_suspect_whose_own_worker_was_closed_under_it_is_compiled_again_not_blamed(fake_pool):
    """As at exit: closing every pool closes a run's isolation pool too; the config alone in it did not crash."""
    FakeExecutor.hold = False
    fake_pool.start()
    run = compile_pool._Run(fake_pool, [CompileJob("kernels", "accumulate_kernel", (), {})], in_process=None)
    run.restart([0])
    FakeExecutor.hold = True
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(run.drive()), daemon=True)
    runner.start()
    assert _eventually(lambda: run.isolated is not None)
    isolation = FakeExecutor.made[-1]
    FakeExecutor.hold = False
    run.isolation.close()
    isolation.break_()
    runner.join(JOIN_S)
    run.stop()
    assert not runner.is_alive()
    assert results == [(0, None, 0.0)]


def _child_exit_code(target, hold=None) -> int | None:
    """Run `target` in a child forked while a thread of this process holds `hold` (if given); its exit code, or None
    if it has not ended within `JOIN_S` (killed then)."""
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with hold:
            held.set()
            release.wait(JOIN_S * 3)

    thread = threading.Thread(target=holder)
    if hold is not None:
        thread.start()
        assert held.wait(JOIN_S)
    child = multiprocessing.get_context("fork").Process(target=target)
    child.start()
    child.join(JOIN_S)
    code = child.exitcode
    if child.is_alive():
        child.kill()
        child.join()
    release.set()
    if hold is not None:
        thread.join()
    return code


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_while_a_thread_held_the_pools_lock_exits(fake_pool):
    """A data loader forked while a guess was being submitted (`try_submit` holds the lock) closes every pool at
    its exit (`_close_every_pool`, a threading atexit hook): it must not wait for a lock no thread of it holds."""
    pool = CompilePool(2)
    pool._get()
    try:
        assert _child_exit_code(lambda: None, hold=pool._lock) == 0
    finally:
        pool.close()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_from_a_process_with_a_pool_up_starts_its_own(fake_pool):
    """The parent's executor has no manager thread nor workers in a child: a job handed to it would never end."""
    FakeExecutor.hold = False
    pool = CompilePool(2)
    pool.start()
    before = pool.submit(CompileJob("kernels", "k", (), {}))

    def child() -> None:
        fresh = not pool.ready and pool.stale(before)
        pool.start()
        os._exit(0 if fresh and pool._executor is not FakeExecutor.made[0] else 1)

    try:
        assert _child_exit_code(child) == 0
    finally:
        pool.close()
