"""The states/ corpus: every state file ever shipped still loads and renders the same.

A format change that breaks old files fails here; a schema change must add a
migration and new corpus files, never edit the old ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fasta_sm.render import state_to_json
from fasta_sm.store import StateStore

CORPUS = Path(__file__).resolve().parents[2] / "states"
STATE_FILES = sorted(CORPUS.glob("*.fsm"))


def test_the_corpus_is_not_empty():
    assert len(STATE_FILES) >= 8


@pytest.mark.parametrize("path", STATE_FILES, ids=[p.stem for p in STATE_FILES])
def test_every_corpus_file_renders_as_recorded(path: Path):
    expected = json.loads(path.with_suffix(".json").read_text())
    assert state_to_json(StateStore.read(path)) == expected

