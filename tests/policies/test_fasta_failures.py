"""A tune must end with a winner whenever some config can run, whatever the budget."""

from __future__ import annotations

import numpy as np
import pytest
from landscapes import SYNTHETIC

from fasta_sm.backends.replay import ReplayBackend, table_from_dict
from fasta_sm.machine import Tune
from fasta_sm.policies import make_policy


def mostly_failing_table(n: int = 200, runnable: int = 3, seed: int = 0):
    """A space where all but `runnable` configs fail to compile (out of resources)."""
    rng = np.random.default_rng(seed)
    good = set(rng.choice(n, size=runnable, replace=False).tolist())
    rows = [{
        "kwargs": {"BLOCK": 16 * (1 + i % 20), "SPLIT": 1 + i // 20},
        "num_warps": 4, "num_stages": 2, "compile_s": 1.0,
        "duration_us": [100.0 + i, 100.0 + i] if i in good else [],
        "error": None if i in good else "OutOfResources: shared memory",
    } for i in range(n)]
    return table_from_dict({"kernel": "mostly_failing", **SYNTHETIC, "configs": rows}, "mostly_failing")


@pytest.mark.parametrize("seed", range(5))
def test_fasta_keeps_sampling_past_its_budget_until_a_config_runs(seed):
    table = mostly_failing_table(seed=seed)
    tune = Tune.start("k", table.kernel, table.configs, ReplayBackend(table),
                      make_policy("fasta", table.configs, {"budget": 0.02}), seed=seed)
    try:
        state = tune.drive()
    finally:
        tune.close()
    assert state.done and state.best is not None and table.errors[state.best] is None


def sparse_runnable_table():
    """60 configs over three columns, of which only every ninth runs: R1 is too thin for a guided round."""
    rows = [{
        "kwargs": {"BLOCK_M": m, "BLOCK_K": k}, "num_warps": w, "num_stages": 1, "compile_s": 1.0,
        "duration_us": [10.0 + 0.1 * i] * 2 if i % 9 == 0 else [],
        "error": None if i % 9 == 0 else "OutOfResources: shared memory",
    } for i, (m, k, w) in enumerate((m, k, w) for m in (16, 32, 64, 128, 256) for k in (16, 32, 64, 128)
                                    for w in (2, 4, 8))]
    return table_from_dict({"kernel": "sparse_runnable", **SYNTHETIC, "configs": rows}, "sparse_runnable")


@pytest.mark.parametrize("seed", [2, 9])
def test_a_polish_before_any_guided_round_fits_one_of_the_bases_it_was_given(seed):
    table = sparse_runnable_table()
    policy = make_policy("fasta", table.configs, {"bases": ("linear", "quad")})
    tune = Tune.start("k", table.kernel, table.configs, ReplayBackend(table), policy, seed=seed)
    try:
        state = tune.drive()
    finally:
        tune.close()
    polish = [r.reason for r in state.rounds if "polish" in r.reason]
    assert state.done and table.errors[state.best] is None
    assert polish and all("basis linear" in reason or "basis quad" in reason for reason in polish)
