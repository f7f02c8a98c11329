"""The tile generator keeps every bound it documents, for any size hints."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fasta_sm.config import Config
from fasta_sm.inductor.space import (
    AXIS_OF_BLOCK,
    MAX_BLOCK,
    DeviceLimits,
    generate_space,
    is_legal,
    next_pow2,
    tile_numel,
)

sizes = st.sampled_from([1, 2, 3, 7, 16, 100, 128, 1000, 4096, 5000, 65536, 1 << 20, 1 << 24])


@st.composite
def kernels(draw):
    kind = draw(st.sampled_from(["pointwise", "reduction", "persistent_reduction"]))
    if kind == "pointwise":
        axes = draw(st.sampled_from([("x",), ("x", "y"), ("x", "y", "z")]))
    else:
        axes = ("x", "r0_")
    hints = {axis: draw(sizes) for axis in axes}
    if kind == "persistent_reduction":
        hints["r0_"] = min(hints["r0_"], 4096)
    blocks = [b for b, a in AXIS_OF_BLOCK.items() if a in axes and not (kind == "persistent_reduction" and a == "r0_")]
    default = Config(kwargs={b: min(next_pow2(hints[AXIS_OF_BLOCK[b]]), 64) for b in blocks}, num_warps=4, num_stages=1)
    limits = draw(st.sampled_from([DeviceLimits(32, 1024), DeviceLimits(64, 1024), DeviceLimits(32, 512)]))
    return kind, hints, default, limits, draw(st.integers(1, 200))


TILE_CAP = {"pointwise": 4096, "reduction": 8192, "persistent_reduction": 8192}
"""The documented caps, written out here rather than read from the module under test."""


@settings(max_examples=150, deadline=None)
@given(kernels())
def test_generated_configs_are_legal(case):
    kind, hints, default, limits, cap = case
    space = generate_space(kind, hints, [default], limits=limits, max_configs=cap)
    assert space[0] == default, "Inductor's own config comes first, unchanged"
    assert len(space) <= max(cap, 1)
    assert len({c.identity for c in space}) == len(space)
    for config in space[1:]:
        assert set(config.kwargs) == set(default.kwargs), "no kwarg the kernel lacks is ever added"
        assert is_legal(kind, config, hints, limits, {}, max(8192, tile_numel(kind, default.kwargs, hints)))
        numel = tile_numel(kind, config.kwargs, hints)
        assert numel <= max(TILE_CAP[kind], tile_numel(kind, default.kwargs, hints)), "docs/inductor.md's cap"
        whole = 1
        for block in config.kwargs:
            whole *= min(next_pow2(hints[AXIS_OF_BLOCK[block]]), MAX_BLOCK[block])
        assert numel >= min(128, whole), "no tile below 128 elements unless the whole kernel is smaller"
        for block, value in config.kwargs.items():
            size = hints[AXIS_OF_BLOCK[block]]
            assert value & (value - 1) == 0 and value <= MAX_BLOCK[block]
            assert value <= next_pow2(size)
            if size == 1:
                assert value == 1
            if kind == "persistent_reduction" and block.startswith("R"):
                assert value >= size
        assert config.num_warps * limits.warp_size <= limits.max_threads_per_block
        if kind != "reduction":
            assert config.num_stages == 1


def test_space_is_deterministic_and_capped():
    default = Config(kwargs={"XBLOCK": 8, "R0_BLOCK": 512}, num_warps=4, num_stages=1)
    first = generate_space("reduction", {"x": 8192, "r0_": 8192}, [default], max_configs=40)
    again = generate_space("reduction", {"x": 8192, "r0_": 8192}, [default], max_configs=40)
    assert first == again and len(first) == 40
    full = generate_space("reduction", {"x": 8192, "r0_": 8192}, [default], max_configs=10_000)
    assert len(full) > 100, "the uncapped space is worth tuning"


def test_floors_and_grid_limits():
    default = Config(kwargs={"XBLOCK": 64, "YBLOCK": 64}, num_warps=4, num_stages=1)
    space = generate_space("pointwise", {"x": 64, "y": 1 << 24}, [default], max_configs=10_000)
    assert all(c.kwargs["YBLOCK"] >= 256 for c in space[1:]), "grid y stays within 65,535"
    red = Config(kwargs={"XBLOCK": 16, "R0_BLOCK": 64}, num_warps=4, num_stages=1)
    floored = generate_space("reduction", {"x": 4096, "r0_": 4096}, [red], floors={"R0_BLOCK": 32}, max_configs=10_000)
    assert all(c.kwargs["R0_BLOCK"] >= 32 for c in floored[1:])


def test_defaults_the_generator_does_not_understand_are_kept_alone():
    a = Config(kwargs={"XBLOCK": 64, "RSPLIT_SIZE": 8}, num_warps=4, num_stages=1)
    b = Config(kwargs={"XBLOCK": 32, "RSPLIT_SIZE": 16}, num_warps=4, num_stages=1)
    assert generate_space("reduction", {"x": 4096, "r0_": 64}, [a, b]) == [a, b]


class SyntheticBackend:
    """Times a config from a smooth landscape over its log2 blocks and warps.

    Tiles larger than 4096 elements fail to compile, except up to the size of
    Inductor's own config, which Inductor compiled (the generator may go that large).
    """

    def __init__(self, default):
        self.limit = max(4096, tile_numel("reduction", default.kwargs, {}))

    def describe(self):
        return "synthetic"

    def compile(self, configs):
        from fasta_sm.protocols import CompileOutcome

        return [CompileOutcome(error="OutOfResources" if tile_numel("reduction", c.kwargs, {}) > self.limit else None,
                               seconds=0.01) for c in configs]

    def benchmark(self, configs, repeat=None):
        import math

        from fasta_sm.protocols import BenchmarkOutcome

        def cost(c):
            logs = [math.log2(v) for v in c.kwargs.values()]
            return 10 + sum((x - 5) ** 2 for x in logs) + (math.log2(c.num_warps) - 2) ** 2 + c.num_stages

        return BenchmarkOutcome(durations_us=[cost(c) for c in configs], seconds=0.01)


@settings(max_examples=25, deadline=None)
@given(kernels())
def test_a_tune_over_any_generated_space_reaches_done_with_inductors_configs_measured(tmp_path_factory, case):
    from fasta_sm.driver import DriverSettings, TunePlan, parent_phase, worker_phase

    kind, hints, default, limits, cap = case
    space = generate_space(kind, hints, [default], limits=limits, max_configs=max(cap, 2))
    if len(space) < 2:
        return
    plan = TunePlan(key="space", kernel="k", configs=space, must=[0],
                    settings=DriverSettings(state_dir=str(tmp_path_factory.mktemp("states"))))
    worker_phase(plan, SyntheticBackend(default))
    state = parent_phase(plan, SyntheticBackend(default))
    assert state.done and 0 in state.rounds[0].batch
    assert 0 in state.durations or 0 in state.failed
    if 0 in state.durations:
        assert state.best_us <= state.mean_us(0)


def test_a_worker_resuming_a_tune_killed_after_a_round_was_timed_refines_and_compiles_the_next_round(tmp_path):
    from fasta_sm.backends.replay import ReplayBackend, load_table
    from fasta_sm.data import table_path
    from fasta_sm.driver import DriverSettings, TunePlan, wanted_after_worker, worker_phase
    from fasta_sm.tuner import open_tune

    table = load_table(table_path("softmax_fp32"))
    plan = TunePlan(key="softmax", kernel="softmax_fp32", configs=table.configs, must=[0],
                    settings=DriverSettings(state_dir=str(tmp_path)))
    worker_phase(plan, ReplayBackend(table))
    store, (policy, params) = plan.store(), plan.policy_args()
    with store.lock(plan.key, plan.kernel):  # the parent times R1 and is killed before it refines
        parent = open_tune(store, plan.key, plan.kernel, plan.configs, ReplayBackend(table), policy=policy,
                           policy_params=params)
        parent.drive(until=lambda s: s.step == "refine")
        parent.close()
    state = worker_phase(plan, ReplayBackend(table))
    assert (state.phase, state.round, state.step) == ("R2", 1, "benchmark")
    assert wanted_after_worker(state) and not set(wanted_after_worker(state)) & set(state.rounds[0].batch)
