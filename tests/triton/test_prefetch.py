"""Guesses: idle compile workers kept busy on the configs the policy ranks next."""

from __future__ import annotations

import time
from concurrent.futures import Future

from fasta_sm.triton.prefetch import Prefetcher
from fasta_sm.triton.worker import CompileJob


class RecordingPool:
    """A ready pool of six workers that only records what is submitted (futures left pending)."""

    workers = 6

    def __init__(self, ready=True):
        self.ready = ready
        self.submitted: list[tuple[CompileJob, Future]] = []

    def try_submit(self, job):
        self.submitted.append((job, Future()))
        return self.submitted[-1][1]

    def names(self):
        return [job.qualname for job, _ in self.submitted]


def eventually(check, timeout=5.0):
    """Wait for a guess started from another thread."""
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


def ranked(*names):
    return [(name, CompileJob("kernels", name, (), {})) for name in names]


def test_guesses_take_only_idle_workers_and_leave_some_free():
    pool = RecordingPool()
    Prefetcher(pool).offer(ranked(*"abcdefgh"))
    assert pool.names() == ["a", "b", "c"], "6 workers, 3 left free, best first"


def test_guesses_leave_room_for_the_batch_about_to_compile():
    pool = RecordingPool()
    Prefetcher(pool).offer(ranked(*"abcdefgh"), reserve=5)
    assert pool.names() == ["a"]


def test_certain_work_takes_every_idle_worker_the_guesses_after_it_leave_some_free():
    pool = RecordingPool()
    Prefetcher(pool).offer(ranked(*"abcdefgh"), certain=2)
    assert pool.names() == ["a", "b", "c"], "2 certain, then guesses until 3 workers are left"
    pool = RecordingPool()
    Prefetcher(pool).offer(ranked(*"abcdefgh"), certain=5)
    assert pool.names() == ["a", "b", "c", "d", "e"]


def test_each_released_compile_of_the_chunk_frees_a_worker_for_certain_work():
    pool = RecordingPool()
    prefetcher = Prefetcher(pool)
    prefetcher.offer(ranked(*"abcdefgh"), reserve=8, certain=8)
    assert pool.names() == []
    for _ in range(3):
        prefetcher.release()
    assert pool.names() == ["a"], "8 reserved, 3 released: 5 of 6 workers still busy with the chunk"
    prefetcher.release()
    assert pool.names() == ["a", "b"]


def test_a_config_taken_by_its_compile_is_never_started_again_from_the_list():
    pool = RecordingPool()
    prefetcher = Prefetcher(pool)
    prefetcher.offer(ranked(*"abcdefgh"), reserve=6, certain=8)
    assert pool.names() == []
    for key in "abcd":  # the next chunk compiles these itself
        assert prefetcher.take(key) is None
    for _ in range(6):
        prefetcher.release()
    assert pool.names() == ["e", "f", "g", "h"]


def test_a_release_with_nothing_reserved_starts_no_guess_past_the_spare_workers():
    pool = RecordingPool()
    prefetcher = Prefetcher(pool)
    prefetcher.offer(ranked(*"abcdefgh"))
    prefetcher.release()
    assert pool.names() == ["a", "b", "c"]


def test_a_finished_guess_hands_its_worker_the_next_one_without_a_new_offer():
    pool = RecordingPool()
    Prefetcher(pool).offer(ranked(*"abcdefgh"))
    pool.submitted[0][1].set_result((None, 0.5))
    assert eventually(lambda: pool.names() == ["a", "b", "c", "d"]), pool.names()


def test_a_new_offer_replaces_the_list_and_never_guesses_a_config_twice():
    pool = RecordingPool()
    prefetcher = Prefetcher(pool)
    prefetcher.offer(ranked(*"abcdefgh"))
    prefetcher.offer(ranked("b", "x", "y"))
    assert pool.names() == ["a", "b", "c"], "every room is busy"
    pool.submitted[0][1].set_result((None, 0.5))
    pool.submitted[1][1].set_result((None, 0.5))
    assert eventually(lambda: pool.names() == ["a", "b", "c", "x", "y"]), pool.names()


def test_a_taken_guess_is_handed_over_once():
    pool = RecordingPool()
    prefetcher = Prefetcher(pool)
    prefetcher.offer(ranked("a"))
    assert prefetcher.take("a") is pool.submitted[0][1]
    assert prefetcher.take("a") is None


def test_after_cancel_no_guess_starts_and_those_waiting_are_dropped():
    pool = RecordingPool()
    prefetcher = Prefetcher(pool)
    prefetcher.offer(ranked(*"abcdefgh"))
    running, waiting = pool.submitted[0][1], pool.submitted[1][1]
    running.set_running_or_notify_cancel()
    prefetcher.cancel()
    running.set_result((None, 0.5))
    assert waiting.cancelled() and not running.cancelled()
    assert not eventually(lambda: len(pool.submitted) > 3, timeout=0.3)


def test_no_guess_starts_while_the_pool_is_starting():
    pool = RecordingPool(ready=False)
    Prefetcher(pool).offer(ranked(*"abc"))
    assert pool.submitted == []


def test_a_guess_lost_with_a_dead_worker_starts_no_other():
    from concurrent.futures.process import BrokenProcessPool

    pool = RecordingPool()
    Prefetcher(pool).offer(ranked(*"abcdefgh"))
    pool.submitted[0][1].set_exception(BrokenProcessPool("a worker died"))
    assert not eventually(lambda: len(pool.submitted) > 3, timeout=0.3)


def test_a_pool_that_refuses_a_guess_ends_the_guessing_quietly():
    class ClosedPool(RecordingPool):
        def try_submit(self, job):
            raise RuntimeError("cannot schedule new futures after shutdown")

    prefetcher = Prefetcher(ClosedPool())
    prefetcher.offer(ranked(*"abc"))
    assert prefetcher.take("a") is None


def test_with_real_workers_each_finished_guess_starts_the_next_until_the_list_is_done():
    """Through a real pool: results arrive on the executor's thread, and the chain never stalls."""
    from fasta_sm.triton.compile_pool import CompilePool

    pool = CompilePool(3)
    try:
        pool.start()
        prefetcher = Prefetcher(pool)
        prefetcher.offer([(str(i), CompileJob("kernels", "no_such_kernel", (), {})) for i in range(6)])
        assert eventually(lambda: len(prefetcher._started) == 6, timeout=60), sorted(prefetcher._started)
        outcomes = [prefetcher.take(str(i)).result(timeout=60) for i in range(6)]
    finally:
        pool.close()
    assert all(outcome.error.startswith("AttributeError") for outcome in outcomes)


def test_a_guess_never_brings_a_closed_pool_back():
    from fasta_sm.triton.compile_pool import CompilePool

    pool = CompilePool(2)
    pool.start()
    pool.close()
    assert pool.try_submit(CompileJob("kernels", "no_such_kernel", (), {})) is None
    assert pool._executor is None


def test_a_suspect_of_a_crash_compiles_in_a_worker_no_other_job_can_take_down():
    """Another run's crasher (or a guess) in the shared pool while a suspect is compiled alone: the suspect
    is not blamed for it."""
    import threading

    from fasta_sm.triton.compile_pool import CompilePool, _Run

    pool = CompilePool(2)
    try:
        pool.start()
        run = _Run(pool, [CompileJob("kernels", "slow_kernel", (), {"SECONDS": 3.0})], None)
        run.restart([0])  # job 0 is now a suspect: it compiles alone
        pool.start()  # every worker of the shared pool up, so that the crash below is seen at once
        results = []
        driving = threading.Thread(target=lambda: results.extend(run.drive()))
        driving.start()
        time.sleep(1.0)
        pool.submit(CompileJob("kernels", "crash_kernel", (), {}))  # kills a worker of the shared pool
        driving.join(timeout=120)
        run.stop()
    finally:
        pool.close()
    assert [(index, error.split(":")[0]) for index, error, _ in results] == [(0, "OutOfResources")]


def test_an_adopted_compile_takes_the_worker_reserved_for_it_and_is_handed_over_once():
    pool = RecordingPool()
    pool.workers = 14
    prefetcher = Prefetcher(pool)
    prefetcher.offer(ranked(*"abcdef"), reserve=12)  # 14 workers, 12 kept for the batch: 2 guesses
    assert pool.names() == ["a", "b"]
    running = Future()
    prefetcher.adopt("z", running)  # z runs on one of the 12 kept for the batch
    pool.submitted[0][1].set_result(None)  # guess a ends: its worker is free again
    assert eventually(lambda: pool.names() == ["a", "b", "c"])
    assert prefetcher.take("z") is running and prefetcher.take("z") is None
