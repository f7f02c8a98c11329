"""`fasta-sm show --config`: one config's part in a tune, and why an untried one was never measured."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.cli import main
from fasta_sm.data import tables_dir
from fasta_sm.explain import explain_configs, observed_after_rounds
from fasta_sm.machine import Tune
from fasta_sm.policies.fasta import FastaPolicy
from fasta_sm.policies.fasta.feasibility import resource_pressure
from fasta_sm.policies.fasta.features import extract_features
from fasta_sm.store import StateStore

CORPUS = Path(__file__).resolve().parents[2] / "states"
MID_ROUND = CORPUS / "v1-r2-benchmark.fsm"  # R2_2 benchmark, #132 and #133 in flight
WITH_FAILURES = CORPUS / "v1-done-with-failures.fsm"  # the GELU matmul, four configs out of shared memory


def show(path: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["show", str(path), *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def story_lines(path: Path, index: int) -> list[str]:
    [story] = explain_configs(StateStore.read(path), [index])
    return story.lines


def test_the_winner_is_named_the_winner_with_its_round_and_timings():
    state = StateStore.read(WITH_FAILURES)
    [line] = story_lines(WITH_FAILURES, state.best)
    count = len(state.durations[state.best])
    assert count > 1 and line.startswith("first measured in R") and f": {count} timings, " in line
    assert "the winner (fastest of 18 measured)" in line


def test_a_measured_config_gives_its_gap_to_the_best_and_its_rank():
    state = StateStore.read(WITH_FAILURES)
    second = sorted(state.durations, key=lambda i: (state.mean_us(i), i))[1]
    gap = (state.mean_us(second) / state.best_us - 1) * 100
    [line] = story_lines(WITH_FAILURES, second)
    assert f"+{gap:.2f} % from the best (2nd fastest of 18 measured)" in line


def test_a_failed_config_gives_its_round_and_its_error():
    state = StateStore.read(WITH_FAILURES)
    [line] = story_lines(WITH_FAILURES, 107)
    assert line == f"failed in R1: {state.failed[107]}"


def test_a_config_of_the_round_in_flight_is_not_timed_yet():
    assert story_lines(MID_ROUND, 133) == ["in the round in flight (R2_2), not timed yet"]


def test_an_untried_config_above_a_failure_names_the_failure_that_rules_it_out():
    state = StateStore.read(WITH_FAILURES)
    space = extract_features(state.configs)
    pressure = resource_pressure(space.names, space.levels)
    ruled = {}
    for story in explain_configs(state, [i for i in range(state.n_configs) if i not in state.durations]):
        if story.ruled_out and story.ruled_out.startswith("needs at least the resources of #"):
            ruled[story.index] = int(story.ruled_out.split("#")[1].split(",")[0])
    assert ruled, "no config was ruled out by a failure: the test checks nothing"
    for index, culprit in ruled.items():
        assert culprit in state.failed
        assert np.all(pressure[index] >= pressure[culprit]), f"#{index} is not above #{culprit}"


def test_an_untried_config_gives_the_final_models_prediction_and_its_rank_among_the_untried():
    state = StateStore.read(WITH_FAILURES)
    untried = [i for i in range(state.n_configs) if i not in state.durations and i not in state.failed]
    likeliest = min(untried, key=lambda i: (state.predicted_us[i], i))
    [story] = explain_configs(state, [likeliest])
    assert story.status == "untried" and story.predicted_us == state.predicted_us[likeliest]
    assert f"(fastest of the {len(untried)} untried by that prediction)" in story.lines[0]


def test_an_untried_config_no_rule_reaches_says_nothing_of_rules():
    state = StateStore.read(WITH_FAILURES)
    free = [s for s in explain_configs(state, list(range(state.n_configs))) if s.status == "untried"
            and s.ruled_out is None]
    assert free, "every untried config was ruled out: the test checks nothing"
    assert all(len(story.lines) == 1 for story in free)


def test_a_tune_whose_policy_has_no_rules_names_none():
    exhaustive = StateStore.read(CORPUS / "v1-done-exhaustive.fsm")
    stories = explain_configs(exhaustive, list(range(exhaustive.n_configs)))
    assert all(story.ruled_out is None for story in stories)


def test_a_policy_that_cannot_be_rebuilt_leaves_the_story_and_says_why_the_rules_are_missing():
    state = StateStore.read(WITH_FAILURES)
    broken = replace(state, policy_state={**state.policy_state, "version": 99})
    untried = next(i for i in range(state.n_configs) if i not in state.durations and i not in state.failed)
    [story] = explain_configs(broken, [untried])
    assert story.lines[0].startswith("never tried; the final model predicts ")
    assert story.lines[1].startswith("the 'fasta' policy could not be rebuilt from the state to read its rules: ")
    assert "state version 99" in story.lines[1]


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.fsm")), ids=lambda p: p.name)
def test_every_config_of_every_corpus_state_has_a_story(path):
    state = StateStore.read(path)
    stories = explain_configs(state, list(range(state.n_configs)))
    assert [s.index for s in stories] == list(range(state.n_configs))
    assert all(s.lines and "could not be rebuilt" not in " ".join(s.lines) for s in stories)


def test_show_config_prints_the_tune_in_a_line_then_each_story():
    out = show(WITH_FAILURES, "--config", "107", "--config", "0")
    lines = out.splitlines()
    assert lines[1].split()[:2] == ["kernel", "mm_bf16_gelu_4096"]
    assert any(line.startswith("#107") and "(failed)" in line for line in lines)
    assert any(line.startswith("#0 ") for line in lines)
    assert "Rounds" not in out  # the focused view, not the whole state


def test_show_config_json_adds_the_stories_to_the_documented_form():
    plain = json.loads(show(WITH_FAILURES, "--json"))
    told = json.loads(show(WITH_FAILURES, "--json", "--config", "107"))
    assert {k: v for k, v in told.items() if k != "explained"} == plain
    [story] = told["explained"]
    assert story["index"] == 107 and story["status"] == "failed" and story["ruled_out"] is None
    assert set(story) == {"index", "config", "status", "lines", "predicted_us", "ruled_out", "ruled_out_after",
                          "ruled_out_also"}
    assert story["ruled_out_also"] == []


def test_show_config_json_lists_the_other_rules_after_ruled_out():
    [story] = json.loads(show(WITH_FAILURES, "--json", "--config", "160"))["explained"]
    assert story["ruled_out"] == "needs at least the resources of #142, which failed"
    assert story["ruled_out_also"] == [
        "needs more shared memory than the device has, by the figures of #107's failure"
    ]


@pytest.mark.parametrize("index", ["216", "-1"])
def test_a_config_outside_the_list_is_an_error_naming_the_range(index):
    result = CliRunner().invoke(main, ["show", str(WITH_FAILURES), "--config", index])
    assert result.exit_code != 0
    assert f"--config {index}: config #{index} is not one of the tune's 216 configs (#0 to #215" in result.output


class Spy(FastaPolicy):
    """The fasta policy, keeping what each refine saw."""

    seen: list[tuple[np.ndarray, dict[int, str]]]

    def refine(self, observed, rng):
        self.seen.append((observed.duration_us.copy(), dict(observed.failures)))
        return super().refine(observed, rng)


def spied_tune(name: str, seed: int):
    table = load_table(tables_dir() / f"{name}.json")
    n = len(table.configs)
    policy = Spy(table.configs)
    policy.seen = []
    tune = Tune.start(key=f"spied/{name}/{seed}", kernel=table.kernel, configs=table.configs,
                      backend=ReplayBackend(table, noise=True, seed=seed), policy=policy, policy_params={},
                      seed=seed, chunk_size=n, benchmark_chunk=n)
    try:
        return tune.drive(), policy.seen
    finally:
        tune.close()


@pytest.mark.parametrize("name", ["mm_bf16_gelu_4096", "attention_fwd_bf16_d128"])
def test_what_the_policy_saw_after_each_round_is_read_back_from_the_state(name):
    state, seen = spied_tune(name, 0)
    rebuilt = observed_after_rounds(state)
    assert [name for name, _ in rebuilt] == [record.name for record in state.rounds]
    assert len(seen) == len(rebuilt) and any(failures for _, failures in seen)
    for (durations, failures), (_, observed) in zip(seen, rebuilt):
        np.testing.assert_array_equal(observed.duration_us, durations)
        assert observed.failures == failures


def test_a_config_ruled_out_only_mid_tune_says_so_with_the_rounds():
    state, _ = spied_tune("attention_fwd_bf16_d128", 0)  # R1's best is slow: its 4x spill is none at the end
    stories = explain_configs(state, list(range(state.n_configs)))
    earlier = [s for s in stories if s.ruled_out is None and s.ruled_out_after]
    assert earlier, "no config was ruled out mid-tune alone: the test checks nothing"
    for story in earlier:
        [line] = [line for line in story.lines if line.startswith("ruled out")]
        assert line.startswith(f"ruled out after {story.ruled_out_after[0]}")
        assert " only, on what the tune had measured then (not at the end): " in line
        assert story.ruled_out_after[-1] != state.rounds[-1].name


def test_a_config_ruled_out_to_the_end_says_since_which_round():
    state = StateStore.read(WITH_FAILURES)
    ruled = [s for s in explain_configs(state, list(range(state.n_configs))) if s.ruled_out]
    assert ruled, "no config was ruled out: the test checks nothing"
    for story in ruled:  # a DONE tune's end is what the policy saw after its last round
        assert story.ruled_out_after[-1] == state.rounds[-1].name
        assert story.lines[1].startswith((f"ruled out since {story.ruled_out_after[0]}: ", "ruled out at the end: "))


def test_an_unfinished_tune_says_not_tried_yet_the_latest_model_and_the_best_so_far():
    state = StateStore.read(MID_ROUND)
    untried = next(i for i in range(state.n_configs) if i not in state.durations and i not in state.failed
                   and i not in state.pending)
    [best, other] = explain_configs(state, [state.best, untried])
    assert "the best so far (fastest of " in best.lines[0]
    assert other.lines[0].startswith("not tried yet; the latest model predicts ")


def test_an_index_asked_twice_is_told_once():
    assert [s.index for s in explain_configs(StateStore.read(WITH_FAILURES), [107, 0, 107])] == [107, 0]


def test_a_config_with_carried_timings_says_how_many_were_carried_and_how_many_timed_after():
    [line] = story_lines(CORPUS / "v3-done-carried.fsm", 148)  # carried_taken: 12 of its 13 timings
    assert line.startswith("12 timings carried from an earlier tune and taken in R2_2, then 1 more: 13 timings, ")


def test_the_rules_history_sees_carried_timings_from_the_round_that_took_them():
    seen = dict(observed_after_rounds(StateStore.read(CORPUS / "v3-done-carried.fsm")))
    assert seen["R2_1"].samples[148] == 0 and seen["R2_2"].samples[148] == 12 and seen["R2_10"].samples[148] == 13


def test_an_untried_config_says_the_timing_an_earlier_tune_left_it_unused():
    lines = story_lines(CORPUS / "v3-done-carried.fsm", 83)  # carried: one timing, never asked for
    assert lines[0].startswith("never tried; ")
    assert lines[1] == ("an earlier tune's result is carried for it (the policy never asked for it): "
                        "1 timing there, mean 289.27 µs")


def test_an_untried_config_says_an_earlier_tune_saw_it_fail():
    lines = story_lines(CORPUS / "v3-done-carried.fsm", 139)  # carried: an out-of-shared-memory failure
    assert lines[1].startswith("an earlier tune's result is carried for it (the policy never asked for it): "
                               "it failed there: OutOfResources")


def test_a_config_whose_only_timing_was_carried_is_not_called_measured_in_its_round():
    [line] = story_lines(CORPUS / "v3-done-carried.fsm", 1)  # carried_taken: its 1 timing
    assert line.startswith("1 timing carried from an earlier tune and taken in R1: 1 timing, ")


def test_a_config_ruled_out_first_by_one_rule_and_at_the_end_by_another_names_both():
    state = StateStore.read(WITH_FAILURES)
    both = [s for s in explain_configs(state, list(range(state.n_configs)))
            if any("; at the end as it " in line for line in s.lines)]
    assert both, "no config changed rules: the test checks nothing"
    for story in both:
        line = next(line for line in story.lines if line.startswith("ruled out since R"))
        first, end = line.split(": first as it ", 1)[1].split("; at the end as it ")
        assert end == story.ruled_out
        assert first.split(", which ran")[0] != end.split(", which ran")[0]


def test_a_config_two_rules_rule_out_at_the_end_names_the_others_after_the_first_in_their_order():
    state = StateStore.read(WITH_FAILURES)
    policy = FastaPolicy(state.configs)
    policy.load_state_dict(state.policy_state)
    reasons = policy.ruled_out(state.observed())
    stories = [s for s in explain_configs(state, list(reasons)) if s.ruled_out_also]
    assert stories, "no config had two rules: the test checks nothing"
    for story in stories:
        assert [story.ruled_out, *story.ruled_out_also] == [why.words for why in reasons[story.index]]
        assert story.lines[2:] == [f"also ruled out at the end as it {words}" for words in story.ruled_out_also]


def test_a_config_one_rule_rules_out_says_nothing_else():
    state = StateStore.read(WITH_FAILURES)
    single = [s for s in explain_configs(state, list(range(state.n_configs))) if s.ruled_out and not s.ruled_out_also]
    assert single, "every ruled-out config had two rules: the test checks nothing"
    assert all(len(story.lines) == 2 and story.lines[1].startswith("ruled out ") for story in single)
