"""What runs in a compile worker: the job it is given, how it compiles without torch or a device, what it returns.

A job names the kernel by module and qualified name, its tensors by their
dtypes' names, and the tuning process's device by Triton's target: a worker
compiles through the kernel's own `JITFunction.warmup` against a driver that
answers with that target, so the binary lands in Triton's on-disk cache
under the very key the tuning process's launch computes. Compiling needs
neither torch nor a device, so a worker loads torch only if the kernel's
module uses it on import (`defer_import`): importing torch took 4.2-5.5 s on
the H200 machine, most of a cold tune.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NamedTuple

from ..fork_safe import ForkSafeLock

logger = logging.getLogger("fasta_sm.triton.worker")

_ERROR_CHARS = 400


def describe_error(error: BaseException) -> str:
    """`Type: first line of the message`, short enough for a state file or a table."""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}"[:_ERROR_CHARS]


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


def kernel_key(fn: Any) -> str | None:
    """Triton's `cache_key` of a jit function (its source and what it reads), or None where there is none."""
    try:
        key = fn.cache_key
    except Exception as error:  # noqa: BLE001  another Triton, or a kernel Triton cannot hash: no check
        logger.debug("no cache key for %r: %s", fn, describe_error(error))
        return None
    return key if isinstance(key, str) else None


def resolve_current(module: str, qualname: str, key: str | None) -> Any:
    """`resolve`, the module imported again if this process's copy is not the one `key` names (edited since)."""
    fn = resolve(module, qualname)
    if key is None or kernel_key(fn) in (key, None):
        return fn
    if (module, qualname, key) not in _not_current:  # one import again per kernel version, not one per config
        importlib.invalidate_caches()
        importlib.reload(sys.modules[module])
        fn = resolve(module, qualname)
        if kernel_key(fn) in (key, None):
            return fn
        _not_current.add((module, qualname, key))
    raise ImportError(f"{module}.{qualname} in the worker is not the tuning process's, even imported again "
                      f"(a global it reads was changed after import?)")


_not_current: set[tuple[str, str, str]] = set()


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
    `max_shared` is the tuning device's shared memory per block, as Triton
    checks it when it loads a binary (`max_shared_mem`); with it, a config
    that needs more fails in the worker once its need is known
    (`stop_over_shared`), not after its PTX and binary are built.
    `cache_dir` is the Triton cache the tuning process loads from as the job
    is made (`triton_cache_dir`), which the worker then writes to: the
    program may have set `triton.knobs.cache.dir`, which no environment
    carries, or changed `TRITON_CACHE_DIR` after the pool started. Without
    it the worker writes where its own settings say.
    `kernel_key` is the kernel's `cache_key` in the tuning process (a hash of
    its source, its jit helpers' and the constexpr globals it reads): a
    worker lives on between tunes, and keeps the module as it first imported
    it, so after the program edits and reloads the kernel (a notebook), the
    worker would compile the old text, and report the old code's compile
    errors as the new one's. A worker whose copy differs imports the module
    again; if that still differs, the config compiles in the tuning process.
    """

    module: str
    qualname: str
    args: tuple
    kwargs: dict[str, Any]
    target: Any = None
    triton_key: str | None = None
    root: str | None = None
    max_shared: int | None = None
    cache_dir: str | None = None
    kernel_key: str | None = None


def _exit_with_parent(alive: Connection) -> None:
    """Block on a pipe only the tuning process writes to; its end of file means that process died."""
    try:
        alive.recv()
    except (EOFError, OSError):
        pass
    os._exit(0)


def init_worker(alive: Connection, environ: Mapping[str, str]) -> None:
    """Make the worker die with the tuning process, deaf to Ctrl-C, and give it that process's environment.

    A terminal's Ctrl-C reaches every process of its foreground group, the
    workers included: one killed mid-compile would pass for a compiler crash,
    and a pool whose workers died must start again. The tuning process alone
    decides what an interrupt ends, and its workers go when it goes.

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
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(environ)
    threading.Thread(target=_exit_with_parent, args=(alive,), daemon=True).start()


def triton_cache_dir() -> Path:
    """Where this process's Triton keeps compiled kernels: `knobs.cache.dir`, else TRITON_CACHE_DIR."""
    try:
        from triton import knobs

        return Path(knobs.cache.dir)
    except (ImportError, AttributeError):  # a Triton without knobs reads the environment at every compile
        return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def _use_cache_dir(path: str | None) -> None:
    """Write compiled kernels to `path`, the cache the tuning process loads from (None: the worker's own, as it
    started, not the cache an earlier job named)."""
    if "own_cache_dir" not in _given:  # read once: after the first job, Triton's cache setting is the job's
        _given["own_cache_dir"] = str(triton_cache_dir())
    target = _given["own_cache_dir"] if path is None else path
    try:
        from triton import knobs

        knobs.cache.dir = target
    except (ImportError, AttributeError):
        os.environ["TRITON_CACHE_DIR"] = target


def do_nothing() -> None:
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
"""What earlier jobs set this worker's Triton up with: "target", "triton_key", "max_shared", "stage_check", and
"own_cache_dir", its cache before any job named one."""


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


_DEFERRED_LOCK = ForkSafeLock()


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


_TRITON_KEY_LOCK = ForkSafeLock()


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


def stop_over_shared(max_shared: int | None) -> None:
    """Make this worker's compiles fail as soon as a kernel's shared memory is known to exceed `max_shared`.

    Triton learns a kernel's shared memory when it lowers to LLVM IR, but
    refuses it only when the binary is loaded, after PTX and ptxas: for a
    large tile that fails, most of its compile (on this project's CPU box,
    5.5 of 8.5 s for a 32 x 256 x 256, 5-stage bf16 matmul tile). The check
    runs before every stage and raises the OutOfResources the load would
    raise, with the same figures. It wraps the stages compile() asks the
    backend for, not the backend's options, so no cache key changes; a
    Triton whose stages record no "shared" compiles in full, as before.
    """
    _given["max_shared"] = max_shared
    if max_shared is None or _given.get("stage_check"):
        return
    try:
        from triton.compiler import compiler

        make_backend = compiler.make_backend
    except (ImportError, AttributeError) as error:  # another Triton: compile in full, the load checks
        logger.debug("no early shared-memory stop: %s", describe_error(error))
        _given["stage_check"] = True
        return

    @functools.wraps(make_backend)
    def make_checked_backend(target: Any) -> Any:
        backend = make_backend(target)
        add_stages = backend.add_stages

        def add_checked_stages(stages: dict[str, Callable], *args: Any, **kwargs: Any) -> None:
            add_stages(stages, *args, **kwargs)
            for name, stage in stages.items():
                stages[name] = _checked_stage(stage)

        try:
            backend.add_stages = add_checked_stages
        except (AttributeError, TypeError) as error:  # a backend that will not take it compiles in full
            logger.debug("no early shared-memory stop for %s: %s", type(backend).__name__, describe_error(error))
        return backend

    compiler.make_backend = make_checked_backend
    _given["stage_check"] = True


def _checked_stage(stage: Callable) -> Callable:
    """`stage`, refused first when the kernel's shared memory, once a stage has recorded it, is past the limit."""

    def run(module: Any, metadata: dict[str, Any]) -> Any:
        limit, shared = _given.get("max_shared"), metadata.get("shared")
        if limit is not None and isinstance(shared, int) and shared > limit:
            from triton.runtime.errors import OutOfResources

            raise OutOfResources(shared, limit, "shared memory")
        return stage(module, metadata)

    return run


def config_failures(interpreted: bool = False) -> tuple[type[BaseException], ...]:
    """The errors that mean "this config cannot run here": the ones `triton.autotune` catches, and compile errors.

    Anything else a timing raises (a bug in a hook, a fault in the kernel) is
    not a slow config: it stops the tune, as it stops `triton.autotune`. A
    compile error is a config's failure as much as in the compile step (a
    config timed before it was compiled meets it at its first launch); under
    the interpreter, where nothing is compiled before the launch, it comes
    as an InterpreterError.
    """
    from triton.compiler.errors import CompilationError
    from triton.runtime import errors

    failures: tuple[type[BaseException], ...] = (errors.OutOfResources, CompilationError)
    names = ("PTXASError", "InterpreterError") if interpreted else ("PTXASError",)
    return failures + tuple(getattr(errors, name) for name in names if hasattr(errors, name))


class WorkerResult(NamedTuple):
    """A compile job's outcome, and whether the job made its worker import torch (the kernel's module used it).

    `unavailable` says the worker could not reach the kernel at all (its
    module did not import there, the driver did not set up), or that the
    compile raised what is not a config failure (`config_failures`: a bug
    in a heuristics function, a driver the worker lacks): a fact about the
    worker or the code, not the config, so the caller compiles the config
    in its own process, where such an error stops the tune as it stops
    `triton.autotune`, instead of recording a failure that would outlive
    the cause.
    """

    error: str | None
    seconds: float
    loaded_torch: bool = False
    unavailable: bool = False


def compile_in_worker(job: CompileJob) -> WorkerResult:
    start = time.perf_counter()
    torch_deferred = isinstance(sys.modules.get("torch"), DeferredModule)
    error, unavailable = None, False
    try:
        _use_driver_for(job.target)
        _use_triton_key(job.triton_key)
        _use_cache_dir(job.cache_dir)
        stop_over_shared(job.max_shared)
        if job.root is not None and job.root not in sys.path:
            sys.path.append(job.root)
            importlib.invalidate_caches()
        fn = resolve_current(job.module, job.qualname, job.kernel_key)
    except Exception as failure:  # noqa: BLE001  reported, and the config is compiled elsewhere
        error, unavailable = describe_error(failure), True
    else:
        try:
            fn.warmup(*[stand_in(arg) for arg in job.args], grid=(1,), **job.kwargs)
        except config_failures() as failure:  # a config the compiler refuses: data, not a crash
            error = describe_error(failure)
        except Exception as failure:  # noqa: BLE001  not the config's fault: the caller compiles it and decides
            error, unavailable = describe_error(failure), True
    loaded_torch = torch_deferred and not isinstance(sys.modules.get("torch"), DeferredModule)
    return WorkerResult(error, time.perf_counter() - start, loaded_torch, unavailable)


def stand_in(arg: Any) -> Any:
    if isinstance(arg, TensorArg):
        from triton.runtime.jit import MockTensor

        return MockTensor(arg.dtype)
    return arg


WORKER_NAME = "fasta-compile-worker"
"""The name of every compile worker process; the fork server runs no `__main__` for those (`skip_main_in_workers`)."""


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
    (`TritonBackend._jobs`). Runs in the workers' own fork server
    (`worker_preload`, `fork_server`).
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
