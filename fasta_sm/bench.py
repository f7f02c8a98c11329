"""Replay every policy over recorded tables and score its picks against the true best.

The bench drives policies directly over a table held in memory (no state
files, no locks): the same plan/refine protocol as the engine, with the
replay backend's cost model and its seeded noise, so a run takes
milliseconds. Baselines get, on every run, the evaluation budget the first
policy actually used, so quality is compared at equal cost.
"""

from __future__ import annotations

import logging
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .backends.replay import BENCH_OVERHEAD_S, ReplayBackend, ReplayTable, load_table
from .errors import PolicyError
from .policies import make_policy
from .protocols import Observations

log = logging.getLogger("fasta_sm.bench")

MAX_DECISIONS = 10_000

Progress = Callable[[int, int, str, str], None]
"""progress(runs_done, runs_total, kernel, policy), called after every run."""


@dataclass(frozen=True)
class Run:
    """One tune of one policy on one table under one seed."""

    pick: int
    regret_pct: float
    evaluated: int
    cost_s: float


def _load_baselines() -> None:
    """Register the bench-only baselines (coordinate descent, extra trees)."""
    from .policies import coordinate, trees  # noqa: F401


def run_policy(
    table: ReplayTable,
    policy: str,
    seed: int,
    params: Mapping[str, Any] | None = None,
) -> Run:
    """Drive `policy` over `table` to its stop, charging compile and benchmark seconds."""
    n = len(table.configs)
    backend = ReplayBackend(table, noise=True, seed=seed)
    rng = np.random.default_rng([seed, zlib.crc32(table.kernel.encode())])
    instance = make_policy(policy, table.configs, params)
    durations = np.full(n, np.nan)
    sums = np.zeros(n)
    samples = np.zeros(n, dtype=np.int64)
    compile_s = np.full(n, np.nan)
    spent = 0.0
    decision = instance.plan(rng)
    for _ in range(MAX_DECISIONS):
        batch = [int(i) for i in decision.batch]
        if not batch:
            break
        for index in batch:
            tried = not math.isnan(durations[index])
            if tried != bool(decision.retime) or math.isinf(durations[index]):
                raise PolicyError(f"{policy} on {table.kernel}: config #{index} proposed against the protocol")
            if not tried:
                spent += float(table.compile_s[index])
                if table.errors[index] is not None:
                    durations[index] = math.inf
                    continue
                compile_s[index] = table.compile_s[index]
            sums[index] += backend.timing(index, int(samples[index]))
            samples[index] += 1
            durations[index] = sums[index] / samples[index]
            spent += BENCH_OVERHEAD_S
        observed = Observations(duration_us=durations.copy(), samples=samples.copy(), compile_s=compile_s.copy(),
                                spent_s=spent)
        decision = instance.refine(observed, rng)
    else:
        raise PolicyError(f"{policy} on {table.kernel}: no stop after {MAX_DECISIONS} decisions")
    finite = np.flatnonzero(np.isfinite(durations))
    if finite.size == 0:
        return Run(pick=-1, regret_pct=math.inf, evaluated=int(np.sum(~np.isnan(durations))), cost_s=spent)
    pick = int(finite[np.argmin(durations[finite])])
    best = table.true_best_us
    return Run(
        pick=pick,
        regret_pct=100.0 * (float(table.mean_us[pick]) - best) / best,
        evaluated=int(np.sum(~np.isnan(durations))),
        cost_s=spent,
    )


def exhaustive_cost_s(table: ReplayTable) -> float:
    """Compile every config and time every one that compiled, once."""
    ran = sum(1 for e in table.errors if e is None)
    return float(np.sum(table.compile_s)) + BENCH_OVERHEAD_S * ran


def _summary(runs: list[Run], n: int, exhaustive: float) -> dict[str, float]:
    regret = np.array([r.regret_pct for r in runs])
    return {
        "catch2": float(np.mean(regret <= 2.0)),
        "catch5": float(np.mean(regret <= 5.0)),
        "median_regret_pct": float(np.median(regret)),
        "p95_regret_pct": float(np.percentile(regret, 95)),
        "evals_pct": float(100.0 * np.mean([r.evaluated for r in runs]) / n),
        "cost_pct": float(100.0 * np.mean([r.cost_s for r in runs]) / exhaustive),
    }


def bench(
    tables_dir: str | Path,
    policies: Sequence[str],
    seeds: int,
    budget: float | None = None,
    progress: Progress | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Score `policies` on every table in `tables_dir` over `seeds` seeds each.

    With `budget` None, the first policy routes its own budget and every other
    policy gets, run by run, the fraction of configs the first one evaluated;
    with a `budget`, every policy gets that fraction. `params` adds per-policy
    constructor arguments. Returns the JSON shape of `fasta-sm bench --json`.
    """
    _load_baselines()
    paths = sorted(Path(tables_dir).glob("*.json"))
    if not paths:
        raise FileNotFoundError(f"{tables_dir}: no *.json replay tables")
    tables = [load_table(p) for p in paths]
    params = params or {}
    total = len(tables) * seeds * len(policies)
    done = 0
    kernels: list[dict[str, Any]] = []
    regrets: dict[str, list[float]] = {p: [] for p in policies}
    for table in tables:
        n = len(table.configs)
        exhaustive = exhaustive_cost_s(table)
        runs: dict[str, list[Run]] = {p: [] for p in policies}
        for seed in range(seeds):
            leader_fraction: float | None = budget
            for position, policy in enumerate(policies):
                kwargs = dict(params.get(policy, {}))
                if leader_fraction is not None:
                    kwargs["budget"] = leader_fraction
                run = run_policy(table, policy, seed, kwargs)
                if position == 0 and budget is None:
                    leader_fraction = min(1.0, max(run.evaluated, 1) / n)
                runs[policy].append(run)
                done += 1
                if progress is not None:
                    progress(done, total, table.kernel, policy)
        for policy in policies:
            row = {"kernel": table.kernel, "policy": policy, "N": n}
            row.update(_summary(runs[policy], n, exhaustive))
            kernels.append(row)
            regrets[policy] += [r.regret_pct for r in runs[policy]]
        log.info("bench: %s done (%d configs)", table.kernel, n)
    overall: dict[str, dict[str, float]] = {}
    for policy in policies:
        rows = [k for k in kernels if k["policy"] == policy]
        overall[policy] = {
            key: float(np.mean([r[key] for r in rows]))
            for key in ("catch2", "catch5", "median_regret_pct", "evals_pct", "cost_pct")
        }
        overall[policy]["median_regret_pct"] = float(np.median(regrets[policy]))
        overall[policy]["p95_regret_pct"] = float(np.percentile(regrets[policy], 95))
    ordered = {
        p: {k: overall[p][k] for k in ("catch2", "catch5", "median_regret_pct", "p95_regret_pct", "evals_pct", "cost_pct")}
        for p in policies
    }
    return {"kernels": kernels, "overall": ordered}
