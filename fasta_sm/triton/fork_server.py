"""Where compile workers come from: a fork server of their own that imported Triton, started early, named apart.

Workers are never forked from the tuning process (it holds a CUDA context):
they fork from a server that imported Triton once, so starting fourteen of
them costs one import, not fourteen (spawn where the platform has no fork
server). What the server imports, torch included or deferred, is decided
when it starts (`preload_modules`).

The server is fasta-sm's, not multiprocessing's. That one is shared by
the whole program (and is the default start method from Python 3.14): a
library that started it first would leave the workers without their
preload, so each imports torch and runs the main script again, and one
started here would hand the workers' deferred torch to the program's own
children.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import multiprocessing
import os
import types
from collections.abc import Mapping
from multiprocessing import forkserver
from typing import Any

from ..env import env_switch, parse_switch
from ..errors import SettingError
from .worker import WORKER_NAME, describe_error, warm_triton_key

logger = logging.getLogger("fasta_sm.triton.fork_server")

PRELOAD = ("fasta_sm.triton.worker_preload",)
"""Imported once by the fork server, inherited by every worker it forks (it imports Triton, not torch)."""


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
    setting = os.environ.get("FASTA_WORKER_TORCH", "")
    if setting.strip().lower() in ("", "auto"):
        wanted = bool(_torch_on_import)
    else:
        try:
            wanted = parse_switch("FASTA_WORKER_TORCH", setting)
        except SettingError as error:
            raise SettingError(f"{error}, nor auto (the default: torch if a kernel's module imports it)") from None
    return ["torch", *PRELOAD] if wanted else list(PRELOAD)


_server = forkserver.ForkServer()
"""The workers' fork server; multiprocessing's own (`forkserver._forkserver`) is left to the program."""


def _new_server_in_child() -> None:
    """A child forked from this process cannot reach its parent's server: it would start its own.

    It lets go of the parent's end of the pipe the server watches, too: the
    server ends when every holder of that end is gone, and a child the
    program forked (a data loader's worker) would keep it alive after the
    program exits.
    """
    global _server
    inherited = _server._forkserver_alive_fd
    _server = forkserver.ForkServer()
    if inherited is not None:
        with contextlib.suppress(OSError):
            os.close(inherited)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_server_in_child)


def fork_server_pid() -> int | None:
    """The process id of the workers' fork server, or None before it starts."""
    return _server._forkserver_pid


def stop_fork_server() -> None:
    """Stop the workers' fork server (the next pool starts a new one): for benchmarks of a cold start."""
    _server._stop()


class _ThroughOurServer:
    """The `forkserver` module as the workers' Popen sees it: its helpers, our server's connection."""

    def __getattr__(self, name: str) -> Any:
        if name in ("connect_to_new_process", "ensure_running"):
            return getattr(_server, name)
        return getattr(forkserver, name)


@functools.cache
def _popen_through_our_server() -> type:
    """multiprocessing's fork-server Popen, its launch reading `forkserver` as `_ThroughOurServer`.

    The launch asks the module-level server for each new process; only that
    name lookup changes, not its code, so it stays what the running Python
    ships. Built on first use: a platform without a fork server cannot
    import `popen_forkserver`.
    """
    from multiprocessing import popen_forkserver

    launch = popen_forkserver.Popen._launch
    names = dict(launch.__globals__, forkserver=_ThroughOurServer())
    through_our_server = types.FunctionType(launch.__code__, names, launch.__name__, launch.__defaults__,
                                            launch.__closure__)
    return type("WorkerPopen", (popen_forkserver.Popen,), {"_launch": through_our_server})


class _WorkerProcess(multiprocessing.process.BaseProcess):
    """A process forked from the workers' fork server (multiprocessing's `ForkServerProcess`, another server)."""

    _start_method = "forkserver"

    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # noqa: N802  multiprocessing's name
        return _popen_through_our_server()(process_obj)


def worker_context() -> multiprocessing.context.BaseContext:
    """The workers' own fork server, which imports Triton, else spawn: never a fork of this process."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    _server.set_forkserver_preload(preload_modules())
    return _worker_context()


@functools.cache
def _worker_context() -> multiprocessing.context.BaseContext:
    return _WorkerContext(multiprocessing.get_context("forkserver"))  # type: ignore[return-value]


class _WorkerContext:
    """The fork-server context, whose processes come from the workers' server and are named `WORKER_NAME`."""

    def __init__(self, context: multiprocessing.context.BaseContext) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def Process(self, *args: Any, **kwargs: Any) -> multiprocessing.process.BaseProcess:  # noqa: N802  multiprocessing's name
        return _WorkerProcess(*args, **kwargs, name=WORKER_NAME)


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
    environment as of the pool's start, not the server's (`init_worker`).
    Returns whether a server is now running or starting.
    """
    if not env_switch("FASTA_PREWARM", default=True):
        return False
    if interpreting() or multiprocessing.parent_process() is not None:
        return False
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    try:
        worker_context()  # sets the server's preload
        _server.ensure_running()
    except Exception as error:  # noqa: BLE001  decorating must not fail: the first tune starts it, or compiles here
        logger.debug("the fork server did not start ahead: %s", describe_error(error))
        return False
    warm_triton_key()
    return True
