"""Spill dominance: a tile past the best's that ran several times slower rules out the tiles above it."""

from __future__ import annotations

import numpy as np
import pytest
from driving import proposed_over_a_spill, resumed_from_before

from fasta_sm.backends.replay import load_table
from fasta_sm.config import Config
from fasta_sm.data import tables_dir
from fasta_sm.errors import PolicyError
from fasta_sm.policies.fasta import FastaPolicy
from fasta_sm.policies.fasta.feasibility import resource_pressure, spill_culprits
from fasta_sm.policies.fasta.features import extract_features

GELU = load_table(tables_dir() / "mm_bf16_gelu_4096.json")


def _space():
    configs = [
        Config(kwargs={"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
        for m in (64, 128)
        for n in (64, 128)
        for w in (4, 8)
        for s in (2, 3)
    ]
    space = extract_features(configs)
    area = np.array([c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] for c in configs], dtype=float)
    load = area / np.array([c.num_warps for c in configs], dtype=float)
    return configs, resource_pressure(space.names, space.levels), area, load


def _index(configs, m, n, w, s):
    want = Config(kwargs={"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s).identity
    return next(i for i, c in enumerate(configs) if c.identity == want)


def _measured(configs, timings):
    durations = np.full(len(configs), np.nan)
    for key, value in timings.items():
        durations[_index(configs, *key)] = value
    return durations


def test_everything_under_more_pressure_than_a_spill_is_taken_to_spill():
    configs, pressure, area, load = _space()
    durations = _measured(configs, {(64, 64, 8, 2): 10.0, (128, 64, 4, 2): 40.0})
    by = spill_culprits(pressure, area, load, durations, 3.0)
    spill = _index(configs, 128, 64, 4, 2)
    assert by[_index(configs, 128, 128, 4, 2)] == spill  # a larger tile at the same warps
    assert by[_index(configs, 128, 64, 4, 3)] == spill  # the same tile, deeper pipeline
    assert by[_index(configs, 128, 64, 8, 2)] == -1  # more warps: fewer registers per thread (the spill twin)
    assert by[_index(configs, 64, 128, 4, 2)] == -1  # not larger in every column


def test_a_slow_tile_smaller_than_the_best_implies_nothing():
    configs, pressure, area, load = _space()
    durations = _measured(configs, {(128, 128, 8, 3): 10.0, (64, 64, 4, 2): 40.0})  # too little work, not a spill
    assert np.all(spill_culprits(pressure, area, load, durations, 3.0) == -1)


def test_a_slow_tile_at_more_warps_than_the_best_implies_nothing():
    configs, pressure, area, load = _space()
    durations = _measured(configs, {(128, 64, 4, 2): 10.0, (128, 64, 8, 2): 40.0})  # too many warps, not a spill
    assert np.all(spill_culprits(pressure, area, load, durations, 3.0) == -1)


def test_a_tile_less_than_spill_times_slower_implies_nothing():
    configs, pressure, area, load = _space()
    durations = _measured(configs, {(64, 64, 8, 2): 10.0, (128, 64, 4, 2): 29.0})
    assert np.all(spill_culprits(pressure, area, load, durations, 3.0) == -1)


def _proposed_over_a_spill(params: dict, seed: int) -> list[int]:
    """Configs a tune of the GELU matmul proposed at least as large as a spill it had measured (recorded means)."""
    space = extract_features(GELU.configs)
    return proposed_over_a_spill(GELU, params, seed, resource_pressure(space.names, space.levels))


@pytest.mark.parametrize("seed", range(4))
def test_no_config_at_least_as_large_as_a_measured_spill_is_proposed(seed):
    assert _proposed_over_a_spill({}, seed) == []


def test_without_spill_dominance_the_gelu_tunes_propose_configs_over_a_spill():
    assert any(_proposed_over_a_spill({"spill_dominance": False, "spill_load": 0.0}, seed) for seed in range(4))


def test_a_tune_resumed_from_before_spill_dominance_keeps_it_off():
    assert resumed_from_before("spill_dominance", GELU.configs).params.spill_dominance is False


def test_a_slow_tile_of_smaller_area_at_the_same_tile_per_warp_implies_nothing():
    configs, pressure, area, load = _space()
    durations = _measured(configs, {(128, 64, 8, 2): 10.0, (64, 64, 4, 2): 40.0})  # 1,024 per warp each
    assert np.all(spill_culprits(pressure, area, load, durations, 3.0) == -1)


def test_fewer_stages_than_a_spill_stay_open():
    configs, pressure, area, load = _space()
    durations = _measured(configs, {(64, 64, 8, 2): 10.0, (128, 64, 4, 3): 40.0})
    by = spill_culprits(pressure, area, load, durations, 3.0)
    assert by[_index(configs, 128, 64, 4, 2)] == -1
    assert by[_index(configs, 128, 128, 4, 3)] == _index(configs, 128, 64, 4, 3)


def test_without_a_tile_kwarg_among_the_cell_columns_nothing_is_ruled_a_spill():
    configs = [
        Config(kwargs={"ROWS": r}, num_warps=w, num_stages=s) for r in (1, 2, 4) for w in (2, 4, 8) for s in (1, 2)
    ]
    policy = FastaPolicy(configs)
    durations = np.full(len(configs), np.nan)
    durations[0] = 10.0  # ROWS 1, 2 warps, 1 stage
    durations[6] = 50.0  # ROWS 2, 2 warps, 1 stage: slow, but ROWS is no tile column, so no spill
    assert np.all(policy._failure_chance(durations, {}) == 0.0)


@pytest.mark.parametrize("spill", [0.5, 1.0])
def test_a_spill_factor_of_one_or_less_is_refused(spill):
    with pytest.raises(PolicyError, match="cell_spill"):
        FastaPolicy(GELU.configs, cell_spill=spill)
