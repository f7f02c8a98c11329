"""Fuzz the state-file loader: whatever the bytes, it returns a TuneState or raises StateFileError.

Over 11,000 inputs in all: random blobs, valid state files mutated (byte flips,
truncations, insertions, splices), msgpack of random structures, and valid
states with one field replaced by a random value. A blob the loader accepts
must also pack back and load again to the same bytes.
"""

from __future__ import annotations

import logging

import msgpack
import numpy as np
import pytest
from engine_harness import seal, synthetic_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine_state import msgpack_value, sample_state

from fasta_sm.backends.replay import ReplayBackend
from fasta_sm.errors import StateFileError, TuneFailed
from fasta_sm.state import TuneState, pack_state, unpack_state
from fasta_sm.store import StateStore
from fasta_sm.tuner import tune


def fuzz(max_examples: int) -> settings:
    return settings(max_examples=max_examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _seed_blobs() -> list[bytes]:
    """Valid state files at several positions: a hand-made one, and a real tune at three steps."""
    import tempfile
    from pathlib import Path

    from fasta_sm.backends.replay import table_from_dict

    table = table_from_dict(synthetic_table(), "synthetic")
    blobs = [pack_state(sample_state())]
    with tempfile.TemporaryDirectory() as tmp:
        store = StateStore(Path(tmp))
        seen = []
        tune("fuzz", table.kernel, table.configs[:12], ReplayBackend(table, noise=True), policy="exhaustive",
             store=store, chunk_size=4, on_step=lambda s: seen.append(pack_state(s)))
    blobs += [seen[0], seen[len(seen) // 2], seen[-1]]
    return blobs


SEEDS = _seed_blobs()
FIELDS = sorted(msgpack.unpackb(SEEDS[0], raw=False, strict_map_key=False))


def loads_or_rejects(blob: bytes) -> None:
    """The loader's contract, checked on one input."""
    try:
        state = unpack_state(blob, source="fuzz.fsm")
    except StateFileError as exc:
        assert "fuzz.fsm" in str(exc)
        return
    assert isinstance(state, TuneState)
    again = pack_state(state)
    assert pack_state(unpack_state(again)) == again


@st.composite
def mutated(draw) -> bytes:
    blob = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        if not blob:
            break
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "splice", "set"]))
        at = draw(st.integers(0, len(blob) - 1))
        if kind == "flip":
            blob[at] ^= draw(st.integers(1, 255))
        elif kind == "set":
            blob[at] = draw(st.sampled_from([0x00, 0xC0, 0xC1, 0xC2, 0xC3, 0xCC, 0xDC, 0xDE, 0xFF, 0x7F, 0x80]))
        elif kind == "truncate":
            del blob[at:]
        elif kind == "insert":
            blob[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del blob[at:at + draw(st.integers(1, 8))]
        else:
            other = draw(st.sampled_from(SEEDS))
            blob = blob[:at] + other[draw(st.integers(0, len(other) - 1)):]
    return bytes(blob)


@st.composite
def field_replaced(draw) -> bytes:
    data = msgpack.unpackb(draw(st.sampled_from(SEEDS)), raw=False, strict_map_key=False)
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(FIELDS))
        if draw(st.integers(0, 9)) == 0:
            data.pop(name, None)
        else:
            data[name] = draw(msgpack_value | st.integers(-1, 60) | st.sampled_from(["R1", "R2", "DONE", "done"]))
    return seal(data, use_bin_type=draw(st.booleans()))


@fuzz(3000)
@given(st.binary(max_size=512))
def test_random_bytes_load_or_raise_state_file_error(blob):
    loads_or_rejects(blob)


@fuzz(4500)
@given(mutated())
def test_mutated_state_files_load_or_raise_state_file_error(blob):
    loads_or_rejects(blob)


@fuzz(2500)
@given(field_replaced())
def test_states_with_a_field_of_the_wrong_kind_load_or_raise_state_file_error(blob):
    loads_or_rejects(blob)


@fuzz(1000)
@given(msgpack_value | st.dictionaries(st.sampled_from(FIELDS), msgpack_value))
def test_msgpack_of_random_structures_loads_or_raises_state_file_error(value):
    loads_or_rejects(msgpack.packb(value, use_bin_type=True))


def test_a_state_file_cannot_make_the_loader_call_into_numpy_random():
    """`rng_state.bit_generator` names a class to build; only bit generators may be named."""
    data = msgpack.unpackb(SEEDS[0], raw=False, strict_map_key=False)
    data["rng_state"] = {"bit_generator": "seed", "state": {}}
    before = np.random.get_state()
    with pytest.raises(StateFileError):
        unpack_state(seal(data))
    after = np.random.get_state()
    assert before[0] == after[0] and (before[1] == after[1]).all() and before[2:] == after[2:]


@fuzz(300)
@given(blob=mutated() | field_replaced())
def test_the_store_quarantines_or_uses_any_file_and_never_raises(blob, tmp_path_factory, caplog):
    caplog.set_level(logging.WARNING)
    caplog.clear()
    store = StateStore(tmp_path_factory.mktemp("fuzz"))
    key = "fuzz"
    store.file_for(key).write_bytes(blob)
    state = store.load(key)
    if state is None:
        assert len(list(store.path.glob("*.corrupt-*"))) == 1
        assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    else:
        assert state.key == key


@fuzz(300)
@given(blob=mutated() | field_replaced())
def test_a_tune_over_any_file_finishes_with_a_winner(blob, tmp_path_factory):
    """Whatever was on disk, the tune finishes: a file it cannot use is set aside, never an error.

    The one exception is a sound file that records a failure for every config
    it tried, where the policy stops: the tune then says that no config ran.
    """
    from fasta_sm.backends.replay import table_from_dict

    table = table_from_dict(synthetic_table(), "synthetic")
    store = StateStore(tmp_path_factory.mktemp("fuzz"), lock_timeout_s=5)
    store.file_for("fuzz").write_bytes(blob)
    try:
        on_disk = unpack_state(blob)
    except StateFileError:
        on_disk = None
    try:
        result = tune("fuzz", table.kernel, table.configs[:12], ReplayBackend(table, noise=True),
                      policy="exhaustive", store=store, chunk_size=4)
    except TuneFailed as failed:
        assert on_disk is not None and on_disk.failed and not on_disk.durations, failed
        return
    assert result.state.done and result.state.best is not None
