"""The corpus' live H200 square-matmul tune explains, from the file alone, the configs its spill rules put out of
reach: the rule, the config that ran slow, and the round after which it did."""

from __future__ import annotations

from pathlib import Path

from fasta_sm.explain import explain_configs
from fasta_sm.store import StateStore

LIVE_SPILL = Path(__file__).resolve().parents[2] / "states" / "v3-live-h200-triton-mm_fp16-fasta-spill.fsm"


def story(index: int):
    (only,) = explain_configs(StateStore.read(LIVE_SPILL), [index])
    return only


def test_a_far_spill_names_the_slow_config_and_spill_load():
    far = story(84)
    assert far.status == "untried"
    assert "tile per warp of #119" in far.ruled_out and "spill_load 5" in far.ruled_out
    assert far.ruled_out_after[0] == "R2_7"
    assert far.ruled_out_also == []


def test_a_register_spill_names_the_slow_config_and_cell_spill():
    spill = story(117)
    assert "registers per thread of #119" in spill.ruled_out and "cell_spill 3" in spill.ruled_out
    assert spill.ruled_out_after[0] == "R2_7"


def test_the_slow_config_behind_both_rules_was_measured_in_the_round_after_which_they_fired():
    slow = story(119)
    assert slow.status == "measured"
    assert any(line.startswith("measured in R2_7:") and "+449.33 %" in line for line in slow.lines)


def test_a_config_past_a_failure_names_the_failed_config():
    beyond = story(80)
    assert "resources of #83, which failed" in beyond.ruled_out


def test_a_config_both_spill_rules_hold_names_the_far_spill_after_the_spill():
    both = story(117)
    assert len(both.ruled_out_also) == 1
    assert "tile per warp of #119" in both.ruled_out_also[0] and "spill_load 5" in both.ruled_out_also[0]
