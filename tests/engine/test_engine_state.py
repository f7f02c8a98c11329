"""Specs for TuneState (msgpack, exact round trip, versioned) and Config identity."""

from __future__ import annotations

import math
import re
import struct

import msgpack
import numpy as np
import pytest
from engine_harness import seal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fasta_sm.config import Config, configs_hash
from fasta_sm.errors import ConfigError, StateFileError
from fasta_sm.state import (
    SCHEMA_VERSION,
    Cost,
    RoundRecord,
    TuneState,
    encode_rng,
    pack_state,
    remember_configs,
    sample_mean,
    unpack_state,
)

# --------------------------------------------------------------------------- strategies

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,7}", fullmatch=True)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
nonneg = st.floats(min_value=0.0, max_value=1e12, allow_nan=False)
positive = st.floats(min_value=0.0, max_value=1e12, allow_nan=False, exclude_min=True)  # a timing takes time
int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
scalar = st.one_of(st.booleans(), st.integers(-(2**31), 2**31), finite, text)

msgpack_value = st.recursive(
    st.one_of(st.none(), st.booleans(), int64, finite, text, st.binary(max_size=8)),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(text, children, max_size=4)),
    max_leaves=12,
)

configs_strategy = st.lists(
    st.builds(
        Config,
        kwargs=st.dictionaries(names, scalar, max_size=4),
        num_warps=st.integers(1, 32),
        num_stages=st.integers(1, 8),
        options=st.dictionaries(names, scalar, max_size=2),
    ),
    min_size=1,
    max_size=6,
    unique_by=lambda c: c.identity,
)


@st.composite
def round_records(draw, n: int, position: int, batch: list[int] | None = None, retime: bool | None = None):
    """The record of round `position` (R1, then R2_1, …); the last one's batch and retime are the state's."""
    if batch is None:
        batch = draw(st.lists(st.integers(0, n - 1), max_size=n, unique=True))
    return RoundRecord(
        phase="R1" if position == 0 else "R2",
        round=position,
        batch=batch,
        reason=draw(text),
        retime=draw(st.booleans()) if retime is None else retime,
        predicted_us=draw(st.just([]) | st.lists(finite, min_size=len(batch), max_size=len(batch))),
        started=draw(nonneg),
        finished=draw(st.none() | nonneg),
        compile_s=draw(nonneg),
        benchmark_s=draw(nonneg),
        policy_s=draw(nonneg),
    )


plain_value = st.recursive(
    st.one_of(st.none(), st.booleans(), int64, finite, text),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(text, children, max_size=4)),
    max_leaves=12,
)


@st.composite
def tune_states(draw) -> TuneState:
    configs = draw(configs_strategy)
    n = len(configs)
    index = st.integers(0, n - 1)
    durations = draw(st.dictionaries(index, st.lists(positive, min_size=1, max_size=3), max_size=n))
    failed = draw(st.dictionaries(index.filter(lambda i: i not in durations), text, max_size=n))
    position = draw(st.sampled_from(
        [("R1", "compile"), ("R1", "benchmark"), ("R1", "refine"),
         ("R2", "compile"), ("R2", "benchmark"), ("R2", "refine")]
        + ([("DONE", "done")] if durations else [])
    ))
    means = {i: sample_mean(v) for i, v in durations.items()}
    best = min(means, key=lambda i: (means[i], i)) if durations else None
    measured = sorted(set(durations) | set(failed))
    if position[1] == "refine":  # every config of the batch timed, or failed
        pending = draw(st.lists(st.sampled_from(measured), min_size=1, max_size=n, unique=True)) if measured else []
    else:
        pending = draw(st.lists(index, min_size=0 if position[0] == "DONE" else 1, max_size=n, unique=True))
    if position[1] == "refine" and not pending:
        position = ("R1", "compile")
        pending = [0]
    compiled = draw(st.dictionaries(index, nonneg, max_size=n))
    compiled.update({i: 0.0 for i in durations if i not in compiled})  # a config is timed once compiled
    timed_candidates = [i for i in pending if i in durations or i in failed]
    round_done = draw(st.lists(st.sampled_from(timed_candidates), max_size=n, unique=True)) if timed_candidates else []
    if position[1] in ("benchmark", "refine"):  # the machine's invariants at those steps
        compiled.update({i: 0.0 for i in pending if i not in failed})
    if position[1] == "refine":
        round_done += [i for i in pending if i not in round_done]
    outcomes = sorted(set(compiled) | set(failed))
    carried_taken = {
        i: min(taken, len(durations.get(i, ()))) if i not in failed else taken
        for i, taken in draw(st.dictionaries(st.sampled_from(outcomes), st.integers(0, 3), max_size=n)).items()
    } if outcomes else {}
    # results carried from a superseded tune: for configs not tried yet, and for configs compiled from their entry
    # whose timings wait there (carried_taken says 0 for those)
    untried = [i for i in range(n) if i not in compiled and i not in failed and i not in durations]
    waiting = [i for i in compiled if i not in failed and i not in durations]
    ran = st.builds(lambda c, d: {"compile_s": c, "durations_us": d, "error": None}, nonneg,
                    st.lists(positive, max_size=3))
    carried = draw(st.dictionaries(st.sampled_from(untried), ran | st.builds(lambda e: {"error": e}, text),
                                   max_size=n)) if untried else {}
    for i in draw(st.lists(st.sampled_from(waiting), unique=True)) if waiting else []:
        carried[i] = draw(st.builds(lambda c, d: {"compile_s": c, "durations_us": d, "error": None}, nonneg,
                                    st.lists(positive, min_size=1, max_size=3)))
        carried_taken[i] = 0
    retime = draw(st.booleans())
    if position[0] == "DONE":
        count = draw(st.integers(0, 3))
        rounds = [draw(round_records(n, k)) for k in range(count)]
        pending, round_done = [], []
    else:
        count = 1 if position[0] == "R1" else draw(st.integers(2, 4))
        rounds = [draw(round_records(n, k)) for k in range(count - 1)]
        rounds.append(draw(round_records(n, count - 1, batch=pending, retime=retime)))
    return TuneState(
        key=draw(text),
        kernel=draw(text),
        configs=configs,
        policy=draw(st.sampled_from(["exhaustive", "random", "fasta"])),
        policy_params=draw(st.dictionaries(text, plain_value, max_size=3)),
        seed=draw(st.integers(0, 2**32)),
        backend=draw(text),
        phase=position[0],
        round=rounds[-1].round if rounds else 0,
        step=position[1],
        pending=pending,
        retime=retime,
        round_done=round_done,
        compiled=compiled,
        failed=failed,
        durations=durations,
        carried=carried,
        carried_taken=carried_taken,
        policy_state=draw(st.dictionaries(text, msgpack_value, max_size=4)),
        rng_state=encode_rng(np.random.default_rng(draw(st.integers(0, 2**64))))
        if rounds or draw(st.booleans()) else {},  # empty only before the first decision
        best=best,
        best_us=None if best is None else means[best],
        predicted_us=draw(st.just([]) | st.lists(finite, min_size=n, max_size=n)),
        rounds=rounds,
        cost=Cost(draw(nonneg), draw(nonneg), draw(nonneg)),
        stop_reason=draw(st.none() | text),
        last_error=draw(st.none() | text),
        restarts=draw(st.lists(text, max_size=2)),
        created=draw(nonneg),
        updated=draw(nonneg),
    )


def sample_state(**changes) -> TuneState:
    configs = [Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (2, 4)]
    state = TuneState(
        key="mm:fp16:1024", kernel="mm", configs=configs, policy="random",
        policy_params={"budget": 0.5}, seed=3, backend="replay mm",
        phase="R2", round=1, step="benchmark", pending=[1, 4], round_done=[1],
        compiled={0: 0.5, 1: 0.25, 4: 0.75}, failed={2: "OutOfResources: shared memory"},
        durations={0: [10.5], 1: [9.25, 9.5]}, policy_state={"seen": [0, 1], "alpha": 0.1},
        rng_state=encode_rng(np.random.default_rng(3)), best=1, best_us=9.375,
        predicted_us=[10.0, 9.0, math.inf, 12.0, 8.0, 11.0],
        rounds=[
            RoundRecord(phase="R1", round=0, batch=[0, 1, 2], reason="sample", started=1.0, finished=2.0),
            RoundRecord(phase="R2", round=1, batch=[1, 4], reason="guided", started=2.0),
        ],
        cost=Cost(1.5, 0.375, 0.001), created=1700000000.25, updated=1700000001.5,
    )
    for name, value in changes.items():
        setattr(state, name, value)
    return state


# --------------------------------------------------------------------------- specs


def test_a_configs_mean_adds_its_timings_left_to_right_on_every_python():
    # a compensated sum (Python 3.12's sum()) would give 1.0000000000000002 / 3 and
    # disagree with the best_us stored by earlier versions
    assert sample_mean([1.0, 1e-16, 1e-16]) == 1.0 / 3


def test_a_state_round_trips_through_msgpack_exactly():
    state = sample_state()
    blob = pack_state(state)
    loaded = unpack_state(blob)
    assert loaded.configs == state.configs
    assert loaded.predicted_us == state.predicted_us  # inf survives
    assert {k: v for k, v in vars(loaded).items() if k != "predicted_us"} == {
        k: v for k, v in vars(state).items() if k != "predicted_us"}
    assert pack_state(loaded) == blob


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tune_states())
def test_any_valid_state_round_trips_exactly(state: TuneState):
    blob = pack_state(state)
    loaded = unpack_state(blob)
    assert loaded == state
    assert pack_state(loaded) == blob


any_float = st.floats(width=64)  # NaN and infinities too: a prediction or a policy's figure may be either
wide_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), any_float, text, st.binary(max_size=8)),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(text, int64, st.booleans(), st.none()), children, max_size=4),
    ),
    max_leaves=12,
)


@st.composite
def wide_states(draw) -> TuneState:
    """Valid states holding what `tune_states` leaves out because == cannot compare it or it is rare: NaN and
    infinite predictions, a policy state with such floats, 64-bit unsigned ints and keys that are no text,
    and seeds past 2**32."""
    state = draw(tune_states())
    n = state.n_configs
    state.seed = draw(st.integers(0, 2**64 - 1))
    state.policy_state = draw(st.dictionaries(text, wide_value, max_size=4))
    state.predicted_us = draw(st.just([]) | st.lists(any_float, min_size=n, max_size=n))
    for record in state.rounds:
        if record.predicted_us:
            record.predicted_us = draw(st.lists(any_float, min_size=len(record.batch), max_size=len(record.batch)))
    return state


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wide_states())
def test_any_valid_state_with_non_finite_or_wide_values_round_trips_byte_for_byte(state: TuneState):
    blob = pack_state(state)
    assert pack_state(unpack_state(blob)) == blob


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tune_states())
def test_any_valid_state_written_in_schema_2_loads_knowing_the_compiles_whose_carried_timings_wait(state):
    loaded = unpack_state(schema_2(state))
    assert loaded.carried_taken == {i: 0 for i in state.carried if i in state.compiled}
    assert {k: v for k, v in vars(loaded).items() if k not in ("carried_taken", "schema")} == {
        k: v for k, v in vars(state).items() if k not in ("carried_taken", "schema")}


def test_the_rng_survives_the_round_trip_and_continues_the_same_stream():
    rng = np.random.default_rng(42)
    rng.random(17)
    state = sample_state(rng_state=encode_rng(rng))
    from fasta_sm.state import decode_rng

    restored = decode_rng(unpack_state(pack_state(state)).rng_state)
    assert restored.random(5).tolist() == rng.random(5).tolist()


def test_a_state_is_plain_msgpack_with_its_schema_version():
    data = msgpack.unpackb(pack_state(sample_state()), raw=False, strict_map_key=False)
    assert data["schema"] == SCHEMA_VERSION
    assert data["key"] == "mm:fp16:1024"


@pytest.mark.parametrize("schema", [SCHEMA_VERSION + 1, 0, None, "1", 2.0, True])
def test_loading_checks_the_schema_version(schema):
    data = msgpack.unpackb(pack_state(sample_state()), raw=False, strict_map_key=False)
    if schema is None:
        del data["schema"]
    else:
        data["schema"] = schema
    with pytest.raises(StateFileError, match=r"schema version .*reads versions 1, 2, 3"):
        unpack_state(seal(data), source="some/file.fsm")


@pytest.mark.parametrize(("where", "drop", "says"), [
    ("rounds", "started", "rounds[1]: missing field(s) started"),
    ("rounds", "policy_s", "rounds[1]: missing field(s) policy_s"),
    ("cost", "benchmark_s", "cost: missing field(s) benchmark_s"),
])
def test_a_round_or_the_cost_that_lost_a_field_is_refused_naming_it(where, drop, says):
    """Every field is required at every level: a default would read a lost figure as a measured zero."""
    data = msgpack.unpackb(pack_state(sample_state()), raw=False, strict_map_key=False)
    del (data["rounds"][1] if where == "rounds" else data["cost"])[drop]
    with pytest.raises(StateFileError, match=re.escape(f"some/file.fsm: {says}")):
        unpack_state(seal(data), source="some/file.fsm")


def test_a_round_with_a_field_this_version_does_not_know_is_refused_naming_it():
    data = msgpack.unpackb(pack_state(sample_state()), raw=False, strict_map_key=False)
    data["rounds"][0]["rule"] = "x"
    with pytest.raises(StateFileError, match=re.escape("some/file.fsm: rounds[0]: unknown field(s) rule")):
        unpack_state(seal(data), source="some/file.fsm")


@pytest.mark.parametrize(("change", "says"), [
    (lambda entry: entry.pop("num_stages"), "configs[1]: missing field(s) num_stages"),
    (lambda entry: entry.pop("options"), "configs[1]: missing field(s) options"),
    (lambda entry: entry.update(maxnreg=128), "configs[1]: unknown field(s) maxnreg"),
    (lambda entry: entry.update(num_warps=True), "configs[1].num_warps is bool, expected int"),
], ids=["lost-stages", "lost-options", "unknown-field", "bool-warps"])
def test_a_config_entry_holds_exactly_its_four_fields(change, says):
    """A lost num_stages is not read as 3, and a field this version does not know is not dropped at the next
    checkpoint."""
    data = msgpack.unpackb(pack_state(sample_state()), raw=False, strict_map_key=False)
    change(data["configs"][1])
    with pytest.raises(StateFileError, match=re.escape(f"some/file.fsm: {says}")):
        unpack_state(seal(data), source="some/file.fsm")


def test_a_bit_flipped_in_a_stored_timing_is_caught_by_the_checksum():
    blob = pack_state(sample_state())
    at = blob.index(b"\xcb" + struct.pack(">d", 10.5)) + 1  # config 0's timing
    damaged = blob[:at] + bytes([blob[at] ^ 0x40]) + blob[at + 1:]
    assert msgpack.unpackb(damaged, raw=False, strict_map_key=False)["durations"][0] != [10.5]
    with pytest.raises(StateFileError, match="some/file.fsm: checksum mismatch"):
        unpack_state(damaged, source="some/file.fsm")


def test_a_schema_1_file_loads_without_a_checksum_and_is_written_back_in_todays_schema():
    data = msgpack.unpackb(pack_state(sample_state()), raw=False, strict_map_key=False)
    del data["crc32"], data["carried_taken"]
    data["schema"] = 1
    loaded = unpack_state(msgpack.packb(data, use_bin_type=True))
    assert loaded.schema == 1 and loaded.durations == sample_state().durations
    rewritten = msgpack.unpackb(pack_state(loaded), raw=False, strict_map_key=False)
    assert rewritten["schema"] == SCHEMA_VERSION == 3 and list(rewritten)[-1] == "crc32"


def schema_2(state: TuneState) -> bytes:
    """`state` as this project wrote it before `carried_taken` (schema 2)."""
    data = msgpack.unpackb(pack_state(state), raw=False, strict_map_key=False)
    del data["carried_taken"]
    data["schema"] = 2
    return seal(data)


def test_a_schema_2_file_loads_and_is_written_back_in_schema_3_with_carried_taken():
    loaded = unpack_state(schema_2(sample_state()))
    assert loaded.schema == 2 and loaded.carried_taken == {}
    rewritten = msgpack.unpackb(pack_state(loaded), raw=False, strict_map_key=False)
    assert rewritten["schema"] == 3 and rewritten["carried_taken"] == {}


def test_a_schema_2_file_mid_tune_knows_a_compile_taken_from_a_result_still_carried():
    carried = {4: {"compile_s": 0.75, "durations_us": [8.5], "error": None}}  # #4 compiled from it, not yet timed
    loaded = unpack_state(schema_2(sample_state(carried=carried, carried_taken={4: 0})))
    assert loaded.carried_taken == {4: 0}


def test_a_schema_2_file_with_carried_taken_is_refused():
    data = msgpack.unpackb(pack_state(sample_state()), raw=False, strict_map_key=False)
    data["schema"] = 2
    with pytest.raises(StateFileError, match="a schema 2 file with carried_taken"):
        unpack_state(seal(data), source="some/file.fsm")


def test_a_file_of_todays_schema_without_its_checksum_is_refused():
    data = msgpack.unpackb(pack_state(sample_state()), raw=False, strict_map_key=False)
    del data["crc32"]
    with pytest.raises(StateFileError, match=f"a schema {SCHEMA_VERSION} file without crc32"):
        unpack_state(msgpack.packb(data, use_bin_type=True))


def test_the_checksum_must_be_the_last_field():
    data = msgpack.unpackb(pack_state(sample_state()), raw=False, strict_map_key=False)
    moved = {"crc32": data.pop("crc32"), **data}
    with pytest.raises(StateFileError, match="crc32 is not the last field"):
        unpack_state(msgpack.packb(moved, use_bin_type=True))


@pytest.mark.parametrize("timing", [0.0, -1.0, math.inf, 2e12], ids=["zero", "negative", "infinite", "past the bound"])
def test_a_state_whose_timings_cannot_be_timings_is_refused(timing):
    with pytest.raises(StateFileError, match=r"config #0 has invalid durations"):
        unpack_state(pack_state(sample_state(durations={0: [timing], 1: [9.25, 9.5]})))


def decoded(state: TuneState) -> dict:
    return msgpack.unpackb(pack_state(state), raw=False, strict_map_key=False)


@pytest.mark.parametrize("field", ["rng_state", "policy_state", "configs_hash", "phase", "seed", "round_done"])
def test_a_file_without_one_of_its_fields_is_refused_not_filled_with_a_default(field):
    data = decoded(sample_state())
    del data[field]
    with pytest.raises(StateFileError, match=f"missing field\\(s\\) {field}"):
        unpack_state(seal(data))


def test_an_empty_configs_hash_is_refused_not_computed_again():
    data = decoded(sample_state())
    data["configs_hash"] = ""
    with pytest.raises(StateFileError, match="configs_hash does not match the config list"):
        unpack_state(seal(data))


@pytest.mark.parametrize("second_key", [1, 1.0, True], ids=["int", "float", "bool"])
def test_a_map_that_names_one_config_twice_is_refused(second_key):
    packer = msgpack.Packer(use_bin_type=True)
    entries = [packer.pack(1), packer.pack(0.25), packer.pack(second_key), packer.pack(123.0)]
    twice = packer.pack_map_header(2) + b"".join(entries)
    data = decoded(sample_state())
    with pytest.raises(StateFileError, match="compiled names one config index in two of its 2 entries"):
        unpack_state(seal(data, raw={"compiled": twice}))


@pytest.mark.parametrize("keys", [(1, "1"), ("1", "01")], ids=["int-and-text", "two-texts"])
def test_a_map_whose_keys_name_one_config_once_converted_is_refused(keys):
    data = decoded(sample_state())
    data["durations"] = {0: [10.5], keys[0]: [9.25, 9.5], keys[1]: [25.0]}
    with pytest.raises(StateFileError, match="durations names one config index in two of its 3 entries"):
        unpack_state(seal(data))


def test_a_best_that_is_not_the_fastest_measured_config_is_refused():
    state = sample_state(best=0, best_us=10.5)  # config 1 ran in 9.375 µs
    with pytest.raises(StateFileError, match=r"best is config #0 .* but config #1 was measured faster"):
        unpack_state(pack_state(state))


def test_cost_seconds_whose_sum_overflows_are_refused():
    with pytest.raises(StateFileError, match="cost's seconds add up to more than a number can hold"):
        unpack_state(pack_state(sample_state(cost=Cost(1e308, 1e308, 0.0))))


def test_a_state_whose_rounds_are_not_r1_then_r2_in_order_is_refused():
    rounds = sample_state().rounds
    rounds[1].round = 5
    with pytest.raises(StateFileError, match=r"rounds\[1\] is R2 round 5, expected R2_1"):
        unpack_state(pack_state(sample_state(rounds=rounds)))


def test_a_state_not_at_its_last_round_is_refused():
    with pytest.raises(StateFileError, match="at R2 round 1, but its last round record is R1"):
        unpack_state(pack_state(sample_state(rounds=sample_state().rounds[:1])))


def test_a_pending_batch_other_than_the_last_rounds_is_refused():
    with pytest.raises(StateFileError, match="the pending batch is not R2_1's"):
        unpack_state(pack_state(sample_state(pending=[1, 5], compiled={0: 0.5, 1: 0.25, 4: 0.75, 5: 0.1})))


def test_round_done_listing_a_config_with_no_timing_is_refused():
    with pytest.raises(StateFileError, match="config #4 is listed as timed but has no timing"):
        unpack_state(pack_state(sample_state(round_done=[1, 4])))


def test_a_carried_result_for_a_config_measured_already_is_refused():
    carried = {1: {"compile_s": 1.0, "durations_us": [1.0], "error": None}}
    with pytest.raises(StateFileError, match=r"carried\[1\] is for config #1, measured already"):
        unpack_state(pack_state(sample_state(carried=carried)))


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"compile_s": 1.0, "durations_us": [], "error": None, "extra": 1}, "has unknown field"),
        ({"error": "OutOfResources", "durations_us": [3.0]}, "failed and has timings"),
        ({"durations_us": [3.0]}, "neither an error nor compile seconds"),
    ],
    ids=["unknown-field", "failure-with-timings", "no-compile-seconds"],
)
def test_a_carried_result_that_is_neither_a_failure_nor_a_run_is_refused(entry, why):
    with pytest.raises(StateFileError, match=why):
        unpack_state(pack_state(sample_state(carried={3: entry})))


def test_a_carried_timing_past_the_engines_bound_is_refused():
    carried = {3: {"compile_s": 1.0, "durations_us": [2e12], "error": None}}
    with pytest.raises(StateFileError, match=r"carried\[3\] has invalid durations"):
        unpack_state(pack_state(sample_state(carried=carried)))


def test_a_carried_failure_for_a_config_compiled_already_is_refused():
    with pytest.raises(StateFileError, match=r"carried\[4\] failed, but config #4 is compiled"):
        unpack_state(pack_state(sample_state(carried={4: {"error": "OutOfResources: shared memory"}})))


def test_a_pending_batch_that_lists_a_config_twice_is_refused():
    rounds = [*sample_state().rounds[:1], RoundRecord(phase="R2", round=1, batch=[1, 4, 4], reason="guided",
                                                      started=2.0)]
    with pytest.raises(StateFileError, match="the pending batch lists a config twice"):
        unpack_state(pack_state(sample_state(pending=[1, 4, 4], rounds=rounds)))


def test_a_compile_taken_from_a_carried_result_that_carried_taken_does_not_name_is_refused():
    carried = {4: {"compile_s": 0.75, "durations_us": [8.5], "error": None}}
    with pytest.raises(StateFileError, match=r"config #4 is compiled from carried\[4\], which carried_taken does"):
        unpack_state(pack_state(sample_state(carried=carried)))


def test_carried_taken_naming_a_config_neither_compiled_nor_failed_is_refused():
    with pytest.raises(StateFileError, match="carried_taken names config #3, neither compiled nor failed"):
        unpack_state(pack_state(sample_state(carried_taken={3: 0})))


@pytest.mark.parametrize("taken", [3, -1])
def test_carried_taken_counting_timings_the_config_cannot_have_is_refused(taken):
    with pytest.raises(StateFileError, match=f"carried_taken says {taken} timings of config #1"):
        unpack_state(pack_state(sample_state(carried_taken={1: taken})))


def test_a_carried_result_for_a_config_compiled_from_it_without_timings_left_is_refused():
    carried = {4: {"compile_s": 0.75, "durations_us": [], "error": None}}
    with pytest.raises(StateFileError, match=r"carried\[4\] is for config #4, compiled already"):
        unpack_state(pack_state(sample_state(carried=carried)))


@pytest.mark.parametrize("value", [math.nan, math.inf, b"\x00", {1: "a"}], ids=["nan", "inf", "bytes", "int-key"])
def test_policy_params_that_no_caller_could_pass_are_refused(value):
    with pytest.raises(StateFileError, match="policy_params"):
        unpack_state(pack_state(sample_state(policy_params={"budget": value})))


@pytest.mark.parametrize("field", ["policy_params", "policy_state"])
def test_lists_nested_deeper_than_any_state_holds_are_refused_naming_the_field(field):
    nested: list = []
    for _ in range(900):
        nested = [nested]
    with pytest.raises(StateFileError, match=f"{field} nests lists or maps more than 32 deep"):
        unpack_state(pack_state(sample_state(**{field: {"hist_bins": nested}})))


def test_writing_a_state_names_this_library_version_whatever_version_read_it():
    from fasta_sm import __version__

    assert decoded(sample_state(library="0.0.1-old"))["library"] == __version__


def test_a_load_error_names_its_source():
    with pytest.raises(StateFileError, match="some/file.fsm"):
        unpack_state(b"\xc1", source="some/file.fsm")


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"predicted_us": [1.0, 2.0]}, "predicted_us has 2 values for 6 configs"),
        ({"rounds": [RoundRecord(phase="R1", round=0, batch=[0, 99], reason="x")]}, "rounds[0].batch"),
        ({"rounds": [RoundRecord(phase="R1", round=0, batch=[0, 6], reason="x")]},
         "rounds[0].batch holds an index outside 0..5"),
        ({"rounds": [RoundRecord(phase="R1", round=0, batch=[0, 1], reason="x", predicted_us=[1.0])]},
         "rounds[0] predicts 1 values for 2 configs"),
        ({"compiled": {0: math.nan}}, "compiled holds"),
        ({"cost": Cost(math.inf, 0.0, 0.0)}, "cost holds"),
        ({"carried": {5: {"compile_s": 0.5, "durations_us": [math.nan]}}}, "carried[5] holds"),
        ({"carried": {5: {"compile_s": 0.5, "durations_us": [-5.0]}}}, "carried[5] holds"),
        ({"best_us": -1.0}, "best_us=-1.0 is not the mean timing of config #1"),
        ({"best_us": None}, "best=1 with best_us=None"),
        ({"failed": {1: "OutOfResources"}}, "config #1 is both failed and measured"),
        ({"compiled": {0: 0.5, 1: 0.25}}, "at R2_1 benchmark config #4 of the batch was never compiled"),
        ({"pending": [], "round_done": []}, "at R2_1 benchmark no config is pending"),
        ({"step": "refine"}, "at R2_1 refine config #4 of the batch was never timed"),
        ({"best": None, "best_us": None}, "2 configs measured but no best"),
        ({"carried": {5: {"compile_s": 0.5, "durations_us": [0.0]}}}, "carried[5] has invalid durations [0.0]"),
        ({"rng_state": {}}, "rng_state is empty after 2 round(s)"),
        ({"updated": math.nan}, "updated is nan, not a time"),
        ({"created": math.inf}, "created is inf, not a time"),
        ({"rounds": [RoundRecord(phase="R1", round=0, batch=[0, 1, 2], reason="x", started=1.0, finished=math.nan)]},
         "rounds[0].finished is nan, not a time"),
    ],
)
def test_a_state_whose_parts_contradict_each_other_is_refused_saying_where(changes, says):
    with pytest.raises(StateFileError, match=re.escape(f"some/file.fsm: {says}")):
        unpack_state(pack_state(sample_state(**changes)), source="some/file.fsm")


def test_a_timing_of_a_config_never_compiled_is_refused():
    # The machine times compiled configs only. Loaded, such a file failed every run for good: a re-time round
    # compiled the config, the compile failed, and a config both failed and measured could not be written.
    with pytest.raises(StateFileError, match=re.escape("some/file.fsm: config #3 is measured but was never compiled")):
        unpack_state(pack_state(sample_state(durations={0: [10.5], 1: [9.25, 9.5], 3: [12.0]})), source="some/file.fsm")


def test_config_identity_ignores_kwarg_order():
    a = Config({"BLOCK_M": 64, "BLOCK_N": 32, "GROUP_M": 8}, num_warps=4, num_stages=3)
    b = Config({"GROUP_M": 8, "BLOCK_N": 32, "BLOCK_M": 64}, num_warps=4, num_stages=3)
    assert a.identity == b.identity
    assert a == b and hash(a.identity) == hash(b.identity)
    assert configs_hash([a]) == configs_hash([b])


@pytest.mark.parametrize("other", [
    Config({"BLOCK_M": 64, "BLOCK_N": 32, "GROUP_M": 8}, num_warps=8, num_stages=3),
    Config({"BLOCK_M": 64, "BLOCK_N": 32, "GROUP_M": 8}, num_warps=4, num_stages=2),
    Config({"BLOCK_M": 64, "BLOCK_N": 32, "GROUP_M": 4}, num_warps=4, num_stages=3),
    Config({"BLOCK_M": 64, "BLOCK_N": 32, "GROUP_M": 8}, num_warps=4, num_stages=3, options={"num_ctas": 2}),
    Config({"BLOCK_M": 64.0, "BLOCK_N": 32, "GROUP_M": 8}, num_warps=4, num_stages=3),
    Config({"BLOCK_M": 64, "BLOCK_N": 32, "GROUP_M": 8, "EVEN_K": True}, num_warps=4, num_stages=3),
])
def test_config_identity_distinguishes_values_launch_options_and_types(other):
    base = Config({"BLOCK_M": 64, "BLOCK_N": 32, "GROUP_M": 8}, num_warps=4, num_stages=3)
    assert base.identity != other.identity
    assert base != other and len({base, other}) == 2  # equality and hashing agree with the identity


def test_a_config_may_have_zero_stages_as_tritons_amd_backend_takes():
    assert Config({"BLOCK": 64}, num_warps=4, num_stages=0).label() == "BLOCK=64 w4 s0"


@pytest.mark.parametrize("changes, says", [
    ({"num_warps": 0}, "num_warps=0 must be a positive int"),
    ({"num_stages": -1}, "num_stages=-1 must be an int ≥ 0"),
    ({"num_warps": 2**31}, "num_warps=2147483648 must be a positive int below 2**31"),
    ({"num_warps": None}, "num_warps=None must be a positive int"),
    ({"kwargs": {"BLOCK": 2**64}}, "BLOCK=18446744073709551616 does not fit in 64 bits"),
])
def test_a_config_a_state_file_could_not_hold_is_refused_naming_the_value(changes, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        Config(**({"kwargs": {"BLOCK": 64}} | changes))


@pytest.mark.parametrize("changes", [{"kwargs": None}, {"kwargs": [("BLOCK", 64)]}, {"options": None}],
                         ids=["no kwargs", "kwargs as pairs", "no options"])
def test_kwargs_or_options_that_are_no_mapping_are_a_config_error_naming_them(changes):
    name, value = next(iter(changes.items()))
    with pytest.raises(ConfigError, match=re.escape(f"config {name}={value!r} must be a mapping")):
        Config(**({"kwargs": {"BLOCK": 64}} | changes))


def test_bytes_after_a_whole_state_are_refused():
    """The checksum covers the map, not what follows it: a file with bytes appended is damaged all the same."""
    with pytest.raises(StateFileError, match="some/file.fsm: not a msgpack state file: more bytes follow its first "
                                             "value .*1 bytes of extra data"):
        unpack_state(pack_state(sample_state()) + b"\xc0", source="some/file.fsm")


def test_configs_hash_depends_on_list_order():
    a, b = Config({"X": 1}), Config({"X": 2})
    assert configs_hash([a, b]) != configs_hash([b, a])


def _plain_pack(state: TuneState) -> bytes:
    from dataclasses import asdict, fields

    data = {f.name: getattr(state, f.name) for f in fields(TuneState)}
    data["configs"] = [c.to_dict() for c in state.configs]
    data["rounds"] = [asdict(r) for r in state.rounds]
    data["cost"] = asdict(state.cost)
    return seal(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tune_states())
def test_a_state_file_is_exactly_the_plain_msgpack_map_of_its_fields(state: TuneState):
    """pack_state splices cached config bytes in; the result must not differ by a byte."""
    assert pack_state(state) == _plain_pack(state)
    assert pack_state(state) == _plain_pack(state)  # second pack: from the cache
    assert _plain_pack(unpack_state(pack_state(state))) == _plain_pack(state)


def test_reloading_a_state_over_the_same_config_list_gives_equal_but_unshared_lists():
    blob = pack_state(sample_state())
    a, b = unpack_state(blob), unpack_state(blob)
    assert a.configs == b.configs and a.configs is not b.configs


def test_a_state_over_a_remembered_config_list_is_read_with_that_list_not_a_decoded_copy():
    """A warm start reads a DONE state over the list its caller holds; decoding it again is most of the read."""
    blob = pack_state(sample_state())
    held = [Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (2, 4)]
    remember_configs(held)
    read = unpack_state(blob)
    assert read.configs == held and all(a is b for a, b in zip(read.configs, held))


def test_a_state_whose_list_differs_from_the_remembered_one_is_decoded_and_checked_as_before():
    remember_configs([Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 128) for w in (2, 4)])
    read = unpack_state(pack_state(sample_state()))
    assert [c.kwargs["BLOCK"] for c in read.configs] == [16, 16, 32, 32, 64, 64]
    assert read.configs_hash == configs_hash(read.configs)


@pytest.mark.parametrize("key", [True, 2.9, "x"])
def test_a_map_key_that_is_no_config_index_is_refused_naming_it(key):
    data = msgpack.unpackb(pack_state(sample_state()), raw=False, strict_map_key=False)
    data["durations"] = {0: [10.5], key: [9.25, 9.5]} if key is True else {**data["durations"], key: [7.0]}
    says = f"some/file.fsm: durations has key {key!r}, not a config index"
    with pytest.raises(StateFileError, match=re.escape(says)):
        unpack_state(seal(data), source="some/file.fsm")


def test_an_rng_state_a_checkpoint_could_not_write_back_is_refused():
    rng_state = {"bit_generator": "SFC64", "state": {"state": [1, 2, 3, 4]}, "has_uint32": 0, "uinteger": 0}
    with pytest.raises(StateFileError, match="SFC64"):
        unpack_state(pack_state(sample_state(rng_state=rng_state)), source="some/file.fsm")


def test_a_launch_option_named_by_no_string_is_a_config_error_not_a_twin_of_its_text():
    with pytest.raises(ConfigError, match=r"option name 1 is not a string"):
        Config({"BLOCK": 16}, options={1: 2})


def test_a_done_state_whose_round_done_or_pending_contradicts_itself_is_refused():
    # docs/state-format.md rejects "a pending batch that lists a config twice" and "a `round_done` that lists a
    # config twice, one off the batch, or one with neither a timing nor a failure", at any position
    done = dict(phase="DONE", step="done", round=1, pending=[], round_done=[], retime=False,
                rounds=[RoundRecord(phase="R1", round=0, batch=[0, 1, 2], reason="sample", started=1.0, finished=2.0),
                        RoundRecord(phase="R2", round=1, batch=[1, 4], reason="guided", started=2.0, finished=3.0)])
    unpack_state(pack_state(sample_state(**done)))  # the DONE state the machine writes loads
    for changes in ({"round_done": [3]}, {"round_done": [1, 1], "pending": [1]}, {"pending": [5, 5]}):
        with pytest.raises(StateFileError, match="twice|off the batch|no timing"):
            unpack_state(pack_state(sample_state(**{**done, **changes})), source="f.fsm")


def test_a_state_written_on_python_312_before_sample_mean_still_reads():
    """Python 3.12+'s sum() compensates: the best_us it stored can differ from sample_mean by one ulp."""
    timings = [1.0, 1e-16, 1e-16]
    best_us_312 = math.fsum(timings) / 3  # 1.0000000000000002 / 3, as sum(timings) / 3 gives on 3.12+
    assert best_us_312 != sample_mean(timings)
    state = sample_state(durations={0: [10.5], 1: timings}, best=1, best_us=best_us_312)
    assert unpack_state(pack_state(state)).best_us == best_us_312


def test_the_timings_given_are_the_carried_ones_of_configs_still_measured():
    state = sample_state(carried_taken={1: 1, 2: 0}, durations={0: [10.5], 1: [9.25, 9.5]})
    assert state.timings_given() == 1
    assert sample_state(carried_taken={2: 0}).timings_given() == 0  # a failed config holds no timing


def test_an_empty_file_is_called_empty():
    with pytest.raises(StateFileError, match=r"^f\.fsm: not a msgpack state file: the file is empty "):
        unpack_state(b"", source="f.fsm")


def test_a_state_cut_short_is_called_cut_short():
    blob = pack_state(sample_state())
    with pytest.raises(StateFileError, match=r"^f\.fsm: not a msgpack state file: its bytes end inside a value"):
        unpack_state(blob[: len(blob) // 2], source="f.fsm")


def test_a_text_file_is_told_from_a_state_by_the_bytes_after_its_first_value():
    with pytest.raises(StateFileError, match=r"^notes\.txt: not a msgpack state file: more bytes follow its first"):
        unpack_state(b"hello\n", source="notes.txt")
