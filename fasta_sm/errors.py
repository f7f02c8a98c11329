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
    """A backend returned something the engine cannot accept (NaN, negative, wrong length), or could not time a
    config for a reason other than the config itself (a hook that raised, an argument missing at launch)."""


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
