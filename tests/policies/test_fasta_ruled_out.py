"""What the fasta policy says of the untried configs it puts out of reach (`ruled_out`, for `show --config`)."""

from __future__ import annotations

import numpy as np
import pytest

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.data import tables_dir
from fasta_sm.machine import Tune
from fasta_sm.policies import make_policy
from fasta_sm.policies.fasta import FastaPolicy
from fasta_sm.protocols import Observations, RuledOut

GELU = load_table(tables_dir() / "mm_bf16_gelu_4096.json")


def finished(table, seed: int, params: dict | None = None):
    n = len(table.configs)
    tune = Tune.start(key=f"ruled/{table.kernel}/{seed}", kernel=table.kernel, configs=table.configs,
                      backend=ReplayBackend(table, noise=True, seed=seed),
                      policy=FastaPolicy(table.configs, **(params or {})), policy_params=params or {}, seed=seed,
                      chunk_size=n, benchmark_chunk=n)
    try:
        return tune.drive()
    finally:
        tune.close()


@pytest.mark.parametrize("name", ["mm_bf16_gelu_4096", "mm_fp16_4096", "attention_fwd_bf16_d128"])
@pytest.mark.parametrize("seed", range(2))
def test_every_untried_config_given_no_chance_to_run_has_a_reason_and_no_other(name, seed):
    table = load_table(tables_dir() / f"{name}.json")
    state = finished(table, seed)
    policy = FastaPolicy(table.configs)
    policy.load_state_dict(state.policy_state)
    observed = state.observed()
    no_chance = np.flatnonzero(policy._failure_chance(observed.duration_us, observed.failures) == 1.0)
    untried = set(np.flatnonzero(np.isnan(observed.duration_us)).tolist())
    reasons = policy.ruled_out(observed)
    assert reasons, "no config was ruled out: the test checks nothing"
    assert set(reasons) == untried & set(no_chance.tolist())


def far_spill() -> tuple[Observations, int]:
    """GELU with its best (128x256, 8 warps) at 100 µs and its 4-warp twin, the far spill, 7x slower."""
    best = next(i for i, c in enumerate(GELU.configs) if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps)
                == (128, 256, 8) and GELU.errors[i] is None)
    spill = next(i for i, c in enumerate(GELU.configs) if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps)
                 == (128, 256, 4) and GELU.errors[i] is None)
    durations = np.full(len(GELU.configs), np.nan)
    durations[best], durations[spill] = 100.0, 700.0
    observed = Observations(durations, np.where(np.isnan(durations), 0, 1), np.full(durations.size, np.nan), 1.0)
    return observed, spill


def test_a_far_spill_is_named_with_how_much_slower_it_ran():
    observed, spill = far_spill()
    reasons = FastaPolicy(GELU.configs, spill_dominance=False).ruled_out(observed)
    assert reasons, "the far spill ruled out nothing: the test checks nothing"
    assert set(reasons.values()) == {(RuledOut(
        "load", spill, f"has at least the tile area and the tile per warp of #{spill}, which ran 7.0x slower than "
        "the best (a far spill: spill_load 5)"
    ),)}


def test_a_config_two_rules_rule_out_names_both_in_the_order_of_the_rules():
    observed, _ = far_spill()
    reasons = FastaPolicy(GELU.configs).ruled_out(observed)
    assert {tuple(why.rule for why in whys) for whys in reasons.values()} == {("spill", "load"), ("load",)}


def test_each_rule_named_rules_the_config_out_with_the_other_off():
    observed, _ = far_spill()
    both = FastaPolicy(GELU.configs).ruled_out(observed)
    spill_only = FastaPolicy(GELU.configs, spill_load=0.0).ruled_out(observed)
    load_only = FastaPolicy(GELU.configs, spill_dominance=False).ruled_out(observed)
    assert any(len(whys) == 2 for whys in both.values()), "no config had two rules: the test checks nothing"
    for index, whys in both.items():
        assert whys == spill_only.get(index, ()) + load_only.get(index, ())


def test_a_config_the_config_optimizer_left_out_names_no_rule_after_it():
    observed, _ = far_spill()
    policy = FastaPolicy(GELU.configs, optimize_configs=True)
    reasons = policy.ruled_out(observed)
    untried = np.isnan(observed.duration_us)
    ruled = np.any([culprits >= 0 for _, culprits in policy._rule_culprits(observed.duration_us, {})], axis=0)
    left_out_and_ruled = np.flatnonzero(untried & ~policy._active & ruled)
    assert left_out_and_ruled.size, "no config left out was ruled out too: the test checks nothing"
    assert {reasons[int(i)] for i in left_out_and_ruled} == {
        (RuledOut("config optimizer", None, "left out by the config optimizer"),)
    }


def test_configs_the_config_optimizer_left_out_are_said_to_be():
    policy = FastaPolicy(GELU.configs, optimize_configs=True)
    durations = np.full(len(GELU.configs), np.nan)
    observed = Observations(durations, np.zeros(durations.size, dtype=int), np.full(durations.size, np.nan), 0.0)
    reasons = policy.ruled_out(observed)
    left_out = set(np.flatnonzero(~policy._active).tolist())
    assert left_out, "the optimizer kept every config: the test checks nothing"
    assert {i for i, whys in reasons.items() if whys[0].words == "left out by the config optimizer"} == left_out


def test_without_the_failure_model_nothing_is_ruled_out_by_a_rule():
    state = finished(GELU, 0, {"failure_weight": 0.0})
    policy = FastaPolicy(GELU.configs, failure_weight=0.0)
    policy.load_state_dict(state.policy_state)
    assert state.failed, "nothing failed: the test checks nothing"
    assert policy.ruled_out(state.observed()) == {}


def test_the_integrations_wrapper_says_what_its_inner_policy_says():
    state = finished(GELU, 1)
    inner = FastaPolicy(GELU.configs)
    inner.load_state_dict(state.policy_state)
    wrapped = make_policy("must-measure", GELU.configs, {"inner": "fasta", "must": [0, 1]})
    wrapped.load_state_dict(state.policy_state)
    assert wrapped.ruled_out(state.observed()) == inner.ruled_out(state.observed())
    assert inner.ruled_out(state.observed())
