"""The states/ corpus: every state file ever shipped still loads and renders every recorded field the same.

A format change that breaks old files fails here; a schema change must add a
migration and new corpus files, never edit the old ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fasta_sm.render import state_to_json
from fasta_sm.state import READABLE_SCHEMAS
from fasta_sm.store import StateStore

CORPUS = Path(__file__).resolve().parents[2] / "states"
STATE_FILES = sorted(CORPUS.glob("*.fsm"))


def test_the_corpus_is_not_empty():
    assert len(STATE_FILES) >= 8


ADDED_WITHIN_SHOW_1 = {"round_done", "carried_taken"}
"""Top-level fields `show --json` gained after the renderings were recorded (allowed within a format version)."""


def recorded_in(recorded, rendered, added=frozenset()) -> bool:
    """`rendered` holds every field of `recorded` with the same value, and no other field but `added`."""
    if isinstance(recorded, dict):
        return (isinstance(rendered, dict) and set(rendered) - set(recorded) <= added
                and all(key in rendered and recorded_in(value, rendered[key]) for key, value in recorded.items()))
    if isinstance(recorded, list):
        same_length = isinstance(rendered, list) and len(recorded) == len(rendered)
        return same_length and all(map(recorded_in, recorded, rendered))
    return type(recorded) is type(rendered) and recorded == rendered  # 0 is no false, 3.0 no index 3


@pytest.mark.parametrize("path", STATE_FILES, ids=[p.stem for p in STATE_FILES])
def test_every_corpus_file_renders_as_recorded(path: Path):
    recorded = json.loads(path.with_suffix(".json").read_text())
    rendered = json.loads(json.dumps(state_to_json(StateStore.read(path)), allow_nan=False))  # as scripts read it
    assert recorded_in(recorded, rendered, ADDED_WITHIN_SHOW_1), "a new field is declared here and in state-format.md"


def test_every_schema_this_version_reads_has_files_in_the_corpus():
    assert {StateStore.read(path).schema for path in STATE_FILES} == set(READABLE_SCHEMAS)


def test_a_rendering_whose_values_changed_type_does_not_pass_for_the_recorded_one():
    # docs/state-format.md: the test "compares every field of the recorded rendering"; `show --json` printing
    # `0` for `false`, or `3.0` for an index `3`, changes the format scripts read
    assert not recorded_in({"retime": False}, {"retime": 0})
    assert not recorded_in({"rounds": [{"batch": [3]}]}, {"rounds": [{"batch": [3.0]}]})
