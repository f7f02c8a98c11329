"""Shared fixtures: a small replay table in the shared format, and a private state dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from toy_table import write_table

if not os.path.exists("/dev/nvidiactl"):
    # Triton reads TRITON_INTERPRET when it is first imported, by any test module:
    # without a GPU, every Triton test runs in its CPU interpreter.
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def table_file(tmp_path: Path) -> Path:
    return write_table(tmp_path / "toy_mm.json")


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "states"
