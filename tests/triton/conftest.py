"""Triton tests run on a GPU when there is one, else in Triton's CPU interpreter.

TRITON_INTERPRET must be set before Triton is imported (triton.language's own
helpers are decorated at import), so it is set here, first. Timings under the
interpreter mean nothing: no test asserts a duration's value.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))

from triton_device import HAS_CUDA  # noqa: E402  (the path above first)

if not HAS_CUDA:
    TOO_LATE = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    os.environ["TRITON_INTERPRET"] = "1"
else:
    TOO_LATE = False
pytest.importorskip("triton")


def pytest_collection_modifyitems(config, items):
    if TOO_LATE:
        reason = "triton was imported before TRITON_INTERPRET=1 could be set (set it in the environment)"
        for item in items:
            if "tests/triton/" in str(item.fspath).replace("\\", "/"):
                item.add_marker(pytest.mark.skip(reason=reason))
