"""How figures read in `show`, `ls` and `report`."""

from __future__ import annotations

from click.testing import CliRunner

from fasta_sm.cli import main
from fasta_sm.render import format_us, human_age, tune_label
from fasta_sm.store import StateStore


def test_a_duration_that_rounds_to_a_thousand_microseconds_reads_in_milliseconds():
    assert format_us(999.996) == "1.000 ms" and format_us(999.99) == "999.99 µs"


def test_an_age_reads_in_whole_units_rounded_down():
    assert [human_age(s) for s in (59.7, 3599, 86399, 90000)] == ["59s", "59m", "23h", "1d"]


def test_a_budget_edited_by_hand_into_text_is_labelled_not_a_crash(table_file, state_dir):
    CliRunner().invoke(main, ["tune", "--replay", str(table_file), "--policy", "random", "--budget", "0.5",
                              "--state-dir", str(state_dir)], catch_exceptions=False)
    (path,) = StateStore(state_dir).state_files()
    state = StateStore.read(path)
    assert tune_label(state) == "random seed 0 budget 0.5"
    state.policy_params["budget"] = "abc"
    assert tune_label(state) == "random seed 0 budget 'abc'"
