"""The tile-cell exploration step of the fasta policy."""

from __future__ import annotations

import msgpack
import numpy as np

from fasta_sm.config import Config
from fasta_sm.policies import make_policy
from fasta_sm.policies.fasta.features import extract_features
from fasta_sm.policies.fasta.sampling import tile_cells, unexplored_cell_picks


def _space():
    configs = [
        Config(kwargs={"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=2)
        for m in (64, 128)
        for n in (64, 128)
        for k in (32, 64)
        for w in (4, 8)
    ]
    return configs, extract_features(configs)


def test_cells_group_tile_and_warps():
    configs, space = _space()
    cells, area = tile_cells(space, ("BLOCK_M", "BLOCK_N", "num_warps"), 40)
    assert cells is not None and int(cells.max()) + 1 == 8
    for i, c in enumerate(configs):
        assert area[i] == c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"]
    assert tile_cells(space, ("BLOCK_M", "BLOCK_N", "num_warps"), 7) == (None, None)
    assert tile_cells(space, ("XBLOCK",), 40) == (None, None)


def test_picks_best_scored_config_of_each_unexplored_larger_cell():
    configs, space = _space()
    cells, area = tile_cells(space, ("BLOCK_M", "BLOCK_N", "num_warps"), 40)
    n = len(configs)
    durations = np.full(n, np.nan)
    small = [i for i, c in enumerate(configs) if c.kwargs["BLOCK_M"] == 64 and c.kwargs["BLOCK_N"] == 64]
    durations[small] = 10.0
    durations[small[0]] = 5.0
    candidates = np.flatnonzero(np.isnan(durations))
    scores = np.arange(n, dtype=float)[::-1].copy()
    p_run = np.ones(n)
    picks = unexplored_cell_picks(cells, area, durations, candidates, scores, p_run, 10, 0.5)
    assert len(set(cells[picks].tolist())) == picks.size == 6  # every unexplored cell once
    for i in picks:
        inside = candidates[cells[candidates] == cells[i]]
        assert scores[i] == scores[inside].min()
    assert np.all(np.diff(scores[picks]) >= 0)  # best-scored cells first
    p_run[:] = 0.1  # predicted to fail: not explored
    assert unexplored_cell_picks(cells, area, durations, candidates, scores, p_run, 10, 0.5).size == 0
    assert unexplored_cell_picks(cells, area, durations, candidates, scores, np.ones(n), 2, 0.5).size == 2


def test_state_with_cell_columns_round_trips_through_msgpack():
    configs, _ = _space()
    policy = make_policy("fasta", configs, {})
    state = msgpack.unpackb(msgpack.packb(policy.state_dict()))
    other = make_policy("fasta", configs, {})
    other.load_state_dict(state)
    assert other.params == policy.params
