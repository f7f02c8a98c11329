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


def test_after_an_r1_that_all_failed_a_blind_round_takes_r1_min_and_leaves_the_rest_to_guided_rounds():
    grid = [{"kwargs": {"BLOCK_M": m, "BLOCK_N": n}, "num_warps": w, "num_stages": s, "compile_s": 1.0}
            for m in (16, 32, 64, 128) for n in (16, 32, 64, 128) for w in (2, 4, 8) for s in (2, 3, 4)]
    all_run = table_from_dict({"kernel": "k", **SYNTHETIC, "configs": [
        {**row, "duration_us": [1.0, 1.0], "error": None} for row in grid]}, "k")
    policy = make_policy("fasta", all_run.configs, {})
    r1 = set(policy.plan(np.random.default_rng(0)).batch)  # what the tune's R1 will be (seed 0)
    rows = [{**row, "duration_us": [] if i in r1 else [10.0 + i % 17] * 2,
             "error": "OutOfResources: shared memory" if i in r1 else None} for i, row in enumerate(grid)]
    table = table_from_dict({"kernel": "r1_all_fails", **SYNTHETIC, "configs": rows}, "r1_all_fails")
    tune = Tune.start("k", table.kernel, table.configs, ReplayBackend(table),
                      make_policy("fasta", table.configs, {}), seed=0)
    try:
        state = tune.drive()
    finally:
        tune.close()
    assert state.rounds[0].batch and set(state.rounds[0].batch) == r1
    assert len(state.rounds[1].batch) == policy.params.r1_min and "sampling blind" in state.rounds[1].reason
    assert any("R2_1" in r.reason for r in state.rounds[2:]), [r.reason for r in state.rounds]
