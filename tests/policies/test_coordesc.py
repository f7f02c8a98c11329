"""coordesc against Inductor's CoordescTuner: first improvement kept at once, a failure timed as inf."""

from __future__ import annotations

import math

import numpy as np

from fasta_sm.backends.replay import table_from_dict
from fasta_sm.policies import make_policy
from fasta_sm.protocols import Observations


def _table(times: dict[tuple[int, int], float | None]):
    rows = [
        {"kwargs": {"BLOCK_M": m, "BLOCK_N": n}, "num_warps": 4, "num_stages": 2, "compile_s": 1.0,
         "duration_us": [] if t is None else [t, t], "error": "OOR" if t is None else None}
        for (m, n), t in times.items()
    ]
    return table_from_dict({"kernel": "k", "shape": {}, "device": "-", "torch": "-", "triton": "-",
                            "configs": rows}, "test")


def _walk(table, budget=1.0):
    """Drive coordesc on the recorded means (no noise); its best config and how many configs it tried."""
    n = len(table.configs)
    policy = make_policy("coordesc", table.configs, {"budget": budget})
    rng = np.random.default_rng(0)
    durations = np.full(n, np.nan)
    batch = policy.plan(rng).batch
    while batch:
        for i in batch:
            durations[i] = math.inf if math.isnan(table.mean_us[i]) else table.mean_us[i]
        batch = policy.refine(Observations(durations, np.zeros(n), np.zeros(n), 0.0), rng).batch
    ran = np.isfinite(durations)
    best = int(np.argmin(np.where(ran, durations, np.inf))) if ran.any() else None
    return best, int(np.sum(~np.isnan(durations)))


def test_coordesc_keeps_the_first_improvement_at_once_as_coordesc_tuner_does():
    # From (32, 32), CoordescTuner tries BLOCK_M first: 64 improves (90), so it moves there at once and
    # tries BLOCK_N from (64, 32): 16 gives 50, the true best. Taking the best of all four neighbours
    # instead moves to (32, 64) (80), whose neighbours are all worse: stuck 60 % off.
    times = {(16, 16): 99, (16, 32): 99, (16, 64): 99,
             (32, 16): 99, (32, 32): 100, (32, 64): 80,
             (64, 16): 50, (64, 32): 90, (64, 64): 95}
    table = _table(times)
    best, _ = _walk(table)
    assert table.mean_us[best] == table.true_best_us


def test_coordesc_steps_on_from_a_default_config_that_failed():
    # CoordescTuner times a failing config as inf, which any config that runs improves on: BLOCK_M=64 first.
    times = {(16, 32): 99, (32, 16): 99, (32, 32): None, (32, 64): 80, (64, 32): 90}
    table = _table(times)
    best, _ = _walk(table)
    assert best is not None and table.mean_us[best] == 90
