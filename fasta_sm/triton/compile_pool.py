"""Parallel compilation: worker processes fill Triton's on-disk cache, the parent loads.

Compiling one config of a large matmul takes seconds of CPU in LLVM and ptxas;
a tune that compiles its batch one config at a time spends most of its wall
time there. Workers are never forked from the parent (it holds a CUDA
context): they fork from a fork server that imported Triton once, so
starting fourteen of them costs one import, not fourteen (spawn where the
platform has no fork server). They compile through the kernel's own
`JITFunction.warmup`, with tensors replaced by their dtypes' names and
Triton's driver by one that answers with the tuning process's target, so the
binary lands in the cache under the very key the parent's launch computes;
the parent's first launch of that config then loads it from disk in
milliseconds. Compiling needs neither torch nor a device, so a worker loads
torch only if the kernel's module uses it on import (`defer_import`):
importing torch took 4.2-5.5 s on the H200 machine, most of a cold tune.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import importlib.util
import itertools
import logging
import multiprocessing
import os
import sys
import threading
import time
import types
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import Connection
from queue import Empty, SimpleQueue
from typing import Any, NamedTuple

logger = logging.getLogger("fasta_sm.triton.compile_pool")

_ERROR_CHARS = 400
PRELOAD = ("fasta_sm.triton.worker_preload",)
"""Imported once by the fork server, inherited by every worker it forks (it imports Triton, not torch)."""
LOCAL_THREADS = (2, 8)
"""Threads that compile in this process while the pool starts: the first count, then the second once
`SLOW_POOL_S` have passed. Triton's front end holds the GIL, so each thread added slows the others'
compiles; a pool that starts in about a second should find few of them to wait for, and one that
fails to start leaves the work to eight (Triton releases the GIL in LLVM and ptxas)."""
SLOW_POOL_S = 2.0
START_RETRY_S = 10.0
"""A pool that failed to start is tried again by a compile this long after, not before (nor on every step)."""
POLL_S = 0.01


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
    """The jit function (or, under `TRITON_INTERPRET=1`, the interpreted one) under autotuner and
    heuristics wrappers, each of which keeps the next in `.fn`."""
    from triton.runtime.jit import JITFunction

    while not isinstance(obj, JITFunction) and type(obj).__name__ != "InterpretedFunction" and hasattr(obj, "fn"):
        obj = obj.fn
    return obj


def kernel_path(fn: Any) -> tuple[str, str] | None:
    """The module and qualified name a worker imports a jit function by, or None when no worker can.

    A kernel defined inside a function has no such path, and one defined in
    the main script has none that a worker sees: workers do not run
    `__main__` (`skip_main_in_workers`).
    """
    module = getattr(fn, "module", None) or getattr(fn.fn, "__module__", None)
    qualname = fn.fn.__qualname__
    if "<locals>" in qualname or module in (None, "__main__"):
        return None
    return module, qualname


def module_root(module: str) -> str | None:
    """The `sys.path` entry an imported module was found under: its file's folder, up one per package level."""
    file = getattr(sys.modules.get(module), "__file__", None)
    if not file:
        return None
    folder = os.path.dirname(os.path.abspath(file))
    for _ in range(module.count(".") + (os.path.basename(file) == "__init__.py")):
        folder = os.path.dirname(folder)
    return folder


def resolve(module: str, qualname: str) -> Any:
    """Import a kernel by module path, as a worker must."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return unwrap_jit(obj)


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument as a worker compiles for it: its dtype's name (`str(tensor.dtype)`).

    That name is all Triton reads of a tensor it compiles for (a worker's
    stand-ins are 16-byte aligned, as the parent checks its tensors are), and
    unlike a torch dtype it unpickles without importing torch.
    """

    dtype: str


@dataclass(frozen=True)
class CompileJob:
    """What a worker needs to compile one config: no tensors, no CUDA objects.

    `target` is Triton's `GPUTarget` of the tuning process's device; with it
    a worker compiles without a driver of its own, hence without torch or a
    CUDA context. Without it (None) the worker asks its own driver.
    `triton_key` is the tuning process's `tuning_triton_key()`; without it
    each worker hashes Triton's library itself before its first compile.
    `root` is the directory the module is imported from, for a worker
    whose `sys.path` lacks it (a path the program added after the fork
    server started, as a notebook or a test does).
    """

    module: str
    qualname: str
    args: tuple
    kwargs: dict[str, Any]
    target: Any = None
    triton_key: str | None = None
    root: str | None = None


def _exit_with_parent(alive: Connection) -> None:
    """Block on a pipe only the tuning process writes to; its end of file means that process died."""
    try:
        alive.recv()
    except (EOFError, OSError):
        pass
    os._exit(0)


def _init_worker(alive: Connection, environ: Mapping[str, str]) -> None:
    """Make the worker die with the tuning process and give it that process's environment.

    A tune killed with SIGKILL must not leave its workers behind: they would
    hold the pipes of whoever waits on the process. The worker's parent is
    the fork server, which lives as long as any worker does, so the worker
    watches the tuning process itself, through `alive`.

    A forked worker inherits the fork server's environment, which is the
    tuning process's as it was when the server started, often at import
    (`start_fork_server`). `environ` is the tuning process's as the pool
    starts, so that a `TRITON_CACHE_DIR` set in between is where the worker
    writes, and the parent finds what it compiled.
    """
    os.environ.clear()
    os.environ.update(environ)
    threading.Thread(target=_exit_with_parent, args=(alive,), daemon=True).start()


def _started() -> None:
    """A job that does nothing: one per worker makes the executor start them all."""


class CompileOnlyDriver:
    """Triton's active driver in a compile worker: the tuning process's target, and no device.

    Triton's launch path asks the driver for the target, which is all a
    compile needs, and for the current device and stream, which a real
    driver answers through torch and a CUDA context (the context took
    1.2-1.5 s of a worker's first compile on the H200, and held device
    memory for nothing). Anything else, such as a kernel module asking for
    its torch device on import, goes to the real driver, made on first use.
    """

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def set_current_device(self, device: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        from triton.runtime.driver import driver

        return getattr(driver.default, name)


_given: dict[str, Any] = {}
"""What earlier jobs set this worker's Triton up with: "target", "triton_key"."""


def _use_driver_for(target: Any) -> None:
    """Compile for `target` without a device; with no target, use the real driver but not its streams."""
    if "target" in _given and _given["target"] == target:
        return
    from triton.runtime.driver import driver

    if target is not None:
        driver.set_active(CompileOnlyDriver(target))
    else:
        try:
            driver.active.get_current_stream = _null_stream
        except Exception:  # noqa: BLE001  no driver (CPU): each job reports its own error
            return
    _given["target"] = target


def _null_stream(device: Any = None) -> int:
    return 0


class DeferredModule(types.ModuleType):
    """Stands in `sys.modules` for a module not imported yet, and imports it on first use.

    `import torch` then binds this stand-in at no cost; the first attribute
    read (`torch.float16`, or `import torch.nn`, which reads `__path__`)
    imports the real module, to which every read is then forwarded.
    `importlib.util.LazyLoader` would not do: its module loads as soon as the
    import system reads its `__spec__`, that is at the next `import torch`.
    """

    def __getattr__(self, name: str) -> Any:
        real = sys.modules.get(self.__name__)
        if real is self or real is None:
            with _DEFERRED_LOCK:
                if sys.modules.get(self.__name__) is self:
                    del sys.modules[self.__name__]
                real = importlib.import_module(self.__name__)
        return getattr(real, name)


_DEFERRED_LOCK = threading.Lock()


def set_up_specializer_without_torch() -> None:
    """Run Triton's one-time argument-specializer setup against a torch that has only a dummy `Tensor`.

    That setup, done at a process's first launch or warm-up, looks up
    `torch.Tensor` to recognise tensors quickly (Triton 3.9 does; seen on
    this project's CPU box), and so would load a deferred torch. Done in the fork server against this dummy,
    it is inherited by every worker; tensors, which a worker never sees,
    would still be recognised by their `data_ptr`. Where the setup differs,
    it runs later, as before, and the worker loads torch then.
    """
    previous = sys.modules.get("torch")
    dummy = types.ModuleType("torch")
    dummy.Tensor = type("Tensor", (), {})  # type: ignore[attr-defined]
    sys.modules["torch"] = dummy
    try:
        from triton.runtime.jit import mangle_type

        mangle_type(1)
    except Exception as error:  # noqa: BLE001  an older or newer Triton: the setup happens later
        logger.debug("Triton's specializer was not set up ahead: %s", describe_error(error))
    finally:
        if previous is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = previous


def defer_import(name: str) -> None:
    """Make `import name` free until the module is used (torch, in the compile workers' fork server)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None:
        return
    stand_in = DeferredModule(name)
    stand_in.__spec__ = spec
    sys.modules[name] = stand_in


def _triton_key_function() -> Callable[[], str] | None:
    try:
        from triton.runtime.cache import triton_key
    except ImportError:  # Triton before 3.2 kept it in the compiler
        try:
            from triton.compiler.compiler import triton_key
        except ImportError:
            return None
    return triton_key


_TRITON_KEY_LOCK = threading.Lock()


def tuning_triton_key() -> str | None:
    """Triton's cache-key prefix in this process: a hash of its library (0.4 s), computed once.

    Callers at the same time wait for one hash rather than each computing
    it (Triton caches the result, but does not make a second caller wait).
    None where this Triton has no such key, or computing it failed; the
    compile that needs it will then raise the error properly.
    """
    function = _triton_key_function()
    if function is None:
        return None
    with _TRITON_KEY_LOCK:
        try:
            return function()
        except Exception as error:  # noqa: BLE001
            logger.debug("triton_key() failed ahead of time: %s", describe_error(error))
            return None


@functools.cache
def warm_triton_key() -> None:
    """`tuning_triton_key` in a daemon thread, once per process: hashed off the critical path, ready when asked."""
    threading.Thread(target=tuning_triton_key, name="fasta-triton-key", daemon=True).start()


def _use_triton_key(key: str | None) -> None:
    """Give this worker's Triton the tuning process's cache-key prefix, so that it never hashes its library.

    The key is the same Triton's, so this changes no cache key, only who
    computes it; Triton's own warm-up pool does the same. Every Triton
    module that imported the key function by name gets the answer.
    """
    if key is None or _given.get("triton_key") == key:
        return
    original = _triton_key_function()
    if original is None:
        return

    def given() -> str:
        return key

    for name, module in list(sys.modules.items()):
        if name.startswith("triton") and getattr(module, "triton_key", None) is original:
            module.triton_key = given
    _given["triton_key"] = key


class WorkerResult(NamedTuple):
    """A compile job's outcome, and whether the job made its worker import torch (the kernel's module used it).

    `unavailable` says the worker could not reach the kernel at all (its
    module did not import there, the driver did not set up): a fact about
    the worker, not the config, so the caller compiles the config elsewhere
    instead of recording a failure that would outlive the cause.
    """

    error: str | None
    seconds: float
    loaded_torch: bool = False
    unavailable: bool = False


def _compile_in_worker(job: CompileJob) -> WorkerResult:
    start = time.perf_counter()
    torch_deferred = isinstance(sys.modules.get("torch"), DeferredModule)
    error, unavailable = None, False
    try:
        _use_driver_for(job.target)
        _use_triton_key(job.triton_key)
        if job.root is not None and job.root not in sys.path:
            sys.path.append(job.root)
            importlib.invalidate_caches()
        fn = resolve(job.module, job.qualname)
    except Exception as failure:  # noqa: BLE001  reported, and the config is compiled elsewhere
        error, unavailable = describe_error(failure), True
    else:
        try:
            fn.warmup(*[_stand_in(arg) for arg in job.args], grid=(1,), **job.kwargs)
        except Exception as failure:  # every compiler failure is data, not a crash
            error = describe_error(failure)
    loaded_torch = torch_deferred and not isinstance(sys.modules.get("torch"), DeferredModule)
    return WorkerResult(error, time.perf_counter() - start, loaded_torch, unavailable)


_warned: set[tuple[str, str]] = set()


def _warn_once(topic: str, key: str, message: str, *args: object) -> None:
    """Log `message` the first time `topic` comes up for `key` (a kernel, a module) in this process."""
    if (topic, key) in _warned:
        return
    _warned.add((topic, key))
    logger.warning(message, *args)


def _warn_unavailable(job: CompileJob, error: str | None) -> None:
    """Say once per kernel that the workers cannot reach it, so it compiles in this process."""
    _warn_once("unavailable", f"{job.module}.{job.qualname}",
               "compile workers cannot reach %s.%s (%s); compiling it in this process instead",
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


_LOOK_INTO = 64
_torch_on_import: set[str] = set()
"""Decorated kernels' modules that hold torch objects made when they were imported (`note_kernel_module`)."""


def uses_torch_on_import(namespace: Mapping[str, Any]) -> bool:
    """Whether a module's globals hold what only a loaded torch makes: a dtype, a device, a torch function or submodule.

    A compile worker importing such a module must load torch; one whose
    globals hold only the `torch` module itself need not. Containers are
    looked into one level deep (a dtype table), their first
    `_LOOK_INTO` entries only: this runs when a kernel is decorated.
    """
    for value in list(namespace.values()):
        items = [value]
        if isinstance(value, dict):
            for key, entry in itertools.islice(value.items(), _LOOK_INTO):
                items += [key, entry]
        elif isinstance(value, (list, tuple, set, frozenset)):
            items += itertools.islice(value, _LOOK_INTO)
        for item in items:
            if isinstance(item, types.ModuleType):
                origin = item.__name__ if item.__name__ != "torch" else ""
            elif isinstance(item, (type, types.FunctionType, types.BuiltinFunctionType)):
                origin = getattr(item, "__module__", None) or ""
            else:
                origin = type(item).__module__
            if origin == "torch" or origin.startswith("torch."):
                return True
    return False


def note_kernel_module(name: str, namespace: Mapping[str, Any]) -> None:
    """Remember a decorated kernel's module that uses torch on import: the fork server then imports torch itself."""
    if uses_torch_on_import(namespace):
        _torch_on_import.add(name)


def preload_modules() -> list[str]:
    """What the fork server imports: `PRELOAD`, after torch where a kernel module needs it.

    `FASTA_WORKER_TORCH` 1 or 0 forces torch in or out; unset, torch is
    imported by the server once a decorated kernel's module uses torch on
    import (one import, shared by every worker it forks, instead of one per
    worker), and deferred otherwise.
    """
    setting = os.environ.get("FASTA_WORKER_TORCH", "").strip().lower()
    if setting in ("1", "true", "yes", "on") or (setting in ("", "auto") and _torch_on_import):
        return ["torch", *PRELOAD]
    return list(PRELOAD)


def _stand_in(arg: Any) -> Any:
    if isinstance(arg, TensorArg):
        from triton.runtime.jit import MockTensor

        return MockTensor(arg.dtype)
    return arg


WORKER_NAME = "fasta-compile-worker"
"""The name of every compile worker process; the fork server runs no `__main__` for those (`skip_main_in_workers`)."""


def worker_context() -> multiprocessing.context.BaseContext:
    """A fork server that has imported Triton, else spawn: never a fork of this process."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = _named_worker_context()
    context.set_forkserver_preload(preload_modules())
    return context


@functools.cache
def _named_worker_context() -> multiprocessing.context.BaseContext:
    """The fork-server context, with every process it makes named `WORKER_NAME`."""
    return _NamedProcesses(multiprocessing.get_context("forkserver"))  # type: ignore[return-value]


class _NamedProcesses:
    """A multiprocessing context whose processes carry one name (multiprocessing numbers them otherwise)."""

    def __init__(self, context: multiprocessing.context.BaseContext) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def Process(self, *args: Any, **kwargs: Any) -> multiprocessing.process.BaseProcess:  # noqa: N802  multiprocessing's name
        return self._context.Process(*args, **kwargs, name=WORKER_NAME)


def skip_main_in_workers() -> None:
    """Make the fork server's compile workers skip re-running the tuning process's `__main__`.

    A fork-server or spawned child runs the parent's main script again (as
    `__mp_main__`) before its first job; hence the multiprocessing rule that
    a script guard its top level with `if __name__ == "__main__":`. Kernel
    authors' scripts often have no guard, and `triton.autotune` never needed
    one: run again in each worker, such a script would allocate, tune and
    launch there, and even a guarded one that starts with `import torch.nn`
    makes every worker import torch before its first compile. Workers need
    no `__main__`: a kernel defined there is compiled in the tuning process
    (`TritonBackend._jobs`). Runs in the fork server (`worker_preload`);
    other children of that server, which multiprocessing shares within a
    process, still run `__main__` as usual.
    """
    from multiprocessing import process, spawn

    for name in ("_fixup_main_from_path", "_fixup_main_from_name"):
        original = getattr(spawn, name, None)
        if original is None or getattr(original, "skips_compile_workers", False):
            continue

        @functools.wraps(original)
        def fixup(main: str, original: Callable[[str], None] = original) -> None:
            if process.current_process().name != WORKER_NAME:
                original(main)

        fixup.skips_compile_workers = True  # type: ignore[attr-defined]
        setattr(spawn, name, fixup)


def interpreting(fn: Any = None) -> bool:
    """True when kernels run in Triton's CPU interpreter (TRITON_INTERPRET read as Triton reads it)."""
    try:
        from triton import knobs

        on = bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):  # a Triton without knobs
        on = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes", "y")
    return on or type(fn).__name__ == "InterpretedFunction"


def start_fork_server() -> bool:
    """Start the workers' fork server now, so that the first tune of this process finds it ready.

    The server imports Triton in a process of its own (under a second),
    and until it has, a tune compiles in threads of this process, which
    Triton's front end serializes on the GIL. This process hashes Triton's
    library meanwhile (`warm_triton_key`), for its own loads and for the
    workers, which are given the key with each job. Started
    when a kernel is decorated, usually at import, it is ready by the time a
    program that first builds a model or loads data calls the kernel. It
    costs this process one process spawn. Nothing is started in a child
    process (a compile worker importing the kernel's module, a data loader),
    under Triton's interpreter, where there is no fork server, or when
    `FASTA_PREWARM` is 0. The workers it forks later take this process's
    environment as of the pool's start, not the server's (`_init_worker`).
    Returns whether a server is now running or starting.
    """
    if os.environ.get("FASTA_PREWARM", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if interpreting() or multiprocessing.parent_process() is not None:
        return False
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    from multiprocessing import forkserver

    try:
        worker_context()  # sets the server's preload
        forkserver.ensure_running()
    except Exception as error:  # noqa: BLE001  decorating must not fail: the first tune starts it, or compiles here
        logger.debug("the fork server did not start ahead: %s", describe_error(error))
        return False
    warm_triton_key()
    return True


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
        self._guesses_allowed = threading.Event()
        self._guesses_allowed.set()
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
                    initializer=_init_worker,
                    initargs=(self._alive[0], dict(os.environ)),
                )
            return self._executor, self._generation

    def _reset(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None
            self._close_pipe()
            self._ready.clear()
            self._starting = False
            self._asked_at = self._failed_at = None

    def replace_executor(self) -> None:
        """A fresh executor after a crash; its workers start on demand, so it counts as ready."""
        self._reset()
        self._get()
        self._ready.set()

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
        """Start the workers now rather than at the first compile."""
        executor, generation = self._get()
        for future in [executor.submit(_started) for _ in range(self.workers)]:
            future.result()
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
        executor, generation = self._get()
        future = executor.submit(_compile_in_worker, job)
        future.fasta_generation = generation  # type: ignore[attr-defined]
        return future

    def try_submit(self, job: CompileJob) -> Future | None:
        """Start a guess if the pool is ready and takes guesses, else None; never starts a pool.

        Guesses run from their own threads: one must not bring a closed pool
        back to life (`submit` would), nor run beside a suspect that must
        compile alone after a crash.
        """
        with self._lock:
            if not (self._ready.is_set() and self._guesses_allowed.is_set()) or self._executor is None:
                return None
            future = self._executor.submit(_compile_in_worker, job)
            future.fasta_generation = self._generation  # type: ignore[attr-defined]
            return future

    def hold_guesses(self, held: bool) -> None:
        """While held, `try_submit` starts nothing (a run isolating the suspects of a crash)."""
        if held:
            self._guesses_allowed.clear()
        else:
            self._guesses_allowed.set()

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
        down with it; those are run again in a fresh pool one at a time, so
        the one that kills a worker alone is the one that fails.
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
        """Hand queued jobs to idle workers (suspects one at a time, alone)."""
        if (self.in_process is not None and not self.pool.ready) or self.isolated is not None:
            return
        try:
            if self.suspects and not self.in_flight:
                self.isolated = self.pool.submit(self.jobs[self.suspects[0]])
                self.in_flight[self.isolated] = self.suspects.popleft()
            while not self.suspects and len(self.in_flight) < self.pool.workers and (index := self.take()) is not None:
                try:
                    self.in_flight[self.pool.submit(self.jobs[index])] = index
                except BaseException:
                    self.requeue(index)
                    raise
        except (BrokenProcessPool, RuntimeError):  # the executor broke (or closed) between two jobs
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
                    if self.pool.stale(future):  # an executor already replaced: not a new crash
                        self.requeue(index)
                        continue
                    broken = True
                    if alone:
                        yielded = True
                        yield index, "BrokenProcessPool: the compile worker died compiling it, alone", 0.0
                    else:
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
        """A dead worker breaks the whole executor: every job still in it is lost too."""
        lost.extend(self.in_flight.values())
        self.in_flight.clear()
        self.isolated = None
        logger.warning("a compile worker died; %d configs are compiled again, one at a time", len(lost))
        self.pool.hold_guesses(True)  # until the suspects are through, each compiles alone
        self.pool.replace_executor()
        self.suspects.extend(sorted(lost))

    def stop(self) -> None:
        """Leave no thread compiling behind this run (it may end early: an error, or a closed generator)."""
        with self.lock:
            self.queue.clear()
        for thread in self.threads:
            thread.join()
        self.pool.hold_guesses(False)


_POOLS: weakref.WeakSet[CompilePool] = weakref.WeakSet()


def _close_pipes_in_child() -> None:
    """A child forked from the tuning process must not hold the pipe that tells workers it is alive."""
    for pool in list(_POOLS):
        pool._close_pipe()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_pipes_in_child)


_shared: CompilePool | None = None


def shared_pool() -> CompilePool:
    """One pool per process, shared by every tune, closed at exit."""
    global _shared
    if _shared is None:
        _shared = CompilePool()
        _close_at_exit(_shared)
    return _shared


def _close_at_exit(pool: CompilePool) -> None:
    """Close `pool` at exit before `concurrent.futures` joins its executors.

    That join waits for every job still running, and at exit those are
    guesses no tune will ask for: a matmul's take seconds. Closing the pool
    first ends its workers (they watch the pipe `close` shuts). The hook is
    private to `threading`; where it is missing, `atexit` runs the close
    after the join instead.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(pool.close)
            return
        except RuntimeError:  # the interpreter is already shutting down
            pass
    atexit.register(pool.close)
