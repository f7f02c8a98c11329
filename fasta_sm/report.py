"""Where the tuning time went: per-tune cost against exhaustive tuning of the same space.

Exhaustive cost is estimated from what the tune itself measured: its compile
seconds per config it compiled or failed to compile (failed compiles cost time
too; while a round is timed, more configs than the `tried` column, which
waits for each one's timing), and its benchmark
seconds per timing it took or run that failed (failed runs cost time too),
scaled to the whole space. An estimate even on replay,
where the configs a tune picked are no average sample of the space (the
guided rounds favour large, slow-compiling tiles): `fasta-sm tune` prints
the table's exact figure beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .backends.replay import is_replay
from .errors import StateFileError
from .render import kernel_labels, tune_label
from .state import TuneState
from .store import StateStore

REPORT_COLUMNS = (
    "file",
    "kernel",
    "policy",
    "position",
    "timings",
    "tried",
    "N",
    "tried_pct",
    "compile_s",
    "benchmark_s",
    "policy_s",
    "total_s",
    "exhaustive_s",
    "saved_s",
    "cost_pct",
)
"""`tried` counts configs, those that ran and those that failed; `timings` counts every timing, re-timings
included. `tried_pct` is `tried` over N, which `bench`'s `evals_pct` is not: that counts only configs that ran."""


@dataclass(frozen=True)
class TuneCosts:
    spent_s: float
    exhaustive_s: float | None
    """None while nothing has been compiled: there is no seconds-per-config to estimate it from."""

    @property
    def spent_pct(self) -> float | None:
        return 100.0 * self.spent_s / self.exhaustive_s if self.exhaustive_s else None


def tune_costs(state: TuneState, exhaustive_s: float | None = None) -> TuneCosts:
    """Compile plus benchmark seconds spent, against exhaustive tuning's cost.

    `exhaustive_s` is that cost when it is known (a replay table records it);
    otherwise it is estimated from the tune's own seconds per config, and
    unknown (None) until the tune has compiled something. Results taken from
    a superseded tune cost it nothing, so they count in neither the seconds
    nor what those are divided by.
    """
    spent = state.cost.compile_s + state.cost.benchmark_s
    if exhaustive_s is None:
        tried = len(set(state.compiled) | set(state.failed)) - len(state.carried_taken)
        if not tried:
            return TuneCosts(spent_s=spent, exhaustive_s=None)
        # a config that compiled and then failed to run cost a timing's seconds too, and exhaustive tuning
        # would try to time every config that compiles, not only those that ran
        failed_to_run = len(set(state.failed) & set(state.compiled))
        runs = state.evaluations() - state.timings_given() + failed_to_run
        bench_per_run = state.cost.benchmark_s / max(runs, 1)
        compile_all = state.cost.compile_s / tried * state.n_configs
        exhaustive_s = compile_all + bench_per_run * (state.n_configs - len(state.failed) + failed_to_run)
    return TuneCosts(spent_s=spent, exhaustive_s=exhaustive_s)


def report_rows(store: StateStore) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per readable state file, then a TOTAL row; and the files that could not be read.

    Live tunes come first with their TOTAL; replayed tunes, whose seconds
    were read from a table rather than spent, follow with a TOTAL of their
    own (`TOTAL replayed`), so that neither total adds the two.

    Each row names its file (what `fasta-sm show` takes) and its policy and
    seed: two tunes of one kernel are two rows that must be told apart.

    Seconds saved are counted for finished tunes only (None for the others):
    an unfinished tune has not yet spent what it will.
    """
    rows: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    finished: dict[bool, int] = {False: 0, True: 0}
    unreadable = []
    read = []
    for path in store.state_files():
        try:
            read.append((path, store.read_listed(path)))
        except (StateFileError, OSError) as exc:
            unreadable.append(str(exc))
    for (path, state), kernel in zip(read, kernel_labels([state for _, state in read])):
        replayed = is_replay(state.backend)
        finished[replayed] += state.done
        costs = tune_costs(state)
        rows[replayed].append(
            {
                "file": path.name,
                "kernel": kernel,
                "policy": tune_label(state),
                "position": state.status(),
                "timings": state.evaluations(),
                "tried": state.tried_count(),
                "N": state.n_configs,
                "tried_pct": 100.0 * state.tried_count() / state.n_configs,
                "compile_s": state.cost.compile_s,
                "benchmark_s": state.cost.benchmark_s,
                "policy_s": state.cost.policy_s,
                "total_s": state.cost.total_s,
                "exhaustive_s": costs.exhaustive_s,
                "saved_s": None if not state.done or costs.exhaustive_s is None else costs.exhaustive_s - costs.spent_s,
                "cost_pct": costs.spent_pct,
            }
        )
    report: list[dict[str, Any]] = []
    for replayed, label in ((False, "TOTAL"), (True, "TOTAL replayed")):
        if rows[replayed]:
            report += [*rows[replayed], _total(rows[replayed], label, finished[replayed])]
    return report, unreadable


def _total(rows: list[dict[str, Any]], label: str, finished: int) -> dict[str, Any]:
    numbers = [c for c in REPORT_COLUMNS if c not in ("file", "kernel", "policy", "position")]
    total = {c: sum(r[c] for r in rows if r[c] is not None) for c in numbers}
    if all(r["exhaustive_s"] is None for r in rows):
        total["exhaustive_s"] = None
    total["tried_pct"] = 100.0 * total["tried"] / total["N"]
    spent = total["compile_s"] + total["benchmark_s"]
    total["cost_pct"] = 100.0 * spent / total["exhaustive_s"] if total["exhaustive_s"] else None
    position = f"{len(rows)} tune{'s' if len(rows) != 1 else ''}, {finished} finished"
    return {"file": "", "kernel": label, "policy": "", "position": position, **total}
