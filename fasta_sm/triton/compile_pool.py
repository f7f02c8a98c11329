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
import importlib
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

logger = logging.getLogger("fasta_sm.triton.compile_pool")

_ERROR_CHARS = 400
PRELOAD = ("torch", "triton", "fasta_sm.triton.worker_preload")
"""Imported once by the fork server, inherited by every worker it forks."""
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
    """Import torch and Triton and pick the target, so that this is not charged to the first config."""
    try:
        import torch  # noqa: F401
        from triton.runtime import driver

        driver.active.get_current_target()
    except Exception:  # no driver (CPU): each job reports its own error
        pass


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

    def start(self) -> None:
        """Spawn and warm the workers now rather than at the first compile."""
        executor = self._get()
        for future in [executor.submit(_warm_worker) for _ in range(self.workers)]:
            future.result()

    def submit(self, job: CompileJob) -> Future:
        """Start one job now; hand its future to `run` later to collect it."""
        return self._get().submit(_compile_in_worker, job)

    def run(
        self, jobs: Sequence[CompileJob], started: Mapping[int, Future] | None = None
    ) -> Iterator[tuple[int, str | None, float]]:
        """Yield (position, error, seconds) as each job finishes, in completion order.

        `started` maps positions to futures of jobs already submitted (a
        prefetch), which are awaited instead of submitted again. If a worker
        dies (a compiler segfault), the jobs it took down are run once more in
        a fresh pool; those lost a second time are failures.
        """
        pending = list(range(len(jobs)))
        started = dict(started or {})
        for attempt in range(2):
            executor = self._get()
            futures = {started.pop(i, None) or executor.submit(_compile_in_worker, jobs[i]): i for i in pending}
            lost = []
            for future in as_completed(futures):
                index = futures[future]
                try:
                    error, seconds = future.result()
                except BrokenProcessPool:
                    lost.append(index)
                    continue
                yield index, error, seconds
            if not lost:
                return
            self._reset()
            logger.warning("a compile worker died; %d configs %s", len(lost), "retried" if attempt == 0 else "failed")
            pending = sorted(lost)
        for index in pending:
            yield index, "BrokenProcessPool: the compile worker died twice", 0.0

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
