"""Where the tuning time went: per-tune cost against exhaustive tuning of the same space.

Exhaustive cost is estimated from what the tune itself measured: its compile
seconds per config tried (failed compiles cost time too), and its benchmark
seconds per timing, scaled to the whole space. An estimate even on replay,
where the configs a tune picked are no average sample of the space (the
guided rounds favour large, slow-compiling tiles): `fasta-sm tune` prints
the table's exact figure beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import StateFileError
from .state import TuneState
from .store import StateStore

REPORT_COLUMNS = (
    "kernel",
    "position",
    "evaluations",
    "configs",
    "evals_pct",
    "compile_s",
    "benchmark_s",
    "policy_s",
    "total_s",
    "exhaustive_s",
    "saved_s",
    "cost_pct",
)


@dataclass(frozen=True)
class TuneCosts:
    spent_s: float
    exhaustive_s: float

    @property
    def spent_pct(self) -> float:
        return 100.0 * self.spent_s / self.exhaustive_s if self.exhaustive_s > 0 else float("nan")


def tune_costs(state: TuneState, exhaustive_s: float | None = None) -> TuneCosts:
    """Compile plus benchmark seconds spent, against exhaustive tuning's cost.

    `exhaustive_s` is that cost when it is known (a replay table records it);
    otherwise it is estimated from the tune's own seconds per config.
    """
    spent = state.cost.compile_s + state.cost.benchmark_s
    if exhaustive_s is None:
        bench_per_config = state.cost.benchmark_s / max(state.evaluations(), 1)
        tried = len(set(state.compiled) | set(state.failed))
        compile_all = (state.cost.compile_s / tried if tried else 0.0) * state.n_configs
        exhaustive_s = compile_all + bench_per_config * (state.n_configs - len(state.failed))
    return TuneCosts(spent_s=spent, exhaustive_s=exhaustive_s)


def report_rows(store: StateStore) -> list[dict[str, Any]]:
    """One row per readable state file, then a TOTAL row."""
    rows = []
    for path in store.state_files():
        try:
            state = store.read(path)
        except StateFileError:
            continue
        costs = tune_costs(state)
        rows.append(
            {
                "kernel": state.kernel,
                "position": state.position(),
                "evaluations": state.evaluations(),
                "configs": state.n_configs,
                "evals_pct": 100.0 * state.evaluations() / state.n_configs,
                "compile_s": state.cost.compile_s,
                "benchmark_s": state.cost.benchmark_s,
                "policy_s": state.cost.policy_s,
                "total_s": state.cost.total_s,
                "exhaustive_s": costs.exhaustive_s,
                "saved_s": costs.exhaustive_s - costs.spent_s,
                "cost_pct": costs.spent_pct,
            }
        )
    if rows:
        total = {c: sum(r[c] for r in rows) for c in REPORT_COLUMNS if isinstance(rows[0][c], (int, float))}
        total["evals_pct"] = 100.0 * total["evaluations"] / total["configs"]
        spent = total["compile_s"] + total["benchmark_s"]
        total["cost_pct"] = 100.0 * spent / total["exhaustive_s"] if total["exhaustive_s"] else float("nan")
        rows.append({"kernel": "TOTAL", "position": f"{len(rows)} tunes", **total})
    return rows
