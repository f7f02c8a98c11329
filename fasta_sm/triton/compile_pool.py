"""Parallel compilation: worker processes fill Triton's on-disk cache, the parent loads.

Compiling one config of a large matmul takes seconds of CPU in LLVM and ptxas;
a tune that compiles its batch one config at a time spends most of its wall
time there. The pool's workers (`fork_server`) each compile one job at a
time (`worker`); the parent's first launch of a config they compiled then
loads it from disk in milliseconds. While the pool starts, a few threads of
the tuning process compile instead, and a run that loses a worker to a crash
isolates the config that caused it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import util as multiprocessing_util
from multiprocessing.connection import Connection
from queue import Empty, SimpleQueue

from ..env import env_switch, env_value
from ..env_numbers import whole_from_env
from .cores import usable_cores
from .fork_server import preload_modules, worker_context
from .worker import CompileJob, compile_in_worker, describe_error, do_nothing, init_worker, warm_triton_key

logger = logging.getLogger("fasta_sm.triton.compile_pool")

LOCAL_THREADS = (2, 8)
"""Threads that compile in this process while the pool starts: the first count, then the second once
`SLOW_POOL_S` have passed. Triton's front end holds the GIL, so each thread added slows the others'
compiles; a pool that starts in about a second should find few of them to wait for, and one that
fails to start leaves the work to eight (Triton releases the GIL in LLVM and ptxas)."""
SLOW_POOL_S = 2.0
START_RETRY_S = 10.0
"""A pool that failed to start is tried again by a compile this long after, not before (nor on every step)."""
POLL_S = 0.01


def pool_size() -> int:
    """Workers to spawn: FASTA_COMPILE_WORKERS, else the usable cores (`usable_cores`) less two (the parent times)."""
    configured = env_value("FASTA_COMPILE_WORKERS")
    if configured is not None:
        return whole_from_env("FASTA_COMPILE_WORKERS", configured, 1)
    return _default_pool_size()


@functools.cache
def _default_pool_size() -> int:
    """Read at decoration (`check_settings`) and kept: reading /proc and the cgroup's files again took half a
    millisecond of a warm start's first launch on the H200."""
    return max(1, usable_cores() - 2)


def check_settings() -> None:
    """Read every compile setting of the environment now (FASTA_COMPILE_WORKERS, FASTA_WORKER_TORCH,
    FASTA_PREWARM), so that a misspelt one is an error when a kernel is decorated, under Triton's
    interpreter too, which uses none of them: a dry run on CPU catches what would break the GPU run."""
    pool_size()
    preload_modules()
    env_switch("FASTA_PREWARM", default=True)


_warned: set[tuple[str, str]] = set()


def _warn_once(topic: str, key: str, message: str, *args: object) -> None:
    """Log `message` the first time `topic` comes up for `key` (a kernel, a module) in this process."""
    if (topic, key) in _warned:
        return
    _warned.add((topic, key))
    logger.warning(message, *args)


def _warn_unavailable(job: CompileJob, error: str | None) -> None:
    """Say once per kernel that the workers could not compile it, so it compiles in this process."""
    _warn_once("unavailable", f"{job.module}.{job.qualname}",
               "compile workers could not compile %s.%s (%s); compiling it in this process instead",
               job.module, job.qualname, error)


def _warn_torch_in_workers(module: str) -> None:
    """Say once per kernel module that it makes every compile worker import torch, and how to avoid it."""
    _warn_once(
        "torch", module,
        "%s uses torch when imported, so each compile worker imports torch (seconds) before its first "
        "compile; set FASTA_WORKER_TORCH=1 before the first kernel is decorated to import it once, "
        "in the workers' fork server",
        module,
    )


def _submit_watched(executor: ProcessPoolExecutor, job: CompileJob) -> Future:
    """`executor.submit(compile_in_worker, job)`, with every worker it forks watched from the start.

    The executor forks a worker at a submit that finds none idle, after that
    submit has woken its manager thread, which may rebuild the list of
    workers it waits on before the new one is in it (seen on CPython 3.11.7,
    3.12.1 and 3.13.0, not 3.10.13 or 3.11.2, whose manager cleared that
    wake-up under the lock the submit holds). Such a worker's death would go
    unseen until another job ended or was submitted, its jobs pending
    meanwhile; waking the thread once more, after the new worker is listed,
    has it watch that worker too. Forking every worker up front would do the
    same but delays the pool's readiness by all the forks.
    """
    workers = getattr(executor, "_processes", None)
    before = len(workers) if workers is not None else 0
    future = executor.submit(compile_in_worker, job)
    wakeup = getattr(executor, "_executor_manager_thread_wakeup", None)
    if workers is not None and len(workers) != before and wakeup is not None:
        wakeup.wakeup()
    return future


class CompilePool:
    """A lazily started pool of compile workers.

    Every executor it creates has a generation number, stamped on the
    futures it returns: a future from an executor since replaced (after a
    worker crash, or `close`) is work to redo, not a new crash.
    """

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or pool_size()
        self._executor: ProcessPoolExecutor | None = None
        self._alive: tuple[Connection, Connection] | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._starting = False
        self._asked_at: float | None = None  # when a start was first asked for: how long compiles have waited
        self._failed_at: float | None = None
        self._generation = 0
        _POOLS.add(self)

    def _get(self) -> tuple[ProcessPoolExecutor, int]:
        """The executor, started if need be, and its generation, read together under the lock."""
        with self._lock:
            if self._executor is None:
                warm_triton_key()
                context = worker_context()
                self._alive = context.Pipe(duplex=False)
                self._generation += 1
                self._executor = ProcessPoolExecutor(
                    max_workers=self.workers,
                    mp_context=context,
                    initializer=init_worker,
                    initargs=(self._alive[0], dict(os.environ)),
                )
                _close_before_children_are_joined()
            return self._executor, self._generation

    def _reset(self, generation: int | None = None) -> bool:
        """Drop the executor, or only that of `generation` when given (a newer one is another's); whether
        it did."""
        with self._lock:
            if generation is not None and generation != self._generation:
                return False
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None
                self._generation += 1  # its futures are stale from now on: work to redo, not a crash
            self._close_pipe()
            self._ready.clear()
            self._starting = False
            self._asked_at = self._failed_at = None
        return True

    def replace_executor(self) -> None:
        """A fresh executor after a crash; its workers start on demand, so it counts as ready."""
        self._reset()
        self._get()
        self._ready.set()

    def _forget_in_child(self) -> None:
        """In a child forked from this process: drop the parent's executor, whose manager thread and workers the
        child does not have (its jobs would never end, and shutting it down takes locks a parent's thread may have
        held at the fork), and take fresh locks; the child's next compile starts a pool of its own."""
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._executor = None
        self._close_pipe()
        self._generation += 1  # futures made before the fork (guesses, a run's jobs) are stale here
        self._starting = False
        self._asked_at = self._failed_at = None

    def _close_pipe(self) -> None:
        if self._alive is not None:
            for end in self._alive:
                end.close()
            self._alive = None

    @property
    def ready(self) -> bool:
        """Whether every worker has started (see `start`)."""
        return self._ready.is_set()

    def start(self) -> None:
        """Start the workers now rather than at the first compile.

        Raises what stopped them, the executor dropped, unless another
        thread replaced it meanwhile (a crash a run saw, or `close`): that,
        not this start, is what failed, and the successor stays.
        """
        generation = None
        try:
            executor, generation = self._get()
            for future in [executor.submit(do_nothing) for _ in range(self.workers)]:
                future.result()
        except Exception:
            if self._reset(generation):
                raise
            return
        with self._lock:
            if generation == self._generation and self._executor is executor:
                self._ready.set()

    def start_in_background(self) -> None:
        """`start` in a daemon thread, once (again `START_RETRY_S` after a failure): the caller compiles in
        process meanwhile."""
        with self._lock:
            now = time.perf_counter()
            if self._starting or (self._failed_at is not None and now - self._failed_at < START_RETRY_S):
                return
            self._starting = True
            if self._asked_at is None:
                self._asked_at = now
        threading.Thread(target=self._start_quietly, name="fasta-compile-pool-start", daemon=True).start()

    def waiting_s(self) -> float:
        """Seconds since this pool's start was first asked for (0 when it is ready or was never asked)."""
        asked = self._asked_at
        return 0.0 if asked is None or self.ready else time.perf_counter() - asked

    def _start_quietly(self) -> None:
        try:
            self.start()
        except Exception as error:  # noqa: BLE001  the caller compiles in process; a later compile tries again
            logger.warning("the compile pool did not start: %s", describe_error(error))
            with self._lock:
                self._starting = False
                self._failed_at = time.perf_counter()

    def submit(self, job: CompileJob) -> Future:
        """Start one job now; hand its future to `run` later to collect it.

        Raises what `ProcessPoolExecutor.submit` raises on a broken or closed
        executor; `run` handles that as a crash.
        """
        while True:
            executor, generation = self._get()
            try:
                future = _submit_watched(executor, job)
            except (BrokenProcessPool, RuntimeError):
                if generation == self._generation:
                    raise
                continue  # another thread replaced the executor between the two lines: submit to its successor
            future.fasta_generation = generation  # type: ignore[attr-defined]
            return future

    def try_submit(self, job: CompileJob) -> Future | None:
        """Start a guess if the pool is ready, else None; never starts a pool.

        Guesses run from their own threads: one must not bring a closed pool
        back to life (`submit` would). The suspects of a crash compile in a
        worker of their own (`_Run`), so guesses need not wait for them.
        """
        with self._lock:
            if not self._ready.is_set() or self._executor is None:
                return None
            future = _submit_watched(self._executor, job)
            future.fasta_generation = self._generation  # type: ignore[attr-defined]
            return future

    def stale(self, future: Future) -> bool:
        """Whether `future` came from an executor this pool has since replaced."""
        return getattr(future, "fasta_generation", self._generation) != self._generation

    def run(
        self,
        jobs: Sequence[CompileJob],
        started: Mapping[int, Future] | None = None,
        in_process: Callable[[int], tuple[str | None, float]] | None = None,
        detach: Callable[[int, Future], None] | None = None,
    ) -> Iterator[tuple[int, str | None, float]]:
        """Yield (position, error, seconds) as each job finishes, in completion order; each position once.

        With `detach`, the run ends as soon as any job has finished: it
        yields every job finished by then (and those this process was
        compiling, once they end) and hands each job still in a worker, or
        still queued (submitted to the pool if it is up, else dropped), to
        `detach(position, future)`, to be collected later (as `started`). A
        run isolating a crash goes on to the end.

        `started` maps positions to futures of jobs already submitted (a
        prefetch), which are awaited instead of submitted again; one that was
        cancelled or belongs to a replaced executor is simply done again.

        `in_process(position)`, when given, compiles a job in this process.
        Until the workers are up (a cold pool takes a second or more to start:
        the fork server imports Triton), threads here take jobs from the same queue, so
        a tune's first batch does not wait for the pool; once it is ready,
        they stop taking jobs and the pool takes the rest. A compiler crash
        in process is not isolated: it ends the process, as it would under
        `triton.autotune`, which compiles every config in process.

        If a worker dies (a compiler segfault), it takes every job in flight
        down with it; those are run again one at a time in a worker of this
        run's own, which no other run or guess shares, so the one that kills
        that worker is the one that fails.
        """
        state = _Run(self, jobs, in_process, detach)
        started = dict(started or {})
        for index in range(len(jobs)):
            future = started.get(index)
            if future is None or future.cancelled() or self.stale(future):
                state.queue.append(index)
            else:
                state.in_flight[future] = index
        try:
            yield from state.drive()
        finally:
            state.stop()

    def close(self) -> None:
        self._reset()


class _Run:
    """One `CompilePool.run`: a queue shared by the pool and, while it starts, threads of this process."""

    def __init__(
        self,
        pool: CompilePool,
        jobs: Sequence[CompileJob],
        in_process: Callable[[int], tuple[str | None, float]] | None,
        detach: Callable[[int, Future], None] | None = None,
    ) -> None:
        self.pool, self.jobs, self.in_process, self.detach = pool, jobs, in_process, detach
        self.queue: deque[int] = deque()
        self.lock = threading.Lock()
        self.done_here: SimpleQueue[tuple[int, str | None, float]] = SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.in_flight: dict[Future, int] = {}
        self.suspects: deque[int] = deque()
        self.isolated: Future | None = None
        self.isolation: CompilePool | None = None  # one worker of this run's own, for the suspects of a crash
        self.raised: Exception | None = None
        self.start_asked = False

    def requeue(self, index: int) -> None:
        with self.lock:
            if index in self.queue:
                return
            self.queue.append(index)

    def take(self) -> int | None:
        with self.lock:
            return self.queue.popleft() if self.queue else None

    def compile_here(self) -> None:
        """A thread's share of the queue. `in_process` reports a config's own failures as data; anything
        it raises is not the config's fault, and is raised again in the caller's thread (`drive`)."""
        while not self.pool.ready and self.raised is None and (index := self.take()) is not None:
            try:
                self.done_here.put((index, *self.in_process(index)))
            except Exception as error:  # noqa: BLE001  handed to the caller's thread
                self.raised = error

    def local_threads(self) -> None:
        """While the pool is not ready, keep threads of this process on the queue (more once it is slow)."""
        if self.in_process is None or self.pool.ready or not self.queue:
            return
        if not self.start_asked:  # once per run; the pool itself waits `START_RETRY_S` after a failure
            self.start_asked = True
            self.pool.start_in_background()
        first, slow = LOCAL_THREADS
        wanted = slow if self.pool.waiting_s() > SLOW_POOL_S else first
        alive = sum(thread.is_alive() for thread in self.threads)
        for _ in range(min(wanted - alive, len(self.queue))):
            thread = threading.Thread(target=self.compile_here, name="fasta-compile", daemon=True)
            thread.start()
            self.threads.append(thread)

    def busy(self) -> bool:
        return bool(
            self.queue
            or self.suspects
            or self.in_flight
            or any(t.is_alive() for t in self.threads)
            or not self.done_here.empty()
        )

    def feed_pool(self) -> None:
        """Hand queued jobs to idle workers (suspects one at a time, alone).

        Suspects go to this run's own worker whether the shared pool is ready
        or not: they are not in the queue that would start it again, and
        another thread may have closed it since the crash.
        """
        if self.isolated is not None:
            return
        try:
            if self.suspects and not self.in_flight:
                if self.isolation is None:
                    self.isolation = CompilePool(1)
                self.isolated = self.isolation.submit(self.jobs[self.suspects[0]])
                self.in_flight[self.isolated] = self.suspects.popleft()
            if self.in_process is not None and not self.pool.ready:
                return
            while not self.suspects and len(self.in_flight) < self.pool.workers and (index := self.take()) is not None:
                try:
                    self.in_flight[self.pool.submit(self.jobs[index])] = index
                except BaseException:
                    self.requeue(index)
                    raise
        except (BrokenProcessPool, RuntimeError) as error:  # the executor broke (or closed) between two jobs
            if "interpreter shutdown" in str(error):  # no executor takes work now: a fresh one would not either
                raise
            self.restart([])

    def drive(self) -> Iterator[tuple[int, str | None, float]]:
        yielded = False
        while self.busy():
            if self.raised is not None:
                raise self.raised
            if yielded and self.detach is not None and not self.suspects and self.isolated is None:
                yield from self.end_early()
                return
            self.local_threads()
            self.feed_pool()
            while not self.done_here.empty():
                yielded = True
                yield self.done_here.get()
            if not self.in_flight:
                with contextlib.suppress(Empty):
                    found = self.done_here.get(timeout=POLL_S)
                    yielded = True
                    yield found
                continue
            finished, _ = wait(self.in_flight, timeout=POLL_S, return_when=FIRST_COMPLETED)
            lost, broken = [], False
            for future in finished:
                index = self.in_flight.pop(future)
                alone = future is self.isolated
                if alone:
                    self.isolated = None
                try:
                    result = future.result()
                except CancelledError:
                    self.requeue(index)
                    continue
                except BrokenProcessPool:
                    if alone:  # its own worker, which nothing else used
                        assert self.isolation is not None
                        if self.isolation.stale(future):  # closed under it (at exit): no verdict, ask again
                            self.suspects.appendleft(index)
                            continue
                        self.isolation.close()  # this config killed it; the next suspect gets a fresh worker
                        yielded = True
                        yield index, "BrokenProcessPool: the compile worker died compiling it, alone", 0.0
                        continue
                    if self.pool.stale(future):  # an executor already replaced: not a new crash
                        self.requeue(index)
                        continue
                    broken = True
                    lost.append(index)
                    continue
                if result.loaded_torch:
                    _warn_torch_in_workers(self.jobs[index].module)
                if result.unavailable and self.in_process is not None:
                    _warn_unavailable(self.jobs[index], result.error)
                    yielded = True
                    yield index, *self.in_process(index)
                    continue
                yielded = True
                yield index, result.error, result.seconds
            if broken:
                self.restart(lost)
        if self.raised is not None:
            raise self.raised

    def end_early(self) -> Iterator[tuple[int, str | None, float]]:
        """Stop a detaching run: what this process is compiling ends here, the workers' jobs go on.

        Jobs not started yet go to the pool too when it is up (its executor
        queues them); while it starts they are dropped, for the caller to ask again.
        """
        with self.lock:
            queued = list(self.queue)
            self.queue.clear()
        for thread in self.threads:
            thread.join()
        while not self.done_here.empty():
            yield self.done_here.get()
        if self.raised is not None:
            raise self.raised
        in_flight, self.in_flight = self.in_flight, {}
        if self.pool.ready:
            for index in queued:
                try:
                    in_flight[self.pool.submit(self.jobs[index])] = index
                except (BrokenProcessPool, RuntimeError):  # a broken or closed executor: the next run redoes them
                    break
        for future, index in in_flight.items():
            self.detach(index, future)

    def restart(self, lost: list[int]) -> None:
        """A dead worker breaks the whole executor: every job still in it is lost too (one that already
        finished is not: its result is kept, to be collected)."""
        finished = {f: i for f, i in self.in_flight.items() if f.done() and not f.cancelled() and not f.exception()}
        lost.extend(i for f, i in self.in_flight.items() if f not in finished)
        self.in_flight = finished
        self.isolated = None
        logger.warning("a compile worker died; %d configs are compiled again, one at a time", len(lost))
        self.pool.replace_executor()
        self.suspects.extend(sorted(lost))

    def stop(self) -> None:
        """Leave no thread compiling behind this run (it may end early: an error, or a closed generator)."""
        with self.lock:
            self.queue.clear()
        for thread in self.threads:
            thread.join()
        if self.isolation is not None:
            self.isolation.close()


_POOLS: weakref.WeakSet[CompilePool] = weakref.WeakSet()


def _close_pipes_in_child() -> None:
    """A child forked from the tuning process must not hold the pipe that tells workers it is alive, nor a lock
    another thread of the parent held at the fork (no thread of the child would ever release it), nor the parent's
    executor (`CompilePool._forget_in_child`)."""
    global _shared_lock
    _shared_lock = threading.Lock()
    for pool in list(_POOLS):
        pool._forget_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_pipes_in_child)


_shared: CompilePool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> CompilePool:
    """One pool per process, shared by every tune, closed at exit (two threads' first tunes make one)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = CompilePool()
        return _shared


def _close_every_pool() -> None:
    for pool in list(_POOLS):
        pool.close()


def _close_at_exit(close: Callable[[], None]) -> None:
    """Run `close` at exit before `concurrent.futures` joins its executors.

    That join waits for every job still running, and at exit those are
    guesses no tune will ask for: a matmul's take seconds. Closing the pool
    first ends its workers (they watch the pipe `close` shuts). The hook is
    private to `threading`; where it is missing, `atexit` runs the close
    after the join instead.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(close)
            return
        except RuntimeError:  # the interpreter is already shutting down
            pass
    atexit.register(close)


_close_at_exit(_close_every_pool)  # every pool, the shared one and those a caller made

_closes_before_join_in: int | None = None


def _close_before_children_are_joined() -> None:
    """Close every pool before multiprocessing joins this process's children, once per process.

    A process that is itself a multiprocessing child (a rank of
    `torch.multiprocessing.spawn`, a spawn or fork `Process` that tunes)
    joins its children, the compile workers among them, as its target
    returns, and only then runs the threading exit hooks (`_close_at_exit`):
    its workers, which end when the pool closes, would be waited for forever.
    multiprocessing runs its finalizers of priority 0 or more before that
    join (in the main process too, after the threading hooks, where this
    finds the pools closed). A forked child loses the parent's finalizers,
    hence once per process id, at the first executor.
    """
    global _closes_before_join_in
    if _closes_before_join_in != os.getpid():
        _closes_before_join_in = os.getpid()
        multiprocessing_util.Finalize(None, _close_every_pool, exitpriority=10)
