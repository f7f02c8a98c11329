"""Why a tune measured a config, or did not: what `fasta-sm show --config` prints.

A config an exhaustive tune crowned, missing from a fasta tune's list, has
one of two stories: the model ranked it low, or a feasibility rule put it
out of reach (a failure or a spill it is at least as large as). The state
holds the final model's prediction for every config, and the policy,
rebuilt from the state, names the rules: both are read back here, nothing
is measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import describe
from .policies import make_policy
from .protocols import Observations, RuledOut, RulesOut
from .render import format_us
from .state import TuneState, round_name, sample_mean


@dataclass(frozen=True)
class ConfigStory:
    """One config's part in a tune: `status` is measured, failed, pending or untried; `lines` say the rest."""

    index: int
    label: str
    status: str
    lines: list[str]
    predicted_us: float | None
    ruled_out: str | None
    ruled_out_after: list[str] = field(default_factory=list)
    """The finished rounds after whose results a rule ruled the config out (the end state's `ruled_out` aside)."""
    ruled_out_also: list[str] = field(default_factory=list)
    """The other rules that rule it out at the end, after `ruled_out`'s: what still holds it with that one off."""

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "config": self.label,
            "status": self.status,
            "lines": list(self.lines),
            "predicted_us": self.predicted_us,
            "ruled_out": self.ruled_out,
            "ruled_out_after": list(self.ruled_out_after),
            "ruled_out_also": list(self.ruled_out_also),
        }


def picked_in(state: TuneState) -> dict[int, str]:
    """The round that first picked each config: the Rounds table gives only batch sizes, so without it one cannot
    tell which configs R1 sampled, which a guided or polish round proposed, or where a failure was met."""
    picked: dict[int, str] = {}
    for record in state.rounds:
        for index in record.batch:
            picked.setdefault(index, record.name)
    return picked


def predicted_at_pick(state: TuneState) -> dict[int, float]:
    """What the model predicted for each config in the round that first picked it (before it was measured)."""
    at_pick: dict[int, float] = {}
    for record in state.rounds:
        for index, predicted in zip(record.batch, record.predicted_us):
            if math.isfinite(predicted):
                at_pick.setdefault(index, predicted)
    return at_pick


def check_index(state: TuneState, index: int) -> None:
    """ValueError naming the tune's range unless `index` is one of its configs."""
    if not 0 <= index < state.n_configs:
        raise ValueError(f"config #{index} is not one of the tune's {state.n_configs} configs (#0 to "
                         f"#{state.n_configs - 1}; `show` numbers them)")


def explain_configs(state: TuneState, indices: list[int]) -> list[ConfigStory]:
    """Each config's story in `state`, in the order asked, each once. The policy's rules are read once for all."""
    for index in indices:
        check_index(state, index)
    indices = list(dict.fromkeys(indices))
    rules, history, unreadable = ({}, {}, None)
    if any(_status(state, i) == "untried" for i in indices):
        rules, history, unreadable = _rules_of(state)
    ranks = _Ranks.of(state)
    return [_story(state, ranks, index, rules, history.get(index, []), unreadable) for index in indices]


@dataclass(frozen=True)
class _Ranks:
    """What every story of one tune reads: the round that picked each config, the measured by mean, the untried
    by prediction. Worked out once, not once a config."""

    picked: dict[int, str]
    measured: dict[int, int]
    untried: dict[int, int]

    @classmethod
    def of(cls, state: TuneState) -> _Ranks:
        measured = sorted(state.durations, key=lambda i: (state.mean_us(i), i))
        predicted = state.predicted_us or [math.nan] * state.n_configs
        ranked = (i for i in range(state.n_configs) if _status(state, i) == "untried"
                  and predicted[i] is not None and math.isfinite(predicted[i]))
        untried = sorted(ranked, key=lambda i: (predicted[i], i))
        return cls(picked_in(state), {i: k + 1 for k, i in enumerate(measured)},
                   {i: k + 1 for k, i in enumerate(untried)})


def _status(state: TuneState, index: int) -> str:
    if index in state.durations:
        return "measured"
    if index in state.failed:
        return "failed"
    return "pending" if index in state.pending else "untried"


Ruled = dict[int, tuple[RuledOut, ...]]
History = dict[int, list[tuple[str, RuledOut]]]
"""Per config, the finished rounds after which a rule ruled it out, each with its main rule then."""


def _rules_of(state: TuneState) -> tuple[Ruled, History, str | None]:
    """The policy's reasons for the untried configs it put out of reach, rebuilt from the state: at the end, and
    after each finished round (`_history`); or why not."""
    try:
        policy = make_policy(state.policy, state.configs, state.policy_params)
        if state.policy_state:
            policy.load_state_dict(state.policy_state)
        if not isinstance(policy, RulesOut):
            return {}, {}, None
        return policy.ruled_out(state.observed()), _history(state, policy), None
    except Exception as exc:  # noqa: BLE001  a story without the rules beats no story: say why they are missing
        why = f"the {state.policy!r} policy could not be rebuilt from the state to read its rules: {describe(exc)}"
        return {}, {}, why


def _history(state: TuneState, policy: RulesOut) -> History:
    """Per config never tried, the finished rounds after whose results a rule ruled it out, with its main rule then.

    The rules read what the tune had measured when the policy chose the next
    round, and a spill is slow against the best of that moment: a config
    ruled out early, against a slower or smaller best, may be free at the
    end, and the end state alone would call it merely ranked low.
    """
    history: History = {}
    for name, observed in observed_after_rounds(state):
        for index, whys in policy.ruled_out(observed).items():
            if _status(state, index) == "untried":
                history.setdefault(index, []).append((name, whys[0]))
    return history


def observed_after_rounds(state: TuneState) -> list[tuple[str, Observations]]:
    """What the policy saw after each finished round (its durations and failures; no compile seconds).

    What the policy saw after round k is the state's timings less those the
    later rounds added.
    """
    added = _timings_added(state)
    later: dict[int, int] = {}
    for counts in added:
        for index, count in counts.items():
            later[index] = later.get(index, 0) + count
    seen_after = []
    for record, counts in zip(state.rounds, added):
        if record.finished is None:
            break
        for index, count in counts.items():
            later[index] -= count
        durations = np.full(state.n_configs, np.nan)
        samples = np.zeros(state.n_configs, dtype=int)
        for index, timings in state.durations.items():
            seen = len(timings) - later.get(index, 0)
            if seen > 0:
                durations[index], samples[index] = sample_mean(timings[:seen]), seen
        failures = {i: why for i, why in state.failed.items() if later.get(i, 0) == 0}
        durations[list(failures)] = np.inf
        seen_after.append((record.name, Observations(durations, samples, np.full(state.n_configs, np.nan), 0.0,
                                                      failures)))
    return seen_after


def _story(
    state: TuneState,
    ranks: _Ranks,
    index: int,
    rules: Ruled,
    history: list[tuple[str, RuledOut]],
    unreadable: str | None,
) -> ConfigStory:
    status = _status(state, index)
    predicted = state.predicted_us[index] if state.predicted_us else None
    predicted = predicted if predicted is not None and math.isfinite(predicted) else None
    label = state.configs[index].label()
    round_of = ranks.picked.get(index)
    if status == "measured":
        lines = [_measured_line(state, ranks, index, round_of)]
    elif status == "failed":
        lines = [f"failed in {round_of or 'an earlier tune (carried)'}: {state.failed[index]}"]
    elif status == "pending":
        lines = [f"in the round in flight ({round_name(state.phase, state.round)}), not timed yet"]
    else:
        lines = [_untried_line(state, ranks, index, predicted)]
        if index in state.carried:
            lines.append(_carried_line(state.carried[index], _over(state)))
        end = "at the end" if _over(state) else "now"
        if index in rules:
            since = _since(state, history)
            last, *also = rules[index]
            first = next((why for name, why in history if name == since), last)
            if since and (first.rule, first.culprit) != (last.rule, last.culprit):
                lines.append(f"ruled out since {since}: first as it {first.words}; {end} as it {last.words}")
            else:
                lines.append(f"ruled out {f'since {since}' if since else end}: {last.words}")
            lines.extend(f"also ruled out {end} as it {why.words}" for why in also)
        elif history:
            lines.append(f"ruled out after {_rounds(history)} only, on what the tune had measured then "
                         f"(not {end}): {history[-1][1].words}")
        elif unreadable:
            lines.append(unreadable)
    whys = rules.get(index, ()) if status == "untried" else ()
    return ConfigStory(index, label, status, lines, predicted, whys[0].words if whys else None,
                       [name for name, _ in history], [why.words for why in whys[1:]])


def _since(state: TuneState, history: list[tuple[str, RuledOut]]) -> str | None:
    """The first round of the unbroken run of rounds after which a rule ruled the config out, up to the last
    finished one ('R1' for 'since R1'); None when the last finished round's results did not rule it out."""
    finished = [record.name for record in state.rounds if record.finished is not None]
    ruled = {name for name, _ in history}
    if not finished or finished[-1] not in ruled:
        return None
    run = len(finished) - 1
    while run > 0 and finished[run - 1] in ruled:
        run -= 1
    return finished[run]


def _rounds(history: list[tuple[str, RuledOut]]) -> str:
    """The rounds of `history`: 'R1', 'R1 and R2_1', 'R1 to R2_4 (5 rounds)'."""
    names = [name for name, _ in history]
    if len(names) <= 2:
        return " and ".join(names)
    return f"{names[0]} to {names[-1]} ({len(names)} rounds)"


def _timings_added(state: TuneState) -> list[dict[int, int]]:
    """Per round, the timings it added to each config of its batch: one per time the batch holds it, but all of a
    config's carried timings (`carried_taken`) in the round that took them from an earlier tune instead of timing
    it."""
    carried = {index: taken for index, taken in state.carried_taken.items() if taken}
    added = []
    for record in state.rounds:
        counts: dict[int, int] = {}
        for index in record.batch:
            counts[index] = counts.get(index, 0) + (carried.pop(index, 0) or 1)
        added.append(counts)
    return added


def _measured_line(state: TuneState, ranks: _Ranks, index: int, round_of: str | None) -> str:
    count = len(state.durations[index])
    mean = state.mean_us(index)
    carried = state.carried_taken.get(index, 0)
    where = f"{'first ' if count > 1 else ''}measured in {round_of}" if round_of else "carried from an earlier tune"
    if round_of and carried > 0:
        plural = "s" if carried != 1 else ""
        more = f", then {count - carried} more" if count > carried else ""
        where = f"{carried} timing{plural} carried from an earlier tune and taken in {round_of}{more}"
    winner = "the winner" if state.done else "the best so far"
    standing = winner if index == state.best else f"{_gap(mean, state.best_us)} from the best"
    return (f"{where}: {count} timing{'s' if count != 1 else ''}, mean {format_us(mean)}, {standing} "
            f"({_fastest(ranks.measured[index])} of {len(ranks.measured)} measured)")


def _carried_line(carried: dict, done: bool) -> str:
    """An untried config's result carried from an earlier tune, which the policy never asked for: it would have
    cost nothing, so it is no reason the config was not tried."""
    asked = "the policy never asked for it" if done else "not asked for yet"
    if carried.get("error") is not None:
        return f"an earlier tune's result is carried for it ({asked}): it failed there: {carried['error']}"
    timings = carried.get("durations_us") or []
    if not timings:
        return f"an earlier tune's result is carried for it ({asked}): compiled there, never timed"
    plural = "s" if len(timings) != 1 else ""
    return (f"an earlier tune's result is carried for it ({asked}): {len(timings)} timing{plural} there, "
            f"mean {format_us(sample_mean(timings))}")


def _over(state: TuneState) -> bool:
    """Whether the tune will try nothing more: DONE, or stopped with no config run (a rerun stops the same way)."""
    return state.done or state.no_winner


def _untried_line(state: TuneState, ranks: _Ranks, index: int, predicted: float | None) -> str:
    never, model = ("never tried", "the final model") if _over(state) else ("not tried yet", "the latest model")
    if predicted is None:
        return f"{never}; the tune holds no prediction for it (its policy fits no model, or has fitted none yet)"
    gap = f", {_gap(predicted, state.best_us)} from the best measured" if state.best_us else ""
    return (f"{never}; {model} predicts {format_us(predicted)}{gap} "
            f"({_fastest(ranks.untried[index])} of the {len(ranks.untried)} untried by that prediction)")


def _gap(value: float, best: float | None) -> str:
    return "-" if not best else f"{(value / best - 1) * 100:+.2f} %"


def _fastest(rank: int) -> str:
    """'fastest', '2nd fastest', '11th fastest'."""
    if rank == 1:
        return "fastest"
    suffix = "th" if 10 <= rank % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(rank % 10, "th")
    return f"{rank}{suffix} fastest"
