"""The recorded data set: what the policy issue asks of the shipped tables, and that every recording is sound."""

from __future__ import annotations

from pathlib import Path

import pytest

from fasta_sm.backends.replay import load_table
from fasta_sm.data import tables_dir

SHIPPED = sorted(tables_dir().glob("*.json"))
BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
HELD_OUT = sorted(BENCHMARKS.glob("tables_heldout*/*.json"))
SUPERSEDED = BENCHMARKS / "tables_superseded"
EARLY_SHARED_MEMORY_STOP = "2026-12-01T21:00"  # UTC: the first recording with the compile workers' early stop


def test_at_least_ten_tables_ship():
    assert len(SHIPPED) >= 10


def test_every_table_was_recorded_on_an_h200():
    assert {load_table(path).meta["device"] for path in SHIPPED} == {"NVIDIA H200"}


def test_the_spaces_run_from_about_fifty_to_over_a_thousand_configs():
    sizes = [len(load_table(path).configs) for path in SHIPPED]
    assert min(sizes) <= 80 and max(sizes) > 1000


@pytest.mark.parametrize(
    "kind",
    ["mm_fp16", "mm_bf16", "mm_skinny_fp16", "mm_skinny_bf16", "row_sum", "rmsnorm", "softmax", "attention",
     "add_gelu", "transpose"],
)
def test_each_kind_of_kernel_the_issue_names_has_a_table(kind):
    assert any(path.stem.startswith(kind) for path in SHIPPED)


def test_at_least_two_are_needles_with_at_most_three_configs_within_five_percent():
    assert sum(load_table(path).within(0.05) <= 3 for path in SHIPPED) >= 2


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.stem)
def test_every_config_that_ran_was_timed_twice(path):
    table = load_table(path)
    assert {len(samples) for samples, error in zip(table.samples_us, table.errors) if error is None} == {2}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.stem)
def test_no_compile_time_is_a_load_from_tritons_cache(path):
    assert load_table(path).cache_hits() == 0


@pytest.mark.parametrize("path", HELD_OUT, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_no_held_out_compile_time_is_a_load_from_tritons_cache(path):
    assert load_table(path).cache_hits() == 0


@pytest.mark.parametrize("path", SHIPPED + HELD_OUT, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_no_config_was_timed_through_a_disturbance(path):
    assert load_table(path).disturbed() == 0


def test_the_superseded_recording_is_flagged_for_its_cache_hits():
    assert load_table(SUPERSEDED / "mm_skinny_fp16_m64_2026-11-30.json").cache_hits() == 24


@pytest.mark.parametrize(
    ("recording", "disturbed"), [("transpose_fp32_2026-12-01.json", 30), ("mm_skinny_fp16_m64_2026-12-01.json", 1)]
)
def test_the_superseded_recordings_are_flagged_for_their_disturbed_timings(recording, disturbed):
    assert load_table(SUPERSEDED / recording).disturbed() == disturbed


def test_every_shipped_table_with_failing_configs_was_recorded_with_the_workers_early_shared_memory_stop():
    """A config past the device's shared memory is charged what a tune now pays for it, the compile up to the
    stop, not a whole compile (docs/recording.md): its table was recorded after the stop landed."""
    tables = [load_table(path) for path in SHIPPED]
    recorded = [table.meta["recorded_at"] for table in tables if any(error is not None for error in table.errors)]
    assert recorded and min(recorded) >= EARLY_SHARED_MEMORY_STOP
