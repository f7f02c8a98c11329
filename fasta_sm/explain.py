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
from dataclasses import dataclass

from .errors import describe
from .policies import make_policy
from .protocols import RulesOut
from .render import format_us
from .state import TuneState, round_name


@dataclass(frozen=True)
class ConfigStory:
    """One config's part in a tune: `status` is measured, failed, pending or untried; `lines` say the rest."""

    index: int
    label: str
    status: str
    lines: list[str]
    predicted_us: float | None
    ruled_out: str | None

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "config": self.label,
            "status": self.status,
            "lines": list(self.lines),
            "predicted_us": self.predicted_us,
            "ruled_out": self.ruled_out,
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
    """Each config's story in `state`, in the order asked. The policy's rules are read once for all of them."""
    for index in indices:
        check_index(state, index)
    rules, unreadable = _rules_of(state) if any(_status(state, i) == "untried" for i in indices) else ({}, None)
    return [_story(state, index, rules, unreadable) for index in indices]


def _status(state: TuneState, index: int) -> str:
    if index in state.durations:
        return "measured"
    if index in state.failed:
        return "failed"
    return "pending" if index in state.pending else "untried"


def _rules_of(state: TuneState) -> tuple[dict[int, str], str | None]:
    """The policy's reasons for the untried configs it put out of reach, rebuilt from the state; or why not."""
    try:
        policy = make_policy(state.policy, state.configs, state.policy_params)
        if state.policy_state:
            policy.load_state_dict(state.policy_state)
        if not isinstance(policy, RulesOut):
            return {}, None
        return policy.ruled_out(state.observed()), None
    except Exception as exc:  # noqa: BLE001  a story without the rules beats no story: say why they are missing
        return {}, f"the {state.policy!r} policy could not be rebuilt from the state to read its rules: {describe(exc)}"


def _story(state: TuneState, index: int, rules: dict[int, str], unreadable: str | None) -> ConfigStory:
    status = _status(state, index)
    predicted = state.predicted_us[index] if state.predicted_us else None
    predicted = predicted if predicted is not None and math.isfinite(predicted) else None
    label = state.configs[index].label()
    round_of = picked_in(state).get(index)
    if status == "measured":
        lines = [_measured_line(state, index, round_of)]
    elif status == "failed":
        lines = [f"failed in {round_of or 'an earlier tune (carried)'}: {state.failed[index]}"]
    elif status == "pending":
        lines = [f"in the round in flight ({round_name(state.phase, state.round)}), not timed yet"]
    else:
        lines = [_untried_line(state, index, predicted)]
        if index in rules:
            lines.append(f"ruled out: {rules[index]}")
        elif unreadable:
            lines.append(unreadable)
    return ConfigStory(index, label, status, lines, predicted, rules.get(index) if status == "untried" else None)


def _measured_line(state: TuneState, index: int, round_of: str | None) -> str:
    order = sorted(state.durations, key=lambda i: (state.mean_us(i), i))
    count = len(state.durations[index])
    mean = state.mean_us(index)
    where = f"measured in {round_of}" if round_of else "carried from an earlier tune's state"
    standing = "the winner" if index == state.best else f"{_gap(mean, state.best_us)} from the best"
    return (f"{where}: {count} timing{'s' if count != 1 else ''}, mean {format_us(mean)}, {standing} "
            f"({_fastest(order.index(index) + 1)} of {len(order)} measured)")


def _untried_line(state: TuneState, index: int, predicted: float | None) -> str:
    if predicted is None:
        return "never tried; the tune holds no final prediction for it (no model was fitted, or it has not stopped)"
    untried = [i for i in range(state.n_configs) if _status(state, i) == "untried" and state.predicted_us[i] is not None
               and math.isfinite(state.predicted_us[i])]
    rank = sorted(untried, key=lambda i: (state.predicted_us[i], i)).index(index) + 1
    gap = f", {_gap(predicted, state.best_us)} from the best measured" if state.best_us else ""
    return (f"never tried; the final model predicts {format_us(predicted)}{gap} "
            f"({_fastest(rank)} of the {len(untried)} untried by that prediction)")


def _gap(value: float, best: float | None) -> str:
    return "-" if not best else f"{(value / best - 1) * 100:+.2f} %"


def _fastest(rank: int) -> str:
    """'fastest', '2nd fastest', '11th fastest'."""
    if rank == 1:
        return "fastest"
    suffix = "th" if 10 <= rank % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(rank % 10, "th")
    return f"{rank}{suffix} fastest"
