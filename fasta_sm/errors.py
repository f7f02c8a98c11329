"""The errors fasta-sm raises; each message names the kernel, file or value at fault."""


class FastaError(Exception):
    """Base of every error fasta-sm raises on purpose."""


class ConfigError(FastaError, ValueError):
    """A config or config list that no tune can run on."""


class StateFileError(FastaError):
    """A state file that cannot be decoded into a TuneState (the loader's only error)."""


class TableError(FastaError, ValueError):
    """A replay table that breaks the table format."""


class BackendError(FastaError):
    """A backend returned something the engine cannot accept (NaN, negative, wrong length)."""


class PolicyError(FastaError):
    """A policy proposed something the engine cannot accept."""


class TuneFailed(FastaError):
    """A tune cannot reach a winner: every config failed, or the machine could not take its next step."""


class LockTimeout(FastaError, TimeoutError):
    """Another process held a kernel's lock for longer than we were willing to wait."""


class StateDirError(FastaError, OSError):
    """The state directory is missing, not a directory, or not writable."""


class MissingDependency(FastaError, ImportError):
    """An optional package a feature needs is not installed; the message names the extra to install."""


class SettingError(FastaError, ValueError):
    """A setting from the environment that fasta-sm cannot use; the message names the variable and its value."""


def add_note(error: BaseException, note: str) -> None:
    """Attach `note` to `error` as Python 3.11's `add_note` does (shown under its traceback), on 3.10 too.

    An error that is not fasta-sm's keeps its type, so a caller's `except`
    still catches it; the note says where in a tune it happened.
    """
    if hasattr(error, "add_note"):
        error.add_note(note)
        return
    try:
        error.__notes__ = [*getattr(error, "__notes__", ()), note]
    except AttributeError:  # an exception type without a __dict__
        pass


def notes_of(error: BaseException) -> list[str]:
    """The notes added to `error` (PEP 678), as text: where it happened, which config."""
    return [str(note) for note in getattr(error, "__notes__", ())]


def describe(error: BaseException) -> str:
    """`Type: message`, as a state file records an error; a message whose str() raises is named, not raised.

    A backend's or policy's error is recorded while it is handled: a second
    error from its `__str__` would replace it, and skip the rollback.
    """
    try:
        message = str(error)
    except Exception as exc:  # noqa: BLE001  whatever __str__ raises, the error it describes comes first
        message = f"<its message could not be read: str() raised {type(exc).__name__}>"
    return f"{type(error).__name__}: {message}"
