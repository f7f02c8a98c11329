"""R1 with configs that earlier tunes of the kernel found fast (`use_prior`)."""

from __future__ import annotations

import landscapes
import numpy as np
import pytest

from fasta_sm.config import Config
from fasta_sm.errors import PolicyError
from fasta_sm.policies import make_policy
from fasta_sm.policies.fasta import FastaPolicy

MATMUL = landscapes.as_table(landscapes.matmul(3, size=500))


def _plan(policy, seed=0):
    return policy.plan(np.random.default_rng(seed))


def test_r1_holds_the_prior_and_keeps_its_size():
    alone, offered = FastaPolicy(MATMUL.configs), FastaPolicy(MATMUL.configs)
    offered.use_prior([7, 3, 11])
    batch = _plan(offered).batch
    assert {3, 7, 11} <= set(batch) and len(batch) == len(_plan(alone).batch) == offered.plan_budget.r1


def test_r1_takes_at_most_a_third_of_its_size_from_the_prior_the_first_offered_first():
    policy = FastaPolicy(MATMUL.configs)
    many = list(range(100, 100 + policy.plan_budget.r1))
    policy.use_prior(many)
    taken = sorted(set(_plan(policy).batch) & set(many))
    assert taken == many[: policy.plan_budget.r1 // 3]


def test_a_prior_config_the_optimizer_pruned_is_not_measured():
    policy = FastaPolicy(MATMUL.configs, optimize_configs=True)
    pruned = int(np.flatnonzero(~policy._active)[0])
    policy.use_prior([pruned])
    assert pruned not in _plan(policy).batch


def test_the_coverage_path_takes_the_prior_too():
    policy = FastaPolicy(MATMUL.configs, small_n=0, base_budget=0.01, min_budget=2, min_viable_np=50)
    assert policy.plan_budget.path == "coverage"
    policy.use_prior([5])
    assert 5 in _plan(policy).batch


@pytest.mark.parametrize("bad", [-1, 10**6, 2.0, True])
def test_a_prior_that_is_not_an_index_of_the_list_is_refused_naming_it(bad):
    with pytest.raises(PolicyError, match=f"prior config {bad!r} is not an index"):
        FastaPolicy(MATMUL.configs).use_prior([bad])


def test_the_integrations_wrapper_hands_the_prior_to_its_inner_policy():
    wrapped = make_policy("must-measure", MATMUL.configs, {"inner": "fasta", "must": [0]})
    wrapped.use_prior([9])
    assert {0, 9} <= set(_plan(wrapped).batch)


@pytest.mark.parametrize("seed", range(10))
def test_the_sample_beside_the_prior_spends_nothing_on_the_widest_columns_value_the_prior_holds(seed):
    configs = [Config(kwargs={"BLOCK_N": 2**k, "ROWS": r}, num_warps=w)
               for k in range(4, 14) for r in (1, 2, 4) for w in (4, 8)]
    policy = FastaPolicy(configs)
    widest = policy._space.levels[:, 0]  # BLOCK_N: ten values, more than R1 samples besides the prior
    prior = [int(i) for i in np.flatnonzero(widest == widest.max())[:3]]
    policy.use_prior(prior)
    sampled = sorted(set(_plan(policy, seed).batch) - set(prior))
    assert sampled and widest.max() not in set(widest[sampled].tolist())
