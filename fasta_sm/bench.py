"""Replay every policy over recorded tables and score its picks against the true best.

Each run is a real tune through the engine (the machine, the replay backend
with its cost model and seeded noise, the policy), kept in memory: no state
file, no lock, so a run takes milliseconds. Baselines get, on every run, the evaluation budget the first
policy actually used, so quality is compared at an equal count of configs tried (coordinate descent may
stop short of it at a local optimum; cost is reported beside it, not matched).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .backends.replay import ReplayBackend, ReplayTable, load_table
from .errors import TableError, TuneFailed
from .machine import ROLLBACK, Tune
from .policies import make_policy, with_environment

log = logging.getLogger("fasta_sm.bench")

Progress = Callable[[int, int, str, str], None]
"""progress(runs_done, runs_total, kernel, policy), called after every run; kernel as its row is labelled."""


EXHAUSTIVE_IN_BENCH = (
    "exhaustive is the yardstick every row is scored against (its pick is the true best, its cost 100 %); "
    "it takes no budget, so it is not a bench policy"
)
BUDGET_IN_PARAMS = "the first policy's budget is set by --budget (bench's `budget`), not as one of its params"
NEEDLE_MOST = 3
"""A needle kernel has at most this many configs within 5 % of its best (the policy issue's definition)."""


class _QuietRollback(logging.Filter):
    """Drops the engine's per-tune "state kept at the last checkpoint" warning: a bench keeps no state, and
    counts the runs that found nothing itself (one warning per kernel and policy)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, ROLLBACK, False)


@dataclass(frozen=True)
class Run:
    """One tune of one policy on one table under one seed."""

    regret_pct: float
    evaluated: int
    benchmarked: int
    cost_s: float


def run_policy(
    table: ReplayTable,
    policy: str,
    seed: int,
    params: Mapping[str, Any] | None = None,
) -> Run:
    """Tune `table` with `policy` through the engine (in memory, no state file) and score its pick."""
    n = len(table.configs)
    tune = Tune.start(
        key=f"bench/{table.kernel}/{policy}/seed={seed}",
        kernel=table.kernel,
        configs=table.configs,
        backend=ReplayBackend(table, noise=True, seed=seed),
        policy=make_policy(policy, table.configs, with_environment(policy, params or {})),
        policy_params=dict(params or {}),
        seed=seed,
        chunk_size=n,
        benchmark_chunk=n,
    )
    quiet = _QuietRollback()
    machine_log = logging.getLogger("fasta_sm.machine")
    machine_log.addFilter(quiet)
    try:
        state = tune.drive()
    except TuneFailed:
        state = tune.state
    finally:
        machine_log.removeFilter(quiet)
        tune.close()
    tried = state.tried_count()
    cost = state.cost.compile_s + state.cost.benchmark_s
    if state.best is None:
        return Run(regret_pct=math.inf, evaluated=tried, benchmarked=0, cost_s=cost)
    best = table.true_best_us
    return Run(
        regret_pct=100.0 * (float(table.mean_us[state.best]) - best) / best,
        evaluated=tried,
        benchmarked=state.measured_count(),
        cost_s=cost,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """numpy's (linear) percentile, where a run with no pick counts as regret inf.

    numpy interpolates a + (inf − a)·0 into NaN even where the percentile
    falls exactly on a finite value; here only a percentile that reaches
    past the last finite value is inf.
    """
    ordered = np.sort(np.asarray(values, dtype=float))
    position = round(q * (ordered.size - 1) / 100.0, 9)  # 28 % of 25 steps is 7, not 7.000000000000001
    low, high = math.floor(position), math.ceil(position)
    share = position - low
    if share == 0.0:
        return float(ordered[low])
    if math.isinf(ordered[high]):
        return math.inf
    return float(ordered[low] + (ordered[high] - ordered[low]) * share)


def _summary(runs: list[Run], n: int, exhaustive: float) -> dict[str, float]:
    regret = np.array([r.regret_pct for r in runs])
    return {
        "catch2": float(np.mean(regret <= 2.0)),
        "catch5": float(np.mean(regret <= 5.0)),
        "median_regret_pct": percentile(regret, 50),
        "p95_regret_pct": percentile(regret, 95),
        "evals_pct": float(100.0 * np.mean([r.benchmarked for r in runs]) / n),
        "cost_pct": float(100.0 * np.mean([r.cost_s for r in runs]) / exhaustive),
    }


def table_paths(tables_dir: str | Path) -> list[Path]:
    """The replay tables a bench runs on; a TableError naming `tables_dir` when there are none.

    Hidden files are left out, as a shell's `*.json` leaves them: an editor's
    lock (`.#t.json`) or macOS metadata (`._t.json`) is no table of anyone's.
    """
    if not Path(tables_dir).is_dir():
        raise TableError(f"{tables_dir}: not a directory of replay tables")
    paths = sorted(path for path in Path(tables_dir).glob("*.json") if not path.name.startswith("."))
    if not paths:
        raise TableError(f"{tables_dir}: no *.json replay tables in it")
    return paths


def load_tables(tables_dir: str | Path) -> list[tuple[Path, ReplayTable]]:
    """Every replay table in `tables_dir` with its path, each file read once: a bench's checks, runs and
    labels all look at the same tables, even while a recorder rewrites one."""
    return [(path, load_listed(path)) for path in table_paths(tables_dir)]


def load_listed(path: Path) -> ReplayTable:
    """A table a folder's listing found: read if it is a regular file (or a link to one), else a TableError
    naming it, never opened: a named pipe there would leave its reader waiting for a writer forever."""
    if not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise TableError(f"{path}: {kind}, so no replay table (a folder's tables are its *.json files)")
    return load_table(path)


def _row_labels(tables: Sequence[ReplayTable], paths: Sequence[Path]) -> list[str]:
    """Each table's kernel name, with its file's name where two tables hold one kernel (two devices, say).

    Each label names one table: a kernel named as another table's label
    (`k (b.json)` beside two tables of `k`) or as the `overall` row of
    `bench`'s third table adds its file's name too.
    """
    kernels = [t.kernel for t in tables]
    labels = list(kernels)
    while True:
        taken = {label for label in labels if labels.count(label) > 1} | {"overall"}
        plain = [i for i, label in enumerate(labels) if label == kernels[i] and label in taken]
        if not plain:
            return labels
        for i in plain:
            labels[i] = f"{kernels[i]} ({paths[i].name})"


def needle_labels(loaded: Sequence[tuple[Path, ReplayTable]]) -> list[str]:
    """The row labels (as `bench` names its kernels) of the tables that are needles: few configs near the best."""
    paths, tables = [path for path, _ in loaded], [table for _, table in loaded]
    return [label for table, label in zip(tables, _row_labels(tables, paths)) if table.within(0.05) <= NEEDLE_MOST]


def leader_margins(result: Mapping[str, Any], needles: Sequence[str]) -> list[dict[str, Any]]:
    """The first policy's catch2 against the best baseline's, overall and on each needle kernel.

    The policy issue asks the leader for a strictly higher catch2 than every
    baseline on both; a row per comparison: `kernel` ("overall" or a
    needle), the leader's `catch2`, the best `baseline` and its
    `baseline_catch2`. Empty with one policy.
    """
    leader, *baselines = result["overall"]
    if not baselines:
        return []
    rows = [("overall", result["overall"])]
    for label in needles:
        rows.append((label, {k["policy"]: k for k in result["kernels"] if k["kernel"] == label}))
    margins = []
    for label, by_policy in rows:
        best = max(baselines, key=lambda name: by_policy[name]["catch2"])
        margins.append({"kernel": label, "catch2": by_policy[leader]["catch2"], "baseline": best,
                        "baseline_catch2": by_policy[best]["catch2"]})
    return margins


def bench(
    tables: str | os.PathLike[str] | Sequence[tuple[Path, ReplayTable]],
    policies: Sequence[str],
    seeds: int,
    budget: float | None = None,
    progress: Progress | None = None,
    seed_start: int = 0,
    params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Score `policies` on every table of a folder (or of `load_tables`'s list) over `seeds` seeds each, from
    `seed_start` on.

    The first policy runs with `params` (its knobs, to score a setting
    against the defaults; its budget is `budget`'s alone) and routes its own
    budget, or gets `budget` (a fraction of N) when one is given; every
    other policy gets, run by run, the fraction
    of configs the first one evaluated, so that all are compared at the
    evaluations it actually spent (a floor, a polish or a blind search past
    an all-failing R1 included). A `seed_start` past the seeds a change was
    tuned on gives a held-out check. Returns the JSON shape of `fasta-sm bench --json`.
    """
    if seeds < 1:
        raise ValueError(f"seeds={seeds!r}: a bench needs at least one seed")
    if not policies or len(set(policies)) != len(policies):
        raise ValueError(f"policies {list(policies)!r}: name each policy once, at least one")
    if "exhaustive" in policies:
        raise ValueError(EXHAUSTIVE_IN_BENCH)
    if params and "budget" in params:
        raise ValueError(BUDGET_IN_PARAMS)
    loaded = load_tables(tables) if isinstance(tables, (str, os.PathLike)) else list(tables)
    if not loaded:  # as a folder of none is refused (table_paths)
        raise TableError("no replay tables to bench")
    labels = _row_labels([table for _, table in loaded], [path for path, _ in loaded])
    total = len(loaded) * seeds * len(policies)
    done = 0
    kernels: list[dict[str, Any]] = []
    regrets: dict[str, list[float]] = {p: [] for p in policies}
    for (_, table), label in zip(loaded, labels):
        n = len(table.configs)
        exhaustive = table.exhaustive_cost_s
        runs: dict[str, list[Run]] = {p: [] for p in policies}
        for seed in range(seed_start, seed_start + seeds):
            fraction: float | None = budget
            for position, policy in enumerate(policies):
                knobs = dict(params or {}) if position == 0 else {}
                if fraction is not None:
                    knobs["budget"] = fraction
                    if position > 0 and policy == "fasta":  # its floor of `min_budget` configs would buy it more
                        knobs["min_budget"] = 1
                run = run_policy(table, policy, seed, knobs)
                if position == 0:
                    fraction = min(1.0, max(run.evaluated, 1) / n)
                runs[policy].append(run)
                done += 1
                if progress is not None:
                    progress(done, total, label, policy)
        for policy in policies:
            row = {"kernel": label, "policy": policy, "N": n}
            row.update(_summary(runs[policy], n, exhaustive))
            kernels.append(row)
            regrets[policy] += [r.regret_pct for r in runs[policy]]
            nothing = sum(math.isinf(r.regret_pct) for r in runs[policy])
            if nothing:
                log.warning("bench: %s on %s: %d of %d runs found no config that ran (regret inf)",
                            policy, label, nothing, len(runs[policy]))
        log.info("bench: %s done (%d configs)", table.kernel, n)
    overall: dict[str, dict[str, float]] = {}
    for policy in policies:
        rows = [k for k in kernels if k["policy"] == policy]
        overall[policy] = {
            key: float(np.mean([r[key] for r in rows]))
            for key in ("catch2", "catch5", "median_regret_pct", "evals_pct", "cost_pct")
        }
        overall[policy]["median_regret_pct"] = percentile(regrets[policy], 50)
        overall[policy]["p95_regret_pct"] = percentile(regrets[policy], 95)
    ordered = {
        p: {
            k: overall[p][k]
            for k in ("catch2", "catch5", "median_regret_pct", "p95_regret_pct", "evals_pct", "cost_pct")
        }
        for p in policies
    }
    return {"kernels": kernels, "overall": ordered}
