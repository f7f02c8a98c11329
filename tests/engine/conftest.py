"""Fixtures for the engine specs: a small replay table in the shared format, a store."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from engine_harness import synthetic_table, write_table

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.store import StateStore


@pytest.fixture
def table_data() -> dict:
    """The synthetic table as a dict (48 configs, 5 recorded failures, 2 repeats each)."""
    return synthetic_table()


@pytest.fixture
def table_path(tmp_path: Path, table_data: dict) -> Path:
    """The synthetic table written to tmp_path as `mm_synth.json`."""
    return write_table(tmp_path / "mm_synth.json", table_data)


@pytest.fixture
def table(table_path: Path):
    return load_table(table_path)


@pytest.fixture
def backend(table) -> ReplayBackend:
    return ReplayBackend(table, noise=True, seed=7)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "states"


@pytest.fixture
def store(state_dir: Path) -> StateStore:
    return StateStore(state_dir, lock_timeout_s=5.0)


@pytest.fixture
def store_warnings(caplog: pytest.LogCaptureFixture):
    """The warnings the store logs, as messages."""
    caplog.set_level(logging.WARNING, logger="fasta_sm")

    def messages() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "fasta_sm.store" and r.levelno >= logging.WARNING]

    return messages
