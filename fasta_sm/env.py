"""Yes/no switches read from the environment, one way everywhere.

A misspelt switch (`FASTA_SM_INDUCTOR=ture`) that silently reads as off is a
tune the user thinks is running and is not; so a value that is neither a yes
nor a no is an error naming the variable. A variable set to nothing (or to
blanks) is unset, for switches and numbers alike: `NAME= command` is how a
shell unsets it for one command.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping

from .errors import SettingError

log = logging.getLogger("fasta_sm.env")

INDUCTOR_SWITCH = "FASTA_SM_INDUCTOR"
NPU_SWITCH = "FASTA_SM_NPU"
COMPILE_POOL_SETTINGS = frozenset({"FASTA_COMPILE_WORKERS", "FASTA_PREWARM", "FASTA_WORKER_TORCH"})
"""The live Triton compile pool's variables (fasta_sm.triton): FASTA_* names that are not policy knobs."""

YES = frozenset({"1", "true", "yes", "on"})
NO = frozenset({"0", "false", "no", "off"})


def parse_switch(name: str, text: str) -> bool:
    """`text` (the value of `name`) as a yes or a no; anything else is a SettingError."""
    value = text.strip().lower()
    if value in YES:
        return True
    if value in NO:
        return False
    raise SettingError(f"${name}={text!r} is neither a yes (1, true, yes, on) nor a no (0, false, no, off)")


def env_value(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of `name` in `environ` (the process's environment by default); None when unset or blank."""
    text = (os.environ if environ is None else environ).get(name)
    return text if text is not None and text.strip() else None


def env_switch(name: str, default: bool = False) -> bool:
    """The switch `name`: `default` when unset or empty."""
    text = env_value(name)
    return default if text is None else parse_switch(name, text)


def switch_or_off(name: str) -> bool:
    """The switch `name` where an error must not escape (torch's entry points, which run inside `import torch`):
    a bad value reads as unset, with one warning per value."""
    try:
        return env_switch(name)
    except SettingError as error:
        _warn_off(str(error))
        return False


@functools.cache
def _warn_off(message: str) -> None:
    log.warning("%s: ignored, as if unset (the environment does not switch fasta-sm on)", message)
