"""The tile-cell exploration step of the fasta policy."""

from __future__ import annotations

import msgpack
import numpy as np
from driving import resumed_from_before

from fasta_sm.config import Config
from fasta_sm.policies import make_policy
from fasta_sm.policies.fasta import FastaPolicy
from fasta_sm.policies.fasta.features import extract_features
from fasta_sm.policies.fasta.policy import NEW_CELL_STEPS, SCALED_UP, SPILL_TWIN
from fasta_sm.policies.fasta.sampling import (
    cell_retry_picks,
    one_step_neighbours,
    scaled_up_tiles,
    spill_twin_picks,
    tile_cells,
    transposed_tile,
    unexplored_cell_picks,
)


def _space(stages=(2,)):
    configs = [
        Config(kwargs={"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
        for m in (64, 128)
        for n in (64, 128)
        for k in (32, 64)
        for w in (4, 8)
        for s in stages
    ]
    return configs, extract_features(configs)


def _index(configs, m, n, k, w, s):
    want = Config(kwargs={"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s).identity
    return next(i for i, c in enumerate(configs) if c.identity == want)


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
    policy = make_policy("fasta", configs, {"cell_columns": ("BLOCK_M", "num_warps")})
    state = msgpack.unpackb(msgpack.packb(policy.state_dict()))
    other = make_policy("fasta", configs, {})
    other.load_state_dict(state)
    assert other.params.cell_columns == ("BLOCK_M", "num_warps") and other.params == policy.params


def test_a_cell_sampled_at_the_wrong_stages_is_retried_at_the_best_values_of_its_tile_area():
    configs, space = _space(stages=(1, 3))
    cells, area = tile_cells(space, ("BLOCK_M", "BLOCK_N", "num_warps"), 40)
    free = space.levels[:, [j for j, name in enumerate(space.names) if name in ("kwargs.BLOCK_K", "num_stages")]]
    n = len(configs)
    durations = np.full(n, np.nan)
    durations[_index(configs, 64, 64, 64, 8, 3)] = 10.0  # the best: BLOCK_K 64, 3 stages
    durations[_index(configs, 64, 128, 32, 8, 3)] = 12.0  # best of the 8192-element tiles: BLOCK_K 32, 3 stages
    durations[_index(configs, 128, 64, 32, 4, 1)] = 50.0  # a 128 x 64 cell, tried at 1 stage only
    durations[_index(configs, 128, 128, 32, 8, 1)] = 40.0  # the largest tile, tried at 1 stage only
    candidates = np.flatnonzero(np.isnan(durations))
    scores = np.zeros(n)
    picks = cell_retry_picks(cells, area, free, durations, candidates, scores, np.ones(n), 10, 0.5)
    assert sorted(picks.tolist()) == sorted(
        [
            _index(configs, 128, 64, 32, 4, 3),  # at the values of the faster 64 x 128 config
            _index(configs, 128, 128, 64, 8, 3),  # no other cell of its area ran: at the best's values
            _index(configs, 64, 128, 64, 8, 3),  # its only peer is slower than itself: at the best's values
        ]
    )
    scores[_index(configs, 128, 128, 64, 8, 3)] = -1.0
    assert cell_retry_picks(cells, area, free, durations, candidates, scores, np.ones(n), 1, 0.5).tolist() == [
        _index(configs, 128, 128, 64, 8, 3)
    ]
    # unexplored cells, cells smaller than the best's tile and likely failures are never retried
    assert cell_retry_picks(cells, area, free, durations, candidates, scores, np.zeros(n), 10, 0.5).size == 0
    assert cell_retry_picks(cells, area, free, durations, candidates, scores, np.ones(n), 0, 0.5).size == 0


def test_one_step_neighbours_move_one_column_by_one_level():
    levels = np.array([[0, 0], [1, 0], [2, 0], [1, 1], [0, 1], [2, 2]])
    candidates = np.arange(1, 6)
    assert one_step_neighbours(levels, np.array([0]), candidates).tolist() == [1, 4]
    assert one_step_neighbours(levels, np.array([0, 5]), candidates).tolist() == [1, 4]
    assert one_step_neighbours(levels, np.array([2]), candidates).tolist() == [1]


def test_polish_steps_from_one_of_the_fastest_configs():
    from driving import drive
    from landscapes import as_table, matmul

    table = as_table(matmul(3, size=500))
    policy = make_policy("fasta", table.configs, {"cell_max": 0})
    trace = drive(policy, table, seed=1)
    levels = extract_features(table.configs).levels
    seen: list[int] = []
    polished = 0
    for decision in trace.decisions:
        if decision.reason.startswith("fasta polish"):
            measured = [i for i in seen if np.isfinite(trace.durations[i])]
            centers = sorted(measured, key=lambda i: trace.durations[i])[: policy.params.polish_centers]
            (pick,) = decision.batch
            assert pick not in seen
            assert any(np.abs(levels[pick] - levels[c]).sum() == 1 for c in centers)
            polished += 1
        if not decision.retime:
            seen += list(decision.batch)
    assert 1 <= polished <= policy.params.polish_extra


def _spilled_large_tile(configs, spill_factor):
    """64 x 64 measured (the best at 5), the 128 x 128 tile measured only at 4 warps, `spill_factor` times slower."""
    durations = np.full(len(configs), np.nan)
    for i, c in enumerate(configs):
        if c.kwargs["BLOCK_M"] == c.kwargs["BLOCK_N"] == 64:
            durations[i] = 6.0
    durations[_index(configs, 64, 64, 32, 8, 2)] = 5.0
    durations[_index(configs, 128, 128, 32, 4, 2)] = 5.0 * spill_factor
    return durations


def test_a_tile_that_spilled_at_few_warps_is_tried_at_more_warps():
    configs, space = _space()
    cells, area = tile_cells(space, ("BLOCK_M", "BLOCK_N", "num_warps"), 40)
    warps = space.names.index("num_warps")
    n = len(configs)
    scores = np.arange(n, dtype=float)
    twin_cell = cells[_index(configs, 128, 128, 32, 8, 2)]

    def picks(factor, spill=3.0):
        durations = _spilled_large_tile(configs, factor)
        candidates = np.flatnonzero(np.isnan(durations))
        return spill_twin_picks(
            space.levels, warps, cells, area, durations, candidates, scores, np.ones(n), 1, 0.5, spill
        )

    (pick,) = picks(4.0)
    inside = [i for i in range(n) if cells[i] == twin_cell]
    assert cells[pick] == twin_cell and scores[pick] == min(scores[inside])
    assert picks(2.0).size == 0  # slower, not a spill
    assert picks(4.0, spill=0.0).size == 0  # off


def test_polish_tries_the_spilled_tile_at_more_warps_first():
    configs, _ = _space()
    durations = _spilled_large_tile(configs, 4.0)
    candidates = np.flatnonzero(np.isnan(durations))
    twin = {_index(configs, 128, 128, k, 8, 2) for k in (32, 64)}
    polish = FastaPolicy(configs)._polish_round(durations, candidates, {})
    assert polish is not None and polish.batch[0] in twin
    assert "a spilled tile at more warps" in polish.reason
    plain = FastaPolicy(configs, cell_spill=0.0)._polish_round(durations, candidates, {})
    assert plain is not None and plain.batch[0] not in twin


def test_a_state_from_before_the_spill_twins_resumes_without_them():
    configs, _ = _space()
    assert resumed_from_before("cell_spill", configs).params.cell_spill == 0.0


def test_a_spill_twin_is_tried_at_the_deepest_stages_that_run():
    configs, space = _space(stages=(2, 3))
    cells, area = tile_cells(space, ("BLOCK_M", "BLOCK_N", "num_warps"), 40)
    warps, stages = space.names.index("num_warps"), space.names.index("num_stages")
    n = len(configs)
    durations = _spilled_large_tile(configs, 4.0)
    candidates = np.flatnonzero(np.isnan(durations))
    scores = np.array([-float(c.num_stages == 2) for c in configs])  # the model prefers 2 stages
    p_run = np.ones(n)

    def pick(stage_column, p_run=p_run):
        (i,) = spill_twin_picks(
            space.levels, warps, cells, area, durations, candidates, scores, p_run, 1, 0.5, 3.0, stage_column
        )
        return configs[i]

    assert pick(stages).num_stages == 3
    assert pick(None).num_stages == 2  # without the stages column: the best-scored
    deep_fails = np.array([0.1 if c.num_stages == 3 else 1.0 for c in configs])
    assert pick(stages, deep_fails).num_stages == 2  # the deepest that runs
    assert FastaPolicy(configs)._twin_stages == stages


def test_a_state_from_before_the_deepest_stage_twin_resumes_without_it():
    configs, _ = _space(stages=(2, 3))
    resumed = resumed_from_before("twin_deep", configs)
    assert resumed.params.twin_deep is False and resumed._twin_stages is None


def test_the_transposed_tile_swaps_block_m_and_block_n_only():
    configs, space = _space()
    m, n = space.names.index("kwargs.BLOCK_M"), space.names.index("kwargs.BLOCK_N")
    candidates = np.arange(len(configs))
    (swapped,) = transposed_tile(space.raw, m, n, _index(configs, 64, 128, 32, 8, 2), candidates)
    assert swapped == _index(configs, 128, 64, 32, 8, 2)
    assert transposed_tile(space.raw, m, n, _index(configs, 64, 64, 32, 8, 2), candidates).size == 0  # square


def _polish(configs, fast, **params):
    """The first polish decision once every BLOCK_M = 64 config ran in 6 µs, but `fast` (tile → µs) ran faster."""
    durations = np.full(len(configs), np.nan)
    for i, c in enumerate(configs):
        if c.kwargs["BLOCK_M"] == 64:
            durations[i] = 6.0
    for tile, us in fast.items():
        durations[_index(configs, *tile)] = us
    polish = FastaPolicy(configs, **params)._polish_round(durations, np.flatnonzero(np.isnan(durations)), {})
    assert polish is not None
    return polish


def _polish_pick(configs, fast, **params):
    return _polish(configs, fast, **params).batch


def test_polish_tries_the_best_configs_transposed_tile_first():
    configs, _ = _space()
    best = {(64, 128, 64, 8, 2): 5.0}
    transposed = _index(configs, 128, 64, 64, 8, 2)
    assert _polish_pick(configs, best) == [transposed]
    assert _polish_pick(configs, best, polish_transpose=False) != [transposed]
    assert resumed_from_before("polish_transpose", configs).params.polish_transpose is False


def test_polish_transposes_the_second_fastest_tile_when_the_best_is_square():
    configs, _ = _space()
    square_best = {(64, 64, 64, 8, 2): 4.0, (64, 128, 32, 8, 2): 5.0}
    transposed = _index(configs, 128, 64, 32, 8, 2)
    assert _polish_pick(configs, square_best) == [transposed]
    assert _polish_pick(configs, square_best, transpose_centers=1) != [transposed]


def test_a_state_from_before_the_second_centres_transpose_resumes_with_the_best_only():
    configs, _ = _space()
    assert resumed_from_before("transpose_centers", configs).params.transpose_centers == 1


def test_a_scaled_up_tile_doubles_one_side_and_the_warps_at_the_deepest_stages():
    configs, space = _space(stages=(2, 3))
    m, n = space.names.index("kwargs.BLOCK_M"), space.names.index("kwargs.BLOCK_N")
    warps, stages = space.names.index("num_warps"), space.names.index("num_stages")
    candidates = np.arange(len(configs))
    center = _index(configs, 64, 64, 32, 4, 2)
    picks = scaled_up_tiles(space.levels, center, candidates, m, n, warps, stages)
    assert sorted(picks) == sorted([_index(configs, 128, 64, 32, 8, 3), _index(configs, 64, 128, 32, 8, 3)])
    shallow = candidates[[c.num_stages == 2 for c in configs]]
    picks = scaled_up_tiles(space.levels, center, shallow, m, n, warps, stages)
    assert sorted(picks) == sorted([_index(configs, 128, 64, 32, 8, 2), _index(configs, 64, 128, 32, 8, 2)])
    at_most_warps = _index(configs, 64, 64, 32, 8, 2)
    assert scaled_up_tiles(space.levels, at_most_warps, candidates, m, n, warps, stages).size == 0


def test_polish_tries_the_best_tile_scaled_up_before_the_transposed_tiles():
    configs, _ = _space()
    square_best = {(64, 64, 64, 4, 2): 4.0, (64, 128, 32, 8, 2): 5.0}
    scaled_up = {_index(configs, 128, 64, 64, 8, 2), _index(configs, 64, 128, 64, 8, 2)}
    (pick,) = _polish_pick(configs, square_best)
    assert pick in scaled_up
    assert _polish_pick(configs, square_best, polish_scale_up=False) == [_index(configs, 128, 64, 32, 8, 2)]


def test_the_scaled_up_tile_is_tried_with_the_transposed_tiles_turned_off():
    configs, _ = _space()
    square_best = {(64, 64, 64, 4, 2): 4.0, (64, 128, 32, 8, 2): 5.0}
    scaled_up = {_index(configs, 128, 64, 64, 8, 2), _index(configs, 64, 128, 64, 8, 2)}
    (pick,) = _polish_pick(configs, square_best, polish_transpose=False)
    assert pick in scaled_up


def test_a_state_from_before_the_scaled_up_tile_resumes_without_it():
    configs, _ = _space()
    assert resumed_from_before("polish_scale_up", configs).params.polish_scale_up is False


def test_a_polish_decision_names_the_rule_that_picked_it():
    configs, _ = _space()
    best = _index(configs, 64, 64, 64, 4, 2)
    square_best = {(64, 64, 64, 4, 2): 4.0, (64, 128, 32, 8, 2): 5.0}
    assert f"config #{best}'s tile scaled up with its warps" in _polish(configs, square_best).reason
    second = _index(configs, 64, 128, 32, 8, 2)
    reason = _polish(configs, square_best, polish_scale_up=False).reason
    assert f"config #{second}'s transposed tile" in reason
    reason = _polish(configs, square_best, polish_scale_up=False, polish_transpose=False).reason
    assert "a one-level step from a fastest config" in reason


def _after_a_polish_pick(configs, pick_us, **params):
    """64 x 64 ran (the best: 64 x 64 x 64, 4 warps, 4 µs), then the polish tried 128 x 64 x 64, 8 warps, 3 stages."""
    policy = FastaPolicy(configs, **params)
    durations = np.full(len(configs), np.nan)
    for i, c in enumerate(configs):
        if c.kwargs["BLOCK_M"] == c.kwargs["BLOCK_N"] == 64:
            durations[i] = 6.0
    best = _index(configs, 64, 64, 64, 4, 2)
    durations[best] = 4.0
    first = _index(configs, 128, 64, 64, 8, 3)
    durations[first] = pick_us
    policy._history.append({"polish": first, "basis": "rbf", "rule": "config's tile scaled up with its warps"})
    return policy, durations, best, first


def test_a_scaled_up_tile_that_failed_sends_the_next_pick_to_the_other_direction():
    configs, _ = _space(stages=(2, 3))
    n = len(configs)
    scores = np.array([0.0 if c.kwargs["BLOCK_M"] == 128 and c.kwargs["BLOCK_N"] == 64 else 1.0 for c in configs])
    other_direction = _index(configs, 64, 128, 64, 8, 3)
    alone = {"scale_up_skip_failed": False}  # which would also skip the failed pick's stage twin
    for pick_us in (np.inf, 4.1):  # failed, or ran slower than the best (within near_tol: see scale_up_stop_slow)
        policy, durations, best, _ = _after_a_polish_pick(configs, pick_us, **alone)
        candidates = np.flatnonzero(np.isnan(durations))
        rule, picks = policy._polish_first(durations, candidates, np.array([best]), scores, np.zeros(n))
        assert "scaled up" in rule and picks.tolist() == [other_direction]
        policy, durations, best, _ = _after_a_polish_pick(configs, pick_us, polish_new_cells=False, **alone)
        _, picks = policy._polish_first(durations, candidates, np.array([best]), scores, np.zeros(n))
        assert set(picks.tolist()) == {_index(configs, 128, 64, 64, 8, 2), other_direction}  # its cell again


def test_a_scaled_up_tile_well_off_the_best_ends_the_scaling_up():
    configs, _ = _space(stages=(2, 3))
    n = len(configs)
    scores = np.zeros(n)
    other_direction = _index(configs, 64, 128, 64, 8, 3)
    for stop, pick_us, scales_up in ((True, 5.0, False), (True, 4.1, True), (False, 5.0, True)):
        policy, durations, best, _ = _after_a_polish_pick(configs, pick_us, scale_up_stop_slow=stop)
        candidates = np.flatnonzero(np.isnan(durations))
        rule, picks = policy._polish_first(durations, candidates, np.array([best]), scores, np.zeros(n))
        assert ("scaled up" in rule) is scales_up
        assert (other_direction in picks) is scales_up


def test_a_state_from_before_the_slow_scale_up_stop_resumes_without_it():
    configs, _ = _space()
    assert resumed_from_before("scale_up_stop_slow", configs).params.scale_up_stop_slow is False


def _polish_after_a_spill_twin(pick_us, rule=SPILL_TWIN, **params):
    """`_polish_first`'s rule and picks once the polish took 128 x 64 x 64 at 8 warps and 3 stages by `rule`."""
    configs, _ = _space(stages=(2, 3))
    n = len(configs)
    policy, durations, best, first = _after_a_polish_pick(configs, pick_us, **params)
    policy._history[-1]["rule"] = rule
    order = np.array([first, best] if pick_us < 4.0 else [best, first])
    candidates = np.flatnonzero(np.isnan(durations))
    rule, picks = policy._polish_first(durations, candidates, order, np.zeros(n), np.zeros(n))
    return configs, policy, durations, order, rule, picks


def test_a_spill_twin_near_the_best_sends_the_next_pick_to_its_steps_in_its_cell():
    for pick_us in (4.1, 3.0):  # within near_tol of the best, or the best itself
        configs, _, _, _, rule, picks = _polish_after_a_spill_twin(pick_us, polish_scale_up=False)
        assert rule == f"config #{_index(configs, 128, 64, 64, 8, 3)}'s {NEW_CELL_STEPS}"
        assert set(picks.tolist()) == {_index(configs, 128, 64, 32, 8, 3), _index(configs, 128, 64, 64, 8, 2)}


def test_a_spill_twin_past_near_tol_leaves_the_pick_to_the_transposed_tile():
    _, _, _, _, rule, _ = _polish_after_a_spill_twin(5.0, polish_scale_up=False)
    assert "transposed tile" in rule


def test_without_polish_new_cell_steps_a_near_spill_twin_leaves_the_pick_to_the_transposed_tile():
    _, _, _, _, rule, _ = _polish_after_a_spill_twin(4.1, polish_scale_up=False, polish_new_cell_steps=False)
    assert "transposed tile" in rule


def test_a_transposed_tile_near_the_best_is_not_followed_into_its_cell():
    _, _, _, _, rule, _ = _polish_after_a_spill_twin(4.1, rule="config #0's transposed tile", polish_scale_up=False)
    assert NEW_CELL_STEPS not in rule


def test_a_scaled_up_tile_still_goes_before_the_new_cell_steps():
    _, _, _, _, rule, _ = _polish_after_a_spill_twin(4.1)
    assert SCALED_UP in rule


def test_the_new_cell_steps_are_taken_once_a_tune():
    configs, policy, durations, order, rule, picks = _polish_after_a_spill_twin(4.1, polish_scale_up=False)
    step = int(picks.min())
    policy._history.append({"polish": step, "basis": "rbf", "rule": rule})
    durations[step] = 4.2
    n = len(configs)
    rule, _ = policy._polish_first(durations, np.flatnonzero(np.isnan(durations)), order, np.zeros(n), np.zeros(n))
    assert NEW_CELL_STEPS not in rule


def test_a_state_from_before_the_new_cell_steps_resumes_without_them():
    configs, _ = _space()
    assert resumed_from_before("polish_new_cell_steps", configs).params.polish_new_cell_steps is False


def test_a_polish_pick_that_became_the_best_leaves_its_cell_open():
    configs, _ = _space(stages=(2, 3))
    same_cell = _index(configs, 128, 64, 32, 8, 3)
    policy, durations, _, _ = _after_a_polish_pick(configs, 3.0)
    candidates = np.flatnonzero(np.isnan(durations))
    assert same_cell in policy._outside_polished_cells(durations, candidates)
    policy, durations, _, _ = _after_a_polish_pick(configs, 5.0)
    assert same_cell not in policy._outside_polished_cells(durations, candidates)


def test_a_state_from_before_the_fresh_polish_cells_resumes_without_them():
    configs, _ = _space()
    assert resumed_from_before("polish_new_cells", configs).params.polish_new_cells is False


def test_a_scaled_up_tile_is_not_taken_below_a_failure_at_more_stages():
    configs, _ = _space(stages=(2, 3))
    n = len(configs)
    scores = np.array([0.0 if c.kwargs["BLOCK_M"] == 128 and c.kwargs["BLOCK_N"] == 64 else 1.0 for c in configs])
    other_direction = _index(configs, 64, 128, 64, 8, 3)
    below = _index(configs, 128, 64, 64, 8, 2)
    for skip, expected in ((True, {other_direction}), (False, {below, other_direction})):
        policy, durations, best, _ = _after_a_polish_pick(configs, np.inf, scale_up_skip_failed=skip)
        policy._history.clear()  # the failure came from a guided round, not the polish
        candidates = np.flatnonzero(np.isnan(durations))
        rule, picks = policy._polish_first(durations, candidates, np.array([best]), scores, np.zeros(n))
        assert "scaled up" in rule and set(picks.tolist()) == expected


def test_a_state_from_before_the_failure_check_resumes_without_it():
    configs, _ = _space()
    assert resumed_from_before("scale_up_skip_failed", configs).params.scale_up_skip_failed is False
