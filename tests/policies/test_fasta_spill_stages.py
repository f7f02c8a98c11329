"""Spill dominance at every stage count: a register spill implies one at fewer stages as well as at more."""

from __future__ import annotations

import numpy as np
import pytest
from driving import proposed_over_a_spill, resumed_from_before

from fasta_sm.backends.replay import load_table
from fasta_sm.config import Config
from fasta_sm.data import tables_dir
from fasta_sm.policies.fasta import FastaPolicy
from fasta_sm.policies.fasta.feasibility import register_pressure, resource_pressure
from fasta_sm.policies.fasta.features import extract_features

GELU = load_table(tables_dir() / "mm_bf16_gelu_4096.json")


def _configs():
    return [
        Config(kwargs={"BLOCK_K": k, "BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
        for k in (32, 64)
        for m in (64, 128)
        for n in (64, 128)
        for w in (4, 8)
        for s in (2, 3)
    ]


def _index(configs, k, m, n, w, s):
    want = Config(kwargs={"BLOCK_K": k, "BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s).identity
    return next(i for i, c in enumerate(configs) if c.identity == want)


def _p_fail(timings, **params):
    configs = _configs()
    policy = FastaPolicy(configs, **params)
    durations = np.full(len(configs), np.nan)
    for key, value in timings.items():
        durations[_index(configs, *key)] = value
    return configs, policy._failure_chance(durations, {})


SPILL = {(32, 64, 64, 8, 2): 10.0, (64, 128, 64, 4, 3): 40.0}  # BLOCK_K 64, 128 x 64, 4 warps, 3 stages: 4x the best


def test_a_spill_rules_out_its_tile_at_fewer_stages():
    configs, p = _p_fail(SPILL)
    assert p[_index(configs, 64, 128, 64, 4, 2)] == 1.0  # fewer stages
    assert p[_index(configs, 64, 128, 128, 4, 2)] == 1.0  # a larger tile at fewer stages
    assert p[_index(configs, 32, 128, 64, 4, 3)] == 0.0  # a smaller BLOCK_K: fewer registers, left open
    assert p[_index(configs, 64, 128, 64, 8, 2)] == 0.0  # more warps: the spill twin stays open
    assert p[_index(configs, 64, 64, 128, 4, 2)] == 0.0  # the transposed tile is not larger in every column


def test_without_spill_all_stages_fewer_stages_stay_open():
    configs, p = _p_fail(SPILL, spill_all_stages=False)
    assert p[_index(configs, 64, 128, 64, 4, 2)] == 0.0
    assert p[_index(configs, 64, 128, 128, 4, 2)] == 0.0
    assert p[_index(configs, 64, 128, 128, 4, 3)] == 1.0


def test_a_slow_tile_smaller_than_the_best_still_implies_nothing():
    configs, p = _p_fail({(32, 128, 128, 8, 3): 10.0, (64, 64, 64, 4, 3): 40.0})
    assert np.all(p == 0.0)


def test_register_pressure_is_resource_pressure_without_the_stages():
    space = extract_features(_configs())
    full = resource_pressure(space.names, space.levels)
    registers = register_pressure(space.names, space.levels)
    stages = space.names.index("num_stages")
    assert np.array_equal(registers, np.delete(full, stages, axis=1))


def test_without_a_kwarg_there_is_no_register_pressure():
    configs = [Config(kwargs={}, num_warps=w, num_stages=s) for w in (2, 4) for s in (1, 2)]
    space = extract_features(configs)
    assert register_pressure(space.names, space.levels) is None


def _proposed_under_a_spill(params: dict, seed: int) -> list[int]:
    """Configs a tune of the GELU matmul proposed at least as large as a measured spill, stages aside."""
    space = extract_features(GELU.configs)
    return proposed_over_a_spill(GELU, params, seed, register_pressure(space.names, space.levels))


@pytest.mark.parametrize("seed", range(4))
def test_no_config_over_a_measured_spill_at_any_stage_count_is_proposed(seed):
    assert _proposed_under_a_spill({}, seed) == []


def test_without_spill_all_stages_the_gelu_tunes_go_back_to_a_spilled_tile_at_fewer_stages():
    assert any(_proposed_under_a_spill({"spill_all_stages": False, "spill_load": 0.0}, seed) for seed in range(4))


def test_a_tune_resumed_from_before_spill_all_stages_keeps_it_off():
    assert resumed_from_before("spill_all_stages", GELU.configs).params.spill_all_stages is False
