"""The config optimizer prunes generated configs; expert ones always survive."""

from __future__ import annotations

import landscapes
import numpy as np
import pytest
from driving import drive
from hypothesis import given, settings
from hypothesis import strategies as st

from fasta_sm.config import Config
from fasta_sm.errors import PolicyError
from fasta_sm.policies.config_optimizer import circle_num, optimize_configs, tile_numel
from fasta_sm.policies.fasta import FastaPolicy


def npu(block: int, sub: int, axis: str = "X0", **extra) -> Config:
    return Config(kwargs={f"{axis}BLOCK": block, f"{axis}BLOCK_SUB": sub, **extra})


def test_empty_list_gives_empty_list():
    assert optimize_configs([]) == []


def test_circle_number_is_the_loop_count_over_sub_blocks():
    assert circle_num(npu(256, 64)) == 4
    assert circle_num(npu(250, 64)) == 4
    assert circle_num(Config(kwargs={"X0BLOCK": 64, "X0BLOCK_SUB": 16, "Y0BLOCK": 32, "Y0BLOCK_SUB": 16})) == 8


def test_gpu_tiles_loop_once_and_count_the_whole_block():
    config = Config(kwargs={"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 16})
    assert circle_num(config) == 1 and tile_numel(config) == 64 * 32 * 16


def test_an_axis_without_a_sub_block_counts_its_whole_block_in_the_tile():
    config = Config(kwargs={"XBLOCK": 64, "XBLOCK_SUB": 8, "R0_BLOCK": 1024})
    assert tile_numel(config) == 8 * 1024


def test_a_kwarg_that_merely_contains_block_is_not_a_tile_axis():
    assert tile_numel(Config(kwargs={"BLOCK_M": 16, "NUM_BLOCKS": 4, "USE_BLOCK_PTR": 2})) == 16


def test_configs_that_differ_in_an_axis_without_a_sub_block_are_not_duplicates():
    configs = [Config(kwargs={"XBLOCK": 64, "XBLOCK_SUB": 64, "R0_BLOCK": r}) for r in (256, 1024)]
    assert optimize_configs(configs) == configs


def test_configs_that_differ_only_in_a_launch_option_are_not_duplicates():
    configs = [Config(kwargs={"BLOCK_M": 64, "BLOCK_N": 64}, options=options) for options in ({}, {"maxnreg": 128})]
    assert optimize_configs(configs) == configs


def test_configs_that_differ_in_a_non_numeric_kwarg_named_like_a_block_are_not_duplicates():
    configs = [Config(kwargs={"BLOCK_M": 64, "BLOCK_N": 64, "USE_BLOCK_PTR": flag}) for flag in (True, False)]
    assert optimize_configs(configs) == configs


def test_a_config_whose_kwargs_name_no_tile_is_not_dropped_as_a_small_tile():
    tileless, tiled = Config(kwargs={"GROUP_M": 8}), Config(kwargs={"BLOCK_M": 64})
    assert optimize_configs([tileless, tiled]) == [tileless, tiled]


def test_a_kernel_whose_kwargs_name_no_tile_is_not_cut_down_to_its_expert_configs():
    configs = [Config(kwargs={"TILE_M": m}, num_warps=w) for m in (32, 64) for w in (4, 8)]
    assert optimize_configs(configs, expert=configs[:1]) == configs


def test_configs_looping_too_often_are_dropped():
    kept = optimize_configs([npu(256, 64), npu(256, 32)])
    assert kept == [npu(256, 64)]


def test_tiles_below_the_minimum_size_are_dropped():
    kept = optimize_configs([npu(64, 64), npu(64, 24)])
    assert kept == [npu(64, 64)]


def test_expert_configs_survive_every_filter():
    expert = npu(256, 8)
    kept = optimize_configs([expert, npu(128, 64)], expert=[expert])
    assert expert in kept and len(kept) == 2


def test_same_loop_count_and_tile_shape_keeps_the_first():
    first, twin = npu(128, 64, other=1), npu(120, 64, other=1)
    assert optimize_configs([first, twin]) == [first]


def test_different_warps_are_not_duplicates():
    a = Config(kwargs={"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4)
    b = Config(kwargs={"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=8)
    assert optimize_configs([a, b]) == [a, b]


def test_cap_keeps_small_and_large_tiles():
    configs = [npu(sub, sub) for sub in range(32, 1032, 10)]
    kept = optimize_configs(configs, max_configs=20)
    sizes = sorted(tile_numel(c) for c in kept)
    assert len(kept) == 20 and sizes[0] == 32 and sizes[-1] == 1022


def test_a_negative_cap_is_an_error_naming_it():
    with pytest.raises(ValueError, match="max_configs=-1"):
        optimize_configs([npu(64, 64)], max_configs=-1)


@pytest.mark.parametrize("cap", [True, 2.0, "2"])
def test_a_cap_that_is_no_whole_number_is_an_error_naming_it(cap):
    with pytest.raises(ValueError, match=f"max_configs={cap!r}"):
        optimize_configs([npu(64, 64)], max_configs=cap)


def test_a_numpy_integer_cap_is_taken_as_the_number_it_holds():
    configs = [Config(kwargs={"BLOCK_M": block}) for block in (32, 64, 128)]
    assert optimize_configs(configs, max_configs=np.int64(2)) == optimize_configs(configs, max_configs=2)


def test_configs_that_differ_in_another_kwarg_are_not_duplicates():
    configs = [Config(kwargs={"BLOCK_M": 64, "BLOCK_N": 64, "GROUP_M": group}) for group in (1, 8)]
    assert optimize_configs(configs) == configs


def test_cap_spreads_over_tile_size_whatever_the_order_of_the_list():
    configs = [npu(sub, sub) for sub in range(32, 1032, 10)]
    rotated = configs[50:] + configs[:50]  # neither end of the list is an end of the tile sizes
    assert set(optimize_configs(rotated, max_configs=20)) == set(optimize_configs(configs, max_configs=20))


def test_expert_configs_count_against_neither_the_cap_nor_the_duplicates():
    configs = [npu(sub, sub) for sub in range(32, 1032, 10)]
    expert = configs[5]  # one the even spread would pick anyway
    kept = optimize_configs(configs, expert=[expert], max_configs=20)
    assert expert in kept and len(kept) == 21
    twin = npu(128, 64)  # the expert's twin: same loop count and tile
    assert optimize_configs([npu(120, 64), twin], expert=[npu(120, 64)]) == [npu(120, 64), twin]


def test_everything_pruned_returns_the_list_unchanged():
    configs = [npu(256, 8, other=i) for i in range(5)]
    assert optimize_configs(configs) == configs


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([16, 32, 64, 128, 256]), st.sampled_from([8, 16, 32, 64, 128]),
                          st.integers(1, 4)), min_size=1, max_size=60, unique=True))
def test_result_is_a_nonempty_ordered_subset_within_the_cap(points):
    configs = [npu(b, s, other=o) for b, s, o in points]
    kept = optimize_configs(configs, max_configs=10)
    positions = [configs.index(c) for c in kept]
    assert kept and positions == sorted(positions)
    assert len(kept) <= 10 or kept == configs


def test_policy_flag_keeps_proposals_inside_the_pruned_list():
    table = landscapes.as_table(landscapes.matmul(2, size=300))
    kept = {c.identity for c in optimize_configs(table.configs)}
    trace = drive(FastaPolicy(table.configs, optimize_configs=True), table, seed=0)
    proposed = {table.configs[i].identity for d in trace.decisions for i in d.batch}
    assert proposed and proposed <= kept and len(kept) < len(table.configs)


def test_optimizer_is_off_by_default():
    table = landscapes.as_table(landscapes.matmul(2, size=300))
    assert np.all(FastaPolicy(table.configs)._active)


def test_expert_configs_named_to_the_policy_stay_in_its_space():
    table = landscapes.as_table(landscapes.matmul(2, size=300))
    pruned = {c.identity for c in optimize_configs(table.configs)}
    expert = [i for i, c in enumerate(table.configs) if c.identity not in pruned][:2]
    policy = FastaPolicy(table.configs, optimize_configs=True, expert_configs=expert)
    assert expert and policy._active[expert].all()
    assert policy._active.sum() == len(pruned) + len(expert)


def test_an_expert_index_outside_the_config_list_is_an_error_naming_it():
    table = landscapes.as_table(landscapes.matmul(2, size=300))
    with pytest.raises(PolicyError, match="expert_configs index 300"):
        FastaPolicy(table.configs, optimize_configs=True, expert_configs=[300])


def test_when_every_kept_config_fails_the_pruned_ones_are_tried_before_giving_up():
    from fasta_sm.backends.replay import table_from_dict

    rows = []
    for block, warps, stages in ((m, w, s) for m in (16, 64, 128) for w in (4, 8) for s in (2, 3, 4)):
        row = {"kwargs": {"BLOCK_M": block}, "num_warps": warps, "num_stages": stages, "compile_s": 0.5}
        if block == 16:  # pruned as a tile below the minimum size, and the only one that runs
            row.update(duration_us=[10.0, 10.0], error=None)
        else:
            row.update(duration_us=[], error="OutOfResources: shared memory")
        rows.append(row)
    table = table_from_dict({"kernel": "k", **landscapes.SYNTHETIC, "configs": rows}, "synthetic")
    assert all(c.kwargs["BLOCK_M"] > 16 for c in optimize_configs(table.configs))
    trace = drive(FastaPolicy(table.configs, optimize_configs=True), table, seed=0)
    assert table.configs[trace.pick()].kwargs["BLOCK_M"] == 16


def kept_fail_pruned_run_table():
    """Every config the optimizer keeps fails; the small tiles it prunes run."""
    from fasta_sm.backends.replay import table_from_dict

    rows = []
    grid = ((m, w, s) for m in (4, 8, 16, 64, 128, 256) for w in (1, 2, 4, 8) for s in (1, 2, 3, 4))
    for block, warps, stages in grid:
        row = {"kwargs": {"BLOCK_M": block}, "num_warps": warps, "num_stages": stages, "compile_s": 0.5}
        if block <= 16:  # pruned as too small; they run, fastest at 16 x 4 warps x 3 stages
            mean = 100.0 + 10 * abs(block.bit_length() - 5) + 5 * abs(warps.bit_length() - 3) + 3 * abs(stages - 3)
            row.update(duration_us=[mean, mean], error=None)
        else:
            row.update(duration_us=[], error="OutOfResources: shared memory")
        rows.append(row)
    return table_from_dict({"kernel": "k", **landscapes.SYNTHETIC, "configs": rows}, "synthetic")


def test_once_only_pruned_configs_have_run_the_tune_goes_on_over_every_config():
    table = kept_fail_pruned_run_table()
    trace = drive(FastaPolicy(table.configs, optimize_configs=True), table, seed=0)
    ran = np.isfinite(trace.durations)
    assert ran.sum() >= 10 and trace.decisions[-1].reason != "fasta: every config measured"
    assert table.mean_us[trace.pick()] <= 1.02 * table.true_best_us


def test_a_tune_widened_past_the_kept_configs_resumes_as_it_would_have_gone_on(tmp_path):
    from fasta_sm.backends.replay import ReplayBackend
    from fasta_sm.store import StateStore
    from fasta_sm.tuner import tune

    table = kept_fail_pruned_run_table()
    settings = {"policy": "fasta", "policy_params": {"optimize_configs": True}, "seed": 3}

    def run(store, on_step=None):
        return tune("k", "k", table.configs, ReplayBackend(table, noise=True, seed=3), store=store, on_step=on_step,
                    **settings)

    whole = run(StateStore(tmp_path / "whole")).state

    def stop_in_a_later_round(state):
        if state.phase == "R2" and state.round == 4 and state.step == "benchmark":
            raise KeyboardInterrupt

    store = StateStore(tmp_path / "resumed")
    with pytest.raises(KeyboardInterrupt):
        run(store, stop_in_a_later_round)
    resumed = run(store).state
    assert not resumed.restarts, resumed.restarts  # resumed, not set aside and started again with results carried
    assert [r.batch for r in resumed.rounds] == [r.batch for r in whole.rounds]
    assert resumed.best == whole.best
    assert resumed.policy_state == whole.policy_state


def test_a_tune_widened_in_r1_resumes_with_the_budget_its_peaked_r1_routed(tmp_path):
    """R1 holds two pruned configs (a must-measure wrapper's) that run, every kept one fails: the first refine
    widens the tune to every config and `peak_share` raises its budget. A resume must keep that budget, not
    route the whole list again as it widens a second time."""
    from fasta_sm.backends.replay import ReplayBackend, table_from_dict
    from fasta_sm.store import StateStore
    from fasta_sm.tuner import tune

    grid = [(m, n, w, s) for m in (4, 8, 16, 64, 128, 256) for n in (4, 8, 16, 64, 128) for w in (1, 2, 4, 8)
            for s in (2, 3)]
    configs = [Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in grid]
    kept = {c.identity for c in optimize_configs(configs)}
    rows = []
    for (m, n, w, s), config in zip(grid, configs):
        row = {"kwargs": {"BLOCK_M": m, "BLOCK_N": n}, "num_warps": w, "num_stages": s, "compile_s": 0.5}
        if config.identity in kept:
            row.update(duration_us=[], error="OutOfResources: shared memory")
        else:
            mean = 100.0 + 10 * abs(m.bit_length() - 5) + 7 * abs(n.bit_length() - 4) + 5 * abs(w.bit_length() - 3)
            row.update(duration_us=[mean, mean], error=None)
        rows.append(row)
    table = table_from_dict({"kernel": "k", **landscapes.SYNTHETIC, "configs": rows}, "synthetic")
    pruned = sorted((table.mean_us[i], i) for i in range(len(configs)) if configs[i].identity not in kept)
    must = [pruned[0][1], pruned[-1][1]]  # R1's runs: one near its best, one far from it
    settings = {"policy": "must-measure", "seed": 0, "policy_params": {
        "inner": "fasta", "must": must, "params": {"optimize_configs": True, "peak_share": 0.9}}}

    def run(store, on_step=None):
        return tune("k", "k", table.configs, ReplayBackend(table, noise=True, seed=0), store=store, on_step=on_step,
                    **settings)

    whole = run(StateStore(tmp_path / "whole")).state
    assert "peaked R1" in whole.policy_state["plan"]["budget_class"]

    def stop_after_r1(state):
        if state.phase == "R2" and state.step == "compile":
            raise KeyboardInterrupt

    store = StateStore(tmp_path / "resumed")
    with pytest.raises(KeyboardInterrupt):
        run(store, stop_after_r1)
    resumed = run(store).state
    assert not resumed.restarts, resumed.restarts
    assert resumed.policy_state["plan"] == whole.policy_state["plan"]
    assert [r.batch for r in resumed.rounds] == [r.batch for r in whole.rounds]
    assert resumed.durations == whole.durations and resumed.best == whole.best
