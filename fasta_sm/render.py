"""Readable views of a state: the stable JSON of `fasta-sm show --json`, and summaries.

The JSON form is a public, versioned format (docs/state-format.md): fields are
only ever added, never renamed or removed, within one `format` version.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .backends.replay import replays_means
from .state import TuneState

SHOW_FORMAT = "fasta-sm.show/1"


def _number(value: float | None) -> float | None:
    """JSON has no NaN or inf: unknown or failed values become null."""
    if value is None or not math.isfinite(value):
        return None
    return value


def state_to_json(state: TuneState) -> dict[str, Any]:
    """The whole state, sorted and labelled for people and scripts."""
    predicted = state.predicted_us
    measured = sorted(state.durations, key=lambda i: (state.mean_us(i), i))
    return {
        "format": SHOW_FORMAT,
        "key": state.key,
        "kernel": state.kernel,
        "position": {"phase": state.phase, "round": state.round, "step": state.step, "label": state.position()},
        "policy": {"name": state.policy, "params": state.policy_params},
        "seed": state.seed,
        "backend": state.backend,
        "configs_total": state.n_configs,
        "configs_hash": state.configs_hash,
        "evaluations": state.evaluations(),
        "best": None
        if state.best is None
        else {"index": state.best, "config": state.configs[state.best].to_dict(), "mean_us": state.best_us},
        "stop_reason": state.stop_reason,
        "last_error": state.last_error,
        "pending": list(state.pending),
        "round_done": list(state.round_done),
        "measured": [
            {
                "index": i,
                "config": state.configs[i].to_dict(),
                "mean_us": state.mean_us(i),
                "durations_us": list(state.durations[i]),
                "compile_s": state.compiled.get(i),
                "predicted_us": _number(predicted[i]) if predicted else None,
            }
            for i in measured
        ],
        "failed": [
            {"index": i, "config": state.configs[i].to_dict(), "error": state.failed[i]} for i in sorted(state.failed)
        ],
        "rounds": [
            {
                "name": r.name,
                "batch": list(r.batch),
                "reason": r.reason,
                "retime": r.retime,
                "predicted_us": [_number(x) for x in r.predicted_us],
                "compile_s": r.compile_s,
                "benchmark_s": r.benchmark_s,
                "policy_s": r.policy_s,
                "started": r.started,
                "finished": r.finished,
            }
            for r in state.rounds
        ],
        "cost": {
            "compile_s": state.cost.compile_s,
            "benchmark_s": state.cost.benchmark_s,
            "policy_s": state.cost.policy_s,
            "total_s": state.cost.total_s,
        },
        "restarts": list(state.restarts),
        "carried_taken": [{"index": i, "timings": state.carried_taken[i]} for i in sorted(state.carried_taken)],
        "created": state.created,
        "updated": state.updated,
        "schema": state.schema,
        "library": state.library,
    }


def tune_label(state: TuneState) -> str:
    """Policy and seed, with what else tells two tunes of one kernel apart in a listing: an explicit budget,
    a replay without noise."""
    label = f"{state.policy} seed {state.seed}"
    budget = state.policy_params.get("budget")
    if budget is not None:  # a number, unless the file was edited by hand
        label += f" budget {budget:g}" if isinstance(budget, (int, float)) else f" budget {budget!r}"
    return label + (" no noise" if replays_means(state.backend) else "")


def key_values(state: TuneState) -> str:
    """What tells a tune's key from another of its kernel: a Triton tune's `[values, …]` after the kernel's
    name, else the whole key."""
    return state.key.removeprefix(state.kernel) if state.key.startswith(state.kernel + "[") else state.key


def printable(text: str) -> str:
    """`text` on one line as a listing prints it: a control character (a newline in a kernel name or a file
    name) or an undecodable byte of a file name (a lone surrogate) written as its escape (`\\n`, `\\udcfe`),
    so that a row stays one row and a table measures each cell as the characters it prints."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii") for ch in text)


def kernel_labels(states: list[TuneState]) -> list[str]:
    """Each tune's kernel as `ls` and `report` list it: with its key's values when another tune of the same
    kernel and policy would otherwise read the same (two shapes of one kernel, say)."""
    keys_of: dict[tuple[str, str], set[str]] = {}
    for state in states:
        keys_of.setdefault((state.kernel, tune_label(state)), set()).add(state.key)
    return [f"{state.kernel} {key_values(state)}" if len(keys_of[state.kernel, tune_label(state)]) > 1
            else state.kernel for state in states]


def human_age(seconds: float) -> str:
    """The age in its largest whole unit, rounded down: 3599 s is 59m, not 60m."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(int(seconds), 0)}s"


def age_of(state: TuneState) -> str:
    return human_age(time.time() - state.updated)


def format_us(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if round(value, 2) >= 1000:  # 999.996 µs would print as 1000.00 µs
        return f"{value / 1000:.3f} ms"
    return f"{value:.2f} µs"
