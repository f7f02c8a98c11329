"""Numbers read from the environment, one grammar everywhere.

Python's `int()` and `float()` take more than anyone means to type into a
variable: digits grouped by underscores (`1_0`), surrounding spaces, digits
of other scripts (Arabic-Indic `١٠`), and `nan` or `infinity`. A value like
that set by mistake would silently become a setting; so a number here is
written in plain ASCII, and anything else is an error naming the variable
and its value. No numeric setting takes a negative value, so none takes a
sign.
"""

from __future__ import annotations

import math
import re

from .errors import SettingError

_WHOLE = re.compile(r"[0-9]+")
_REAL = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_PLAIN = "ASCII digits (no space, _ or leading sign)"


def whole_from_env(name: str, text: str, least: int = 0) -> int:
    """`text`, the value of $`name`, as a whole number ≥ `least` in ASCII digits; anything else is a SettingError."""
    try:
        value = int(text) if _WHOLE.fullmatch(text) else None
    except ValueError:  # digits past int()'s limit (4300 of them): no setting counts that far
        value = None
    if value is None or value < least:
        raise SettingError(f"${name}={text!r} is not a whole number ≥ {least} in {_PLAIN}")
    return value


def real_from_env(name: str, text: str, *, infinite: bool = False) -> float:
    """`text`, the value of $`name`, as a decimal number ≥ 0 (`0.5`, `.5`, `5`, `1e-3`), or `inf` where
    `infinite`; anything else (`nan`, `1_0`, ` 0.5`) is a SettingError."""
    if infinite and text == "inf":
        return float("inf")
    if not _REAL.fullmatch(text):
        spelt = ", or inf" if infinite else ""
        raise SettingError(f"${name}={text!r} is not a number ≥ 0 in {_PLAIN}, such as 0.5, .5 or 1e-3{spelt}")
    value = float(text)
    if math.isinf(value):  # only `inf` itself means for ever
        raise SettingError(f"${name}={text!r} is too large for a number; write inf where the setting takes it")
    return value
