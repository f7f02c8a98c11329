"""Parallel compilation: worker processes fill Triton's on-disk cache, the parent loads.

Compiling one config of a large matmul takes seconds of CPU in LLVM and ptxas;
a tune that compiles its batch one config at a time spends most of its wall
time there. Workers are never forked from the parent (it holds a CUDA
context): they fork from a fork server that imported torch and Triton once,
so starting fourteen of them costs one import, not fourteen (spawn where the
platform has no fork server). They compile through the kernel's own
`JITFunction.warmup`, with tensors replaced by their dtypes, so the binary
lands in the cache under the very key the parent's launch computes; the
parent's first launch of that config then loads it from disk in milliseconds.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import Connection
from queue import Empty, SimpleQueue
from typing import Any

logger = logging.getLogger("fasta_sm.triton.compile_pool")

_ERROR_CHARS = 400
PRELOAD = ("torch", "triton", "fasta_sm.triton.worker_preload")
"""Imported once by the fork server, inherited by every worker it forks."""
LOCAL_THREADS = 8
"""Threads that compile in this process while the pool starts (Triton releases the GIL in LLVM and ptxas)."""
POLL_S = 0.01
PREFETCH_SPARE = 4
"""Workers a prefetch leaves free, so that the next batch's own compiles never queue behind guesses."""


def describe_error(error: BaseException) -> str:
    """`Type: first line of the message`, short enough for a state file or a table."""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}"[:_ERROR_CHARS]


def pool_size() -> int:
    """Workers to spawn: FASTA_COMPILE_WORKERS, else the usable cores less two (the parent times)."""
    configured = os.environ.get("FASTA_COMPILE_WORKERS")
    if configured:
        return max(1, int(configured))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores - 2)


def unwrap_jit(obj: Any) -> Any:
    """The JITFunction under autotuner/heuristics wrappers (each keeps the next in `.fn`)."""
    from triton.runtime.jit import JITFunction

    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):
        obj = obj.fn
    return obj


def resolve(module: str, qualname: str) -> Any:
    """Import a kernel by module path, as a worker must."""
    if module == "__main__" and "__mp_main__" in sys.modules:
        mod = sys.modules["__mp_main__"]
    else:
        mod = importlib.import_module(module)
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return unwrap_jit(obj)


@dataclass(frozen=True)
class CompileJob:
    """What a worker needs to compile one config: no tensors, no CUDA objects."""

    module: str
    qualname: str
    args: tuple
    kwargs: dict[str, Any]


def _exit_with_parent(alive: Connection) -> None:
    """Block on a pipe only the tuning process writes to; its end of file means that process died."""
    try:
        alive.recv()
    except (EOFError, OSError):
        pass
    os._exit(0)


def _init_worker(alive: Connection) -> None:
    """Make the worker die with the tuning process, then warm it.

    A tune killed with SIGKILL must not leave its workers behind: they would
    hold a CUDA context each, and the pipes of whoever waits on the process.
    The worker's parent is the fork server, which lives as long as any worker
    does, so the worker watches the tuning process itself, through `alive`.
    """
    threading.Thread(target=_exit_with_parent, args=(alive,), daemon=True).start()
    _warm_worker()


def _warm_worker() -> None:
    """Import torch and Triton and pick the target, so that this is not charged to the first config.

    A worker only compiles, so it answers Triton's request for the current
    stream (made on every `run`, warm-ups included) with the null stream:
    the real request creates a CUDA context, which on an H200 took 1.2-1.5 s
    of each worker's first compile and holds device memory for nothing.
    """
    try:
        import torch  # noqa: F401
        from triton.runtime import driver

        driver.active.get_current_target()
        driver.active.get_current_stream = _null_stream
    except Exception:  # no driver (CPU): each job reports its own error
        pass


def _null_stream(device: Any = None) -> int:
    return 0


def warm_triton_key() -> None:
    """Compute Triton's cache-key prefix (a hash of its library, cached per process) now, off the critical path."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:  # Triton before 3.2 kept it in the compiler
        try:
            from triton.compiler.compiler import triton_key
        except ImportError:
            return
    try:
        triton_key()
    except Exception as error:  # noqa: BLE001  the compile that needs it will raise it properly
        logger.debug("triton_key() failed ahead of time: %s", error)


def _compile_in_worker(job: CompileJob) -> tuple[str | None, float]:
    start = time.perf_counter()
    try:
        fn = resolve(job.module, job.qualname)
        fn.warmup(*job.args, grid=(1,), **job.kwargs)
    except Exception as error:  # every compiler failure is data, not a crash
        return describe_error(error), time.perf_counter() - start
    return None, time.perf_counter() - start


def worker_context() -> multiprocessing.context.BaseContext:
    """A fork server that has imported torch and Triton, else spawn: never a fork of this process."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


class CompilePool:
    """A lazily started pool of compile workers; a worker that dies takes only its batch's retry with it."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or pool_size()
        self._executor: ProcessPoolExecutor | None = None
        self._alive: tuple[Connection, Connection] | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._starting = False

    def _get(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                threading.Thread(target=warm_triton_key, name="fasta-triton-key", daemon=True).start()
                context = worker_context()
                self._alive = context.Pipe(duplex=False)
                self._executor = ProcessPoolExecutor(
                    max_workers=self.workers, mp_context=context, initializer=_init_worker, initargs=(self._alive[0],)
                )
            return self._executor

    def _reset(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None
            if self._alive is not None:
                for end in self._alive:
                    end.close()
                self._alive = None
            self._ready.clear()
            self._starting = False

    @property
    def ready(self) -> bool:
        """Whether every worker has started and warmed (see `start`)."""
        return self._ready.is_set()

    def start(self) -> None:
        """Spawn and warm the workers now rather than at the first compile."""
        executor = self._get()
        for future in [executor.submit(_warm_worker) for _ in range(self.workers)]:
            future.result()
        self._ready.set()

    def start_in_background(self) -> None:
        """`start` in a daemon thread, once: the caller compiles in process meanwhile."""
        with self._lock:
            if self._starting:
                return
            self._starting = True
        threading.Thread(target=self.start, name="fasta-compile-pool-start", daemon=True).start()

    def submit(self, job: CompileJob) -> Future:
        """Start one job now; hand its future to `run` later to collect it."""
        return self._get().submit(_compile_in_worker, job)

    def run(
        self,
        jobs: Sequence[CompileJob],
        started: Mapping[int, Future] | None = None,
        in_process: Callable[[int], tuple[str | None, float]] | None = None,
    ) -> Iterator[tuple[int, str | None, float]]:
        """Yield (position, error, seconds) as each job finishes, in completion order.

        `started` maps positions to futures of jobs already submitted (a
        prefetch), which are awaited instead of submitted again.

        `in_process(position)`, when given, compiles a job in this process.
        Until the workers are up (a cold pool takes seconds to start: the fork
        server imports torch), threads here take jobs from the same queue as
        the pool, so a tune's first batch does not wait for the pool; once it
        is ready, the pool takes the rest as its workers free up.

        If a worker dies (a compiler segfault), it takes every job in flight
        down with it; those are run again in a fresh pool one at a time, so
        the one that kills a worker alone is the one that fails.
        """
        queue = deque(i for i in range(len(jobs)) if i not in (started or {}))
        take_lock = threading.Lock()
        done_here: SimpleQueue[tuple[int, str | None, float]] = SimpleQueue()

        def take() -> int | None:
            with take_lock:
                return queue.popleft() if queue else None

        def compile_here() -> None:
            while (index := take()) is not None:
                try:
                    done_here.put((index, *in_process(index)))
                except Exception as error:  # every compiler failure is data, not a crash
                    done_here.put((index, describe_error(error), 0.0))

        threads: list[threading.Thread] = []
        if in_process is not None and not self.ready:
            self.start_in_background()
            count = min(LOCAL_THREADS, len(queue))
            threads = [threading.Thread(target=compile_here, name="fasta-compile", daemon=True) for _ in range(count)]
            for thread in threads:
                thread.start()
        in_flight = {future: index for index, future in (started or {}).items()}
        suspects: deque[int] = deque()
        isolated: Future | None = None
        while queue or suspects or in_flight or any(t.is_alive() for t in threads) or not done_here.empty():
            for future in [f for f in in_flight if f.cancelled()]:  # a prefetch queued in a pool since restarted
                with take_lock:
                    queue.append(in_flight.pop(future))
            if (in_process is None or self.ready) and isolated is None:
                if suspects and not in_flight:
                    isolated = self.submit(jobs[suspects[0]])
                    in_flight[isolated] = suspects.popleft()
                while not suspects and len(in_flight) < self.workers and (index := take()) is not None:
                    in_flight[self.submit(jobs[index])] = index
            while not done_here.empty():
                yield done_here.get()
            if not in_flight:
                with contextlib.suppress(Empty):
                    yield done_here.get(timeout=POLL_S)
                continue
            finished, _ = wait(in_flight, timeout=POLL_S, return_when=FIRST_COMPLETED)
            lost, broken = [], False
            for future in finished:
                index = in_flight.pop(future)
                alone, isolated = future is isolated, (None if future is isolated else isolated)
                try:
                    error, seconds = future.result()
                except CancelledError:
                    with take_lock:
                        queue.append(index)
                    continue
                except BrokenProcessPool:
                    broken = True
                    if alone:
                        yield index, "BrokenProcessPool: the compile worker died compiling it, alone", 0.0
                    else:
                        lost.append(index)
                    continue
                yield index, error, seconds
            if broken:
                self._restart_after_crash(lost, in_flight)
                suspects.extend(sorted(lost))

    def _restart_after_crash(self, lost: list[int], in_flight: dict[Future, int]) -> None:
        """A dead worker breaks the whole executor: every job still in it is lost too."""
        lost.extend(in_flight.values())
        in_flight.clear()
        logger.warning("a compile worker died; %d configs are compiled again, one at a time", len(lost))
        self._reset()
        self._get()
        self._ready.set()

    def close(self) -> None:
        self._reset()


_shared: CompilePool | None = None


def shared_pool() -> CompilePool:
    """One pool per process, shared by every tune, closed at exit."""
    global _shared
    if _shared is None:
        _shared = CompilePool()
        atexit.register(_shared.close)
    return _shared
