"""What the fasta policy infers from failures and seconds: resource dominance and the cost budget."""

from __future__ import annotations

import math

import landscapes
import numpy as np
import pytest
from driving import Simulator, decide_and_resume, drive, resumed_from_before

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.config import Config
from fasta_sm.data import tables_dir
from fasta_sm.failures import shared_memory_overshoot
from fasta_sm.machine import Tune
from fasta_sm.policies.fasta import FastaPolicy
from fasta_sm.policies.fasta.feasibility import (
    overshoot_culprits,
    resource_culprits,
    resource_pressure,
    shared_memory_columns,
)
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
    by = resource_culprits(pressure, durations)
    failure = _index(configs, 128, 32, 8, 3)
    assert by[_index(configs, 128, 64, 8, 3)] == failure  # larger tile, same warps and stages
    assert by[_index(configs, 128, 32, 4, 3)] == failure  # same tile with fewer warps: more registers per thread
    assert by[_index(configs, 128, 32, 8, 2)] == -1  # fewer stages: nothing implied
    assert by[_index(configs, 64, 32, 8, 2)] == -1


def test_a_failure_below_a_config_that_ran_implies_nothing():
    configs, pressure = _space()
    durations = np.full(len(configs), np.nan)
    durations[_index(configs, 64, 32, 8, 2)] = math.inf  # broke for a reason other than resources
    durations[_index(configs, 128, 64, 4, 3)] = 10.0
    assert np.all(resource_culprits(pressure, durations) == -1)


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


def _out_of_shared_memory(required: int, limit: int = 232448) -> str:
    """The error Triton's OutOfResources gives, as the live backend records it."""
    return (
        f"OutOfResources: out of resource: shared memory, Required: {required}, Hardware limit: {limit}. "
        "Reducing block sizes or `num_stages` may help."
    )


def test_overshoot_is_read_from_tritons_shared_memory_error_only():
    failures = {0: _out_of_shared_memory(2 * 232448), 1: "CompilationError: at 12:4: unsupported tile", 3: ""}
    overshoot = shared_memory_overshoot(failures, 4)
    assert overshoot[0] == 2.0
    assert np.isnan(overshoot[1:]).all()


def _bound(configs, failed_index, ratio, ran=()):
    """Which configs the overshoot bound rules out after one failure `ratio` times over the limit."""
    space = extract_features(configs)
    sizes, stages = shared_memory_columns(space.names)
    durations = np.full(len(configs), np.nan)
    durations[failed_index] = math.inf
    durations[list(ran)] = 10.0
    overshoot = np.full(len(configs), np.nan)
    overshoot[failed_index] = ratio
    return overshoot_culprits(space.raw, sizes, stages, durations, overshoot) >= 0


def test_a_failure_far_over_the_limit_rules_out_smaller_tiles_too():
    configs, _ = _space()
    p = _bound(configs, _index(configs, 128, 64, 4, 3), 2.3)
    assert p[_index(configs, 128, 32, 4, 3)]  # half the BLOCK_K still needs 1.15× the limit
    assert p[_index(configs, 64, 64, 4, 3)]
    assert not p[_index(configs, 64, 32, 4, 3)]  # a quarter of the tile may fit


def test_the_bound_counts_pipelined_buffers_as_stages_minus_one():
    configs, _ = _space()
    failed = _index(configs, 128, 64, 4, 3)
    assert _bound(configs, failed, 2.3)[_index(configs, 128, 64, 4, 2)]  # half the buffers: 1.15×
    assert not _bound(configs, failed, 1.9)[_index(configs, 128, 64, 4, 2)]  # 0.95×: may fit


def test_the_bound_rules_out_a_failed_tile_at_more_warps_which_dominance_leaves_open():
    configs, _ = _space()
    p = _bound(configs, _index(configs, 128, 64, 4, 3), 1.2)
    assert p[_index(configs, 128, 64, 8, 3)]
    assert not p[_index(configs, 128, 32, 4, 3)]


def test_fewer_warps_count_as_a_smaller_size():
    configs, _ = _space()
    failed = _index(configs, 128, 64, 8, 3)
    assert not _bound(configs, failed, 1.2)[_index(configs, 128, 64, 4, 3)]  # 0.6× at half the warps
    assert _bound(configs, failed, 2.3)[_index(configs, 128, 64, 4, 3)]


def test_a_column_neither_size_nor_stages_must_match_for_the_bound():
    configs = [
        Config(kwargs={"BLOCK": b}, num_warps=4, num_stages=2, options={"num_ctas": c})
        for b in (64, 128)
        for c in (1, 2)
    ]
    failed = next(i for i, c in enumerate(configs) if c.kwargs["BLOCK"] == 128 and c.options["num_ctas"] == 1)
    p = _bound(configs, failed, 3.0)
    assert [p[i] for i, c in enumerate(configs) if c.options["num_ctas"] == 2] == [False, False]
    assert [p[i] for i, c in enumerate(configs) if c.options["num_ctas"] == 1] == [True, True]


def test_a_failure_whose_bound_would_rule_out_a_config_that_ran_is_ignored():
    configs, _ = _space()
    p = _bound(configs, _index(configs, 128, 64, 4, 3), 2.3, ran=[_index(configs, 128, 32, 4, 3)])
    assert not p.any()


def test_the_policy_reads_the_overshoot_from_the_failures_it_is_shown():
    configs, _ = _space()
    durations = np.full(len(configs), np.nan)
    failed, half_k = _index(configs, 128, 64, 4, 3), _index(configs, 128, 32, 4, 3)
    durations[[failed, _index(configs, 64, 32, 8, 2)]] = [math.inf, 10.0]
    policy = FastaPolicy(configs)
    assert policy._failure_chance(durations, {failed: _out_of_shared_memory(round(2.3 * 232448))})[half_k] == 1.0
    assert policy._failure_chance(durations, {failed: "OutOfResources: shared memory"})[half_k] < 1.0


def _one_failure_seen(configs):
    """The corner config (BLOCK_M 128, BLOCK_K 64, 4 warps, 3 stages) failed and a small one ran.

    The failure's message carries no Required / limit figures, so the shared-memory bound stays silent.
    """
    durations = np.full(len(configs), np.nan)
    failed = _index(configs, 128, 64, 4, 3)
    durations[[failed, _index(configs, 64, 32, 8, 2)]] = [math.inf, 10.0]
    return durations, {failed: "OutOfResources: out of resource: shared memory"}


def test_by_default_a_config_no_rule_reaches_keeps_a_zero_failure_chance():
    configs, _ = _space()
    durations, failures = _one_failure_seen(configs)
    one_stage_fewer = _index(configs, 128, 64, 4, 2)
    assert FastaPolicy(configs)._failure_chance(durations, failures)[one_stage_fewer] == 0.0


def test_failure_fit_gives_the_failures_neighbours_a_failure_chance():
    configs, _ = _space()
    durations, failures = _one_failure_seen(configs)
    one_stage_fewer = _index(configs, 128, 64, 4, 2)
    assert FastaPolicy(configs, failure_fit=True)._failure_chance(durations, failures)[one_stage_fewer] > 0.0


def test_without_failure_fit_dominance_still_rules_out_a_larger_config():
    configs, _ = _space()
    durations = np.full(len(configs), np.nan)
    failed = _index(configs, 128, 32, 4, 3)
    durations[[failed, _index(configs, 64, 32, 8, 2)]] = [math.inf, 10.0]
    failures = {failed: "OutOfResources: out of resource: shared memory"}
    assert FastaPolicy(configs)._failure_chance(durations, failures)[_index(configs, 128, 64, 4, 3)] == 1.0


def test_a_state_from_before_failure_fit_resumes_with_the_fit():
    configs, _ = _space()
    assert resumed_from_before("failure_fit", configs).params.failure_fit is True


def test_failure_weight_zero_turns_the_rules_off_too():
    configs, _ = _space()
    durations, _ = _one_failure_seen(configs)
    failed = _index(configs, 128, 64, 4, 3)
    figures = {failed: _out_of_shared_memory(round(2.3 * 232448))}
    assert np.all(FastaPolicy(configs, failure_weight=0)._failure_chance(durations, figures) == 0.0)


def test_failure_dominance_off_turns_the_bound_off():
    configs, _ = _space()
    durations = np.full(len(configs), np.nan)
    failed, half_k = _index(configs, 128, 64, 4, 3), _index(configs, 128, 32, 4, 3)
    durations[[failed, _index(configs, 64, 32, 8, 2)]] = [math.inf, 10.0]
    off = FastaPolicy(configs, failure_dominance=False)
    assert off._failure_chance(durations, {failed: _out_of_shared_memory(round(2.3 * 232448))})[half_k] < 1.0


def test_polish_takes_no_step_that_a_failures_figures_rule_out():
    configs, _ = _space()
    failed = _index(configs, 128, 64, 4, 3)
    untried = [_index(configs, 128, 32, 8, 3), _index(configs, 64, 64, 8, 3)]  # each 1.15x the limit at 2.3x
    durations = np.where(_bound(configs, failed, 2.3) == 1.0, math.inf, 20.0)  # the rest of the corner failed too
    durations[_index(configs, 64, 32, 8, 3)] = 10.0
    durations[untried] = np.nan
    candidates = np.flatnonzero(np.isnan(durations))
    figures = {failed: _out_of_shared_memory(round(2.3 * 232448))}
    assert FastaPolicy(configs)._polish_round(durations, candidates, {}) is not None
    assert FastaPolicy(configs)._polish_round(durations, candidates, figures) is None


@pytest.mark.parametrize("seed", range(3))
def test_through_the_engine_no_config_a_recorded_failure_bounds_is_compiled_after_it(seed):
    table = load_table(tables_dir() / "mm_bf16_gelu_4096.json")
    n = len(table.configs)
    tune = Tune.start(
        key=f"bound/{seed}",
        kernel=table.kernel,
        configs=table.configs,
        backend=ReplayBackend(table, noise=True, seed=seed),
        policy=FastaPolicy(table.configs),
        seed=seed,
        chunk_size=n,
        benchmark_chunk=n,
    )
    state = tune.drive()
    tune.close()
    space = extract_features(table.configs)
    sizes, stages = shared_memory_columns(space.names)
    durations = np.full(n, np.nan)
    ruled_out = 0
    for record in (r for r in state.rounds if not r.retime):
        failures = {i: state.failed[i] for i in np.flatnonzero(np.isinf(durations))}
        bound = overshoot_culprits(space.raw, sizes, stages, durations, shared_memory_overshoot(failures, n)) >= 0
        if record.phase != "R1":
            assert not bound[list(record.batch)].any(), f"{record.phase}_{record.round}"
        ruled_out += int(bound.sum())
        for i in record.batch:
            durations[i] = math.inf if i in state.failed else state.mean_us(i)
    assert ruled_out > 0, "the recorded failures bounded nothing: the test checks nothing"


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


@pytest.mark.parametrize("seed", [3, 4])
def test_a_spent_cost_budget_also_skips_the_polish(seed):
    table = load_table(tables_dir() / "mm_fp16_4096.json")
    policy = FastaPolicy(table.configs, cost_budget=0.18)
    polish, spent_at_polish = policy._polish_round, []

    def watched(durations, candidates, failures):
        spent_at_polish.append(policy._cost_spent(watched.observed, durations))
        return polish(durations, candidates, failures)

    refine = policy.refine

    def refine_watching(observed, rng):
        watched.observed = observed
        return refine(observed, rng)

    policy._polish_round, policy.refine = watched, refine_watching
    drive(policy, table, seed=seed)
    assert not any(spent_at_polish)


def test_a_kwarg_of_more_than_32767_values_rules_out_only_the_configs_above_its_failure():
    n = 40_000  # level codes past int16's range wrapped around: every config below level 32,768 was ruled out
    pressure = resource_pressure(("kwargs.BLOCK",), np.arange(n).reshape(-1, 1))
    durations = np.full(n, np.nan)
    durations[33_000], durations[36_000] = 5.0, math.inf
    ruled_out = resource_culprits(pressure, durations) >= 0
    assert np.array_equal(np.flatnonzero(ruled_out), np.arange(36_000, n))
