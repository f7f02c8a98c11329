"""Budget routing after R1: a peaked sample moves a space one budget class up (`peak_share`)."""

from __future__ import annotations

import numpy as np
import pytest

from fasta_sm.config import Config
from fasta_sm.errors import PolicyError
from fasta_sm.policies.fasta import FastaPolicy
from fasta_sm.protocols import Observations

SPACE = [Config({"BLOCK_M": m, "BLOCK_N": n}) for m in range(1, 21) for n in range(1, 21)]  # N = 400, D = 2: large


def _after_r1(policy: FastaPolicy, near_best: float) -> FastaPolicy:
    """R1 timed: one config at 100 µs, the rest at 100 × `near_best`."""
    batch = policy.plan(np.random.default_rng(0)).batch
    durations = np.full(len(SPACE), np.nan)
    durations[batch] = 100.0 * near_best
    durations[batch[0]] = 100.0
    samples = np.where(np.isnan(durations), 0, 1)
    policy.refine(Observations(durations, samples, np.where(samples, 1.0, np.nan), 10.0), np.random.default_rng(1))
    return policy


def test_a_peaked_r1_moves_a_large_space_to_the_base_budget():
    policy = _after_r1(FastaPolicy(SPACE, peak_share=0.15), near_best=2.0)
    assert policy.plan_budget.budget_class == "base (peaked R1)"
    assert policy.plan_budget.total == 48  # 12 % of 400


def test_a_broad_r1_keeps_its_budget_class():
    policy = _after_r1(FastaPolicy(SPACE, peak_share=0.15), near_best=1.01)
    assert policy.plan_budget.budget_class == "large" and policy.plan_budget.total == 20


def test_an_explicit_budget_is_never_routed_again():
    policy = _after_r1(FastaPolicy(SPACE, budget=0.05, peak_share=0.15), near_best=2.0)
    assert policy.plan_budget.budget_class == "fixed" and policy.plan_budget.total == 20


def test_a_policy_resumed_after_a_peaked_r1_keeps_the_raised_budget():
    state = _after_r1(FastaPolicy(SPACE, peak_share=0.15), near_best=2.0).state_dict()
    resumed = FastaPolicy(SPACE, peak_share=0.15)
    resumed.load_state_dict(state)
    assert (resumed.plan_budget.budget_class, resumed.plan_budget.total) == ("base (peaked R1)", 48)


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_peak_share_outside_0_1_is_refused_naming_it(share):
    with pytest.raises(PolicyError, match="peak_share"):
        FastaPolicy(SPACE, peak_share=share)


def test_a_state_from_before_the_routing_resumes_with_the_plan_its_class_gives():
    state = _after_r1(FastaPolicy(SPACE), near_best=2.0).state_dict()
    del state["plan"]
    resumed = FastaPolicy(SPACE)
    resumed.load_state_dict(state)
    assert (resumed.plan_budget.budget_class, resumed.plan_budget.total) == ("large", 20)
