"""Parallel compilation: spawn workers fill Triton's on-disk cache, the parent loads.

Compiling one config of a large matmul takes seconds of CPU in LLVM and ptxas;
a tune that compiles its batch one config at a time spends most of its wall
time there. Workers are spawned (never forked: the parent holds a CUDA
context) and compile through the kernel's own `JITFunction.warmup`, with
tensors replaced by their dtypes, so the binary lands in the cache under the
very key the parent's launch computes; the parent's first launch of that
config then loads it from disk in milliseconds.
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
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("fasta_sm.triton.compile_pool")

_ERROR_CHARS = 400


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
    """Import a kernel by module path, as a spawn worker must."""
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


def _exit_with_parent(parent: int, interval_s: float = 0.5) -> None:
    while os.getppid() == parent:
        time.sleep(interval_s)
    os._exit(0)


def _warm_worker() -> None:
    """Make the worker die with its parent, then import torch and Triton and pick
    the target, so that import time is not charged to the first config.

    A tune killed with SIGKILL must not leave its workers behind: they would
    hold a CUDA context each, and the pipes of whoever waits on the process.
    """
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    try:
        import torch  # noqa: F401
        from triton.runtime import driver

        driver.active.get_current_target()
    except Exception:  # no driver (CPU): each job reports its own error
        pass


def _compile_in_worker(job: CompileJob) -> tuple[str | None, float]:
    start = time.perf_counter()
    try:
        fn = resolve(job.module, job.qualname)
        fn.warmup(*job.args, grid=(1,), **job.kwargs)
    except Exception as error:  # every compiler failure is data, not a crash
        return describe_error(error), time.perf_counter() - start
    return None, time.perf_counter() - start


class CompilePool:
    """A lazily started spawn pool; a worker that dies takes only its batch's retry with it."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or pool_size()
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _get(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                context = multiprocessing.get_context("spawn")
                self._executor = ProcessPoolExecutor(
                    max_workers=self.workers, mp_context=context, initializer=_warm_worker
                )
            return self._executor

    def _reset(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None

    def start(self) -> None:
        """Spawn and warm the workers now rather than at the first compile."""
        executor = self._get()
        for future in [executor.submit(_warm_worker) for _ in range(self.workers)]:
            future.result()

    def run(self, jobs: Sequence[CompileJob]) -> Iterator[tuple[int, str | None, float]]:
        """Yield (position, error, seconds) as each job finishes, in completion order.

        If a worker dies (a compiler segfault), the jobs it took down are run
        once more in a fresh pool; those lost a second time are failures.
        """
        pending = list(range(len(jobs)))
        for attempt in range(2):
            executor = self._get()
            futures = {executor.submit(_compile_in_worker, jobs[i]): i for i in pending}
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
