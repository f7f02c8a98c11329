"""Far spills by tile per warp (`spill_load`): one slow compile rules out every tile that loads its warps as much."""

from __future__ import annotations

import numpy as np
import pytest
from driving import resumed_from_before

from fasta_sm.backends.replay import load_table
from fasta_sm.config import Config
from fasta_sm.data import tables_dir
from fasta_sm.errors import PolicyError
from fasta_sm.policies.fasta import FastaPolicy
from fasta_sm.policies.fasta.feasibility import load_culprits

GELU = load_table(tables_dir() / "mm_bf16_gelu_4096.json")


def _space():
    configs = [
        Config(kwargs={"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
        for m in (64, 128, 256)
        for n in (64, 128, 256)
        for k in (32, 64)
        for w in (4, 8)
        for s in (2, 3)
    ]
    area = np.array([c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] for c in configs], dtype=float)
    load = area / np.array([c.num_warps for c in configs], dtype=float)
    return configs, area, load


def _index(configs, m, n, k, w, s):
    want = Config(kwargs={"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s).identity
    return next(i for i, c in enumerate(configs) if c.identity == want)


def _ruled_out(timings, ratio=5.0):
    """The configs and, per config, the far spill that rules it out (-1 for none)."""
    configs, area, load = _space()
    durations = np.full(len(configs), np.nan)
    for key, value in timings.items():
        durations[_index(configs, *key)] = value
    return configs, load_culprits(area, load, durations, ratio)


def test_a_far_spill_rules_out_every_tile_at_least_as_large_with_at_least_its_tile_per_warp():
    # best 128 x 128 at 8 warps (2,048 a warp); 128 x 256 at 4 warps (8,192 a warp) ran 7 times slower
    configs, p = _ruled_out({(128, 128, 64, 8, 3): 10.0, (128, 256, 64, 4, 3): 70.0})
    spill = _index(configs, 128, 256, 64, 4, 3)
    assert p[_index(configs, 256, 128, 32, 4, 2)] == spill  # the other orientation, a smaller BLOCK_K, fewer stages
    assert p[_index(configs, 256, 256, 32, 8, 2)] >= 0  # a larger tile at more warps, 8,192 a warp
    assert p[_index(configs, 256, 256, 64, 4, 3)] >= 0
    assert p[_index(configs, 128, 256, 64, 8, 3)] == -1  # the spill twin: 4,096 a warp
    assert p[_index(configs, 256, 128, 64, 8, 3)] == -1
    assert p[_index(configs, 64, 256, 64, 4, 3)] == -1  # a smaller tile


def test_a_config_less_than_spill_load_times_slower_rules_out_nothing():
    configs, p = _ruled_out({(128, 128, 64, 8, 3): 10.0, (128, 256, 64, 4, 3): 45.0})
    assert np.all(p == -1)


def test_a_slow_tile_with_less_tile_per_warp_than_the_best_rules_out_nothing():
    configs, p = _ruled_out({(128, 256, 64, 4, 3): 10.0, (256, 128, 64, 8, 3): 70.0})  # 4,096 a warp, best 8,192
    assert np.all(p == -1)
    configs, p = _ruled_out({(128, 256, 64, 4, 3): 10.0, (128, 128, 64, 8, 3): 70.0})  # smaller than the best
    assert np.all(p == -1)


def test_a_far_spill_at_the_best_tile_per_warp_rules_out_the_larger_tiles_at_that_load():
    configs, p = _ruled_out({(128, 128, 64, 4, 3): 10.0, (256, 128, 64, 8, 3): 70.0})  # 4,096 a warp each
    assert p[_index(configs, 256, 256, 32, 8, 2)] >= 0
    assert p[_index(configs, 128, 256, 32, 8, 2)] >= 0  # the same area and tile per warp
    assert p[_index(configs, 128, 128, 64, 8, 3)] == -1  # a smaller tile


def test_a_slow_tile_smaller_than_the_best_rules_out_nothing():
    # best 256 x 128 at 8 warps (4,096 a warp); 128 x 128 at 4 warps has that tile per warp on half the area
    configs, p = _ruled_out({(256, 128, 64, 8, 3): 10.0, (128, 128, 64, 4, 3): 70.0})
    assert np.all(p == -1)


def test_a_smaller_tile_at_the_tile_per_warp_of_a_far_spill_is_not_ruled_out():
    configs, p = _ruled_out({(128, 128, 64, 4, 3): 10.0, (256, 128, 64, 8, 3): 70.0})  # 4,096 a warp each
    assert p[_index(configs, 64, 256, 32, 4, 2)] == -1  # 4,096 a warp on half the spill's area
    assert p[_index(configs, 128, 128, 32, 4, 2)] == -1


def test_a_config_that_failed_is_no_far_spill():
    configs, p = _ruled_out({(128, 128, 64, 8, 3): 10.0, (128, 256, 64, 4, 3): np.inf})
    assert np.all(p == -1)


def test_spill_load_zero_is_off():
    configs, p = _ruled_out({(128, 128, 64, 8, 3): 10.0, (128, 256, 64, 4, 3): 70.0}, ratio=0.0)
    assert np.all(p == -1)


@pytest.mark.parametrize("value", [-1.0, 0.5, 1.0])
def test_spill_load_must_be_zero_or_above_one(value):
    with pytest.raises(PolicyError, match="spill_load"):
        FastaPolicy(GELU.configs, spill_load=value)


def test_the_policy_rules_out_far_spills_by_tile_per_warp_only_with_spill_load():
    names = [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps) for c in GELU.configs]
    best = next(i for i, c in enumerate(names) if c == (128, 256, 8) and GELU.errors[i] is None)
    spill = next(i for i, c in enumerate(names) if c == (128, 256, 4) and GELU.errors[i] is None)
    other = [i for i, c in enumerate(names) if c == (256, 128, 4)]
    durations = np.full(len(GELU.configs), np.nan)
    durations[best], durations[spill] = 100.0, 700.0
    on = FastaPolicy(GELU.configs, spill_load=5.0)._failure_chance(durations, {})
    off = FastaPolicy(GELU.configs, spill_load=0.0)._failure_chance(durations, {})
    assert np.all(on[other] == 1.0)
    assert not np.all(off[other] == 1.0)


def test_a_tune_resumed_from_before_spill_load_keeps_it_off():
    assert resumed_from_before("spill_load", GELU.configs).params.spill_load == 0.0
