"""What the fasta policy infers from failures and seconds: resource dominance and the cost budget."""

from __future__ import annotations

import math

import landscapes
import numpy as np
import pytest
from driving import Simulator, decide_and_resume, drive

from fasta_sm.config import Config
from fasta_sm.policies.fasta import FastaPolicy
from fasta_sm.policies.fasta.feasibility import resource_dominance, resource_pressure
from fasta_sm.policies.fasta.features import extract_features
from fasta_sm.protocols import Observations

MATMUL = landscapes.as_table(landscapes.matmul(3, size=500))


def _space():
    configs = [
        Config(kwargs={"BLOCK_M": m, "BLOCK_K": k}, num_warps=w, num_stages=s)
        for m in (64, 128)
        for k in (32, 64)
        for w in (4, 8)
        for s in (2, 3)
    ]
    space = extract_features(configs)
    return configs, resource_pressure(space.names, space.levels)


def _index(configs, m, k, w, s):
    want = Config(kwargs={"BLOCK_M": m, "BLOCK_K": k}, num_warps=w, num_stages=s).identity
    return next(i for i, c in enumerate(configs) if c.identity == want)


def test_pressure_grows_with_tiles_and_stages_and_falls_with_warps():
    configs, pressure = _space()
    small = pressure[_index(configs, 64, 32, 8, 2)]
    assert np.all(pressure[_index(configs, 128, 64, 4, 3)] >= small)
    assert np.all(pressure[_index(configs, 64, 32, 8, 2)] <= pressure[_index(configs, 64, 32, 4, 2)])


def test_no_kwarg_or_stage_column_means_no_pressure():
    configs = [Config(kwargs={}, num_warps=w, num_stages=3) for w in (2, 4, 8)]
    space = extract_features(configs)
    assert resource_pressure(space.names, space.levels) is None


def test_everything_under_more_pressure_than_a_failure_fails():
    configs, pressure = _space()
    durations = np.full(len(configs), np.nan)
    durations[_index(configs, 128, 32, 8, 3)] = math.inf
    durations[_index(configs, 64, 64, 4, 2)] = 10.0
    p = resource_dominance(pressure, durations, np.full(len(configs), 0.5))
    assert p[_index(configs, 128, 64, 8, 3)] == 1.0  # larger tile, same warps and stages
    assert p[_index(configs, 128, 32, 4, 3)] == 1.0  # same tile with fewer warps: more registers per thread
    assert p[_index(configs, 128, 32, 8, 2)] == 0.5  # fewer stages: nothing implied
    assert p[_index(configs, 64, 32, 8, 2)] == 0.5  # the ridge fit's guess stands elsewhere


def test_a_failure_below_a_config_that_ran_implies_nothing():
    configs, pressure = _space()
    durations = np.full(len(configs), np.nan)
    durations[_index(configs, 64, 32, 8, 2)] = math.inf  # broke for a reason other than resources
    durations[_index(configs, 128, 64, 4, 3)] = 10.0
    p = resource_dominance(pressure, durations, np.full(len(configs), 0.5))
    assert np.all(p == 0.5)


@pytest.mark.parametrize("seed", range(4))
def test_nothing_at_least_as_large_as_a_failure_is_proposed_after_it(seed):
    policy = FastaPolicy(MATMUL.configs)
    trace = drive(policy, MATMUL, seed=seed)
    space = extract_features(MATMUL.configs)
    pressure = resource_pressure(space.names, space.levels)
    failed: list[int] = []
    for batch in trace.batches:
        for index in batch:
            assert not any(np.all(pressure[index] >= pressure[f]) for f in failed), f"config #{index}"
        failed += [i for i in batch if MATMUL.errors[i] is not None]


def test_cost_budget_extrapolates_the_exhaustive_seconds_from_r1():
    """Picks dearer than R1's average reach the budget sooner than their count does."""
    policy = FastaPolicy(MATMUL.configs, cost_budget=0.1)
    n = len(MATMUL.configs)

    def observed(evaluated: int, spent: float) -> Observations:
        durations = np.full(n, np.nan)
        durations[:evaluated] = 10.0
        return Observations(durations, np.ones(n), np.ones(n), spent)

    assert not policy._cost_spent(observed(10, 10.0), np.where(np.arange(n) < 10, 10.0, np.nan))
    # 20 configs (4 % of N) that cost 60 s: 12 % of the 500 s R1 predicts, over the 10 % budget
    assert policy._cost_spent(observed(20, 60.0), np.where(np.arange(n) < 20, 10.0, np.nan))


def test_state_round_trip_with_a_cost_budget_keeps_the_r1_estimate():
    policy = FastaPolicy(MATMUL.configs, cost_budget=0.15)
    rng = np.random.default_rng(3)
    sim = Simulator(MATMUL, 3)
    sim.measure(policy.plan(rng))
    for _ in range(2):
        decision = policy.refine(sim.observed(), rng)
        sim.measure(decision)
    assert policy.state_dict()["r1_cost"] is not None
    expected, again, _ = decide_and_resume(policy, MATMUL.configs, sim.observed(), rng)
    assert list(again.batch) == list(expected.batch) and again.reason == expected.reason
