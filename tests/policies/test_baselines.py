"""Bench baselines (coordinate descent, extra trees) and the bench's report shape."""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import os
import re
from pathlib import Path

import landscapes
import numpy as np
import pytest
from driving import drive

from fasta_sm.bench import bench, leader_margins, load_tables, needle_labels, percentile, run_policy
from fasta_sm.errors import ConfigError, FastaError, MissingDependency, PolicyError, TableError
from fasta_sm.policies import coordinate, make_policy, trees, with_environment  # noqa: F401  (registers coordesc and trees)
from fasta_sm.policies.coordinate import CoordinateDescent
from fasta_sm.protocols import Observations

pytest.importorskip("sklearn")

BOWL = landscapes.as_table(landscapes.bowl(5))
MATMUL = landscapes.as_table(landscapes.matmul(5, size=300))


@pytest.mark.parametrize("name", ["coordesc", "trees", "random"])
@pytest.mark.parametrize("budget", [0.05, 0.2])
def test_baseline_keeps_its_budget_and_never_repeats(name, budget):
    trace = drive(make_policy(name, MATMUL.configs, {"budget": budget}), MATMUL, seed=1)
    proposed = [i for d in trace.decisions for i in d.batch]
    assert len(proposed) == len(set(proposed)) <= int(np.ceil(budget * len(MATMUL.configs)))


@pytest.mark.parametrize("name", ["coordesc", "trees", "random"])
def test_a_baseline_whose_budget_buys_one_config_says_so_in_the_singular(name):
    trace = drive(make_policy(name, BOWL.configs, {"budget": 1 / len(BOWL.configs)}), BOWL, seed=1)
    assert trace.decisions[-1].reason == f"{name}: budget of 1 config spent"


def test_coordesc_starts_from_the_most_central_config():
    policy = CoordinateDescent(BOWL.configs)
    start = policy.plan(np.random.default_rng(0)).batch
    levels = policy._levels[start[0]]
    assert np.all(np.abs(levels - policy._levels.max(axis=0) / 2) <= 0.5)


def test_coordesc_proposes_only_one_field_neighbours_of_the_best():
    policy = CoordinateDescent(BOWL.configs, budget=0.5)
    rng = np.random.default_rng(0)
    trace = drive(policy, BOWL, seed=0, rng=rng)
    first, second = trace.decisions[0].batch[0], trace.decisions[1].batch
    assert all(np.sum(policy._levels[i] != policy._levels[first]) == 1 for i in second)


def test_coordesc_descends_a_smooth_bowl_to_its_floor():
    trace = drive(make_policy("coordesc", BOWL.configs, {"budget": 0.3}), BOWL, seed=0)
    assert BOWL.mean_us[trace.pick()] <= BOWL.true_best_us * 1.05


def test_coordesc_whose_default_config_fails_steps_on_from_it():
    policy = CoordinateDescent(BOWL.configs, budget=0.5)
    start = policy.plan(np.random.default_rng(0)).batch[0]
    durations = np.full(len(BOWL.configs), np.nan)
    durations[start] = np.inf
    observed = Observations(durations, np.zeros(len(durations)), np.full(len(durations), np.nan), 1.0)
    decision = policy.refine(observed, np.random.default_rng(0))
    assert len(decision.batch) == 1 and np.sum(policy._levels[decision.batch[0]] != policy._levels[start]) == 1


def test_trees_without_scikit_learn_names_the_extra_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real(name, *a))
    with pytest.raises(MissingDependency, match=r"fasta-sm\[bench\]"):
        make_policy("trees", BOWL.configs, {})


def test_a_percentile_over_runs_that_found_nothing_is_infinite_not_nan():
    assert percentile([1.0, 2.0, math.inf], 95) == math.inf
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0


def test_trees_beats_random_on_a_smooth_bowl():
    forest = [run_policy(BOWL, "trees", s, {"budget": 0.05}).regret_pct for s in range(5)]
    rand = [run_policy(BOWL, "random", s, {"budget": 0.05}).regret_pct for s in range(5)]
    assert np.median(forest) < np.median(rand)


def test_bench_report_has_exactly_the_documented_shape(tmp_path):
    for data in (landscapes.bowl(1), landscapes.needle(1, count=40)):
        (tmp_path / f"{data['kernel']}.json").write_text(json.dumps(data))
    report = bench(tmp_path, ["fasta", "random"], seeds=2)
    metrics = {"catch2", "catch5", "median_regret_pct", "p95_regret_pct", "evals_pct", "cost_pct"}
    assert set(report) == {"kernels", "overall"}
    assert all(set(row) == {"kernel", "policy", "N"} | metrics for row in report["kernels"])
    assert set(report["overall"]) == {"fasta", "random"}
    assert all(set(v) == metrics for v in report["overall"].values())
    json.dumps(report)


def test_the_needle_kernels_are_the_tables_with_at_most_three_configs_within_5_percent(tmp_path):
    for data in (landscapes.bowl(1), landscapes.needle(1, count=40)):
        (tmp_path / f"{data['kernel']}.json").write_text(json.dumps(data))
    assert needle_labels(load_tables(tmp_path)) == ["synthetic_needle_1"]


@pytest.mark.parametrize("needle_kernel", ["k (b.json)", "overall"])
def test_a_needle_named_as_another_row_gets_a_label_of_its_own_and_its_own_figures(needle_kernel, tmp_path):
    for name, data in (("a", landscapes.needle(1, count=40)), ("b", landscapes.bowl(1)), ("c", landscapes.bowl(2))):
        data["kernel"] = needle_kernel if name == "a" else "k"
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    report = bench(tmp_path, ["fasta", "random"], seeds=2)
    labels = [row["kernel"] for row in report["kernels"] if row["policy"] == "fasta"]
    assert len(set(labels)) == 3 and "overall" not in labels
    needle = needle_labels(load_tables(tmp_path))
    assert needle == [labels[0]]
    own = {row["policy"]: row["catch2"] for row in report["kernels"] if row["kernel"] == labels[0]}
    assert leader_margins(report, needle)[1] == {"kernel": labels[0], "catch2": own["fasta"], "baseline": "random",
                                                  "baseline_catch2": own["random"]}


def test_the_leader_is_set_against_the_best_baseline_overall_and_on_each_needle():
    def row(kernel, policy, catch2):
        return {"kernel": kernel, "policy": policy, "catch2": catch2}

    result = {
        "kernels": [row("a", "fasta", 0.9), row("a", "random", 0.5), row("a", "trees", 0.9),
                    row("b", "fasta", 1.0), row("b", "random", 0.2), row("b", "trees", 0.4)],
        "overall": {"fasta": {"catch2": 0.95}, "random": {"catch2": 0.35}, "trees": {"catch2": 0.65}},
    }
    assert leader_margins(result, ["a"]) == [
        {"kernel": "overall", "catch2": 0.95, "baseline": "trees", "baseline_catch2": 0.65},
        {"kernel": "a", "catch2": 0.9, "baseline": "trees", "baseline_catch2": 0.9},
    ]


def test_a_bench_of_one_policy_has_no_baseline_to_set_it_against():
    assert leader_margins({"kernels": [], "overall": {"fasta": {"catch2": 1.0}}}, []) == []


def test_bench_gives_baselines_the_leaders_evaluation_count(tmp_path):
    (tmp_path / "bowl.json").write_text(json.dumps(landscapes.bowl(2)))
    report = bench(tmp_path, ["fasta", "random", "coordesc"], seeds=3)
    evals = {row["policy"]: row["evals_pct"] for row in report["kernels"]}
    assert evals["random"] == pytest.approx(evals["fasta"])
    assert evals["coordesc"] <= evals["fasta"]


def test_bench_with_a_budget_gives_baselines_what_the_leader_evaluated_past_its_floor(tmp_path):
    (tmp_path / "bowl.json").write_text(json.dumps(landscapes.bowl(2)))
    report = bench(tmp_path, ["fasta", "random"], seeds=3, budget=0.01)
    evals = {row["policy"]: row["evals_pct"] for row in report["kernels"]}
    n = report["kernels"][0]["N"]
    assert evals["fasta"] * n / 100 >= 13 > 0.01 * n  # fasta's floor of min_budget configs
    assert evals["random"] == pytest.approx(evals["fasta"])


def test_bench_params_set_the_first_policys_knobs(tmp_path):
    data = landscapes.bowl(2)
    (tmp_path / "bowl.json").write_text(json.dumps(data))
    report = bench(tmp_path, ["fasta"], seeds=2, params={"min_budget": len(data["configs"])})
    assert report["kernels"][0]["evals_pct"] == pytest.approx(100.0)


def test_bench_refuses_a_budget_among_the_params(tmp_path):
    (tmp_path / "bowl.json").write_text(json.dumps(landscapes.bowl(2)))
    with pytest.raises(ValueError, match="budget"):
        bench(tmp_path, ["fasta"], seeds=1, params={"budget": 0.1})


@pytest.mark.parametrize("knob", [{"rounds": 0}, {"kappa": None}, {"r1_frac": 5}, {"kappa": 10**400}])
def test_trees_refuses_a_knob_that_would_break_its_search(knob):
    with pytest.raises(PolicyError, match=next(iter(knob))):
        make_policy("trees", MATMUL.configs, knob)


def test_bench_params_do_not_reach_the_baselines(tmp_path):
    (tmp_path / "bowl.json").write_text(json.dumps(landscapes.bowl(2)))
    with pytest.raises(PolicyError, match="failure_fit"):
        make_policy("random", BOWL.configs, {"failure_fit": True})
    report = bench(tmp_path, ["fasta", "random"], seeds=2, params={"failure_fit": True})
    assert {row["policy"] for row in report["kernels"]} == {"fasta", "random"}


@pytest.mark.parametrize("n, k", [(348, 22), (1150, 59), (162, 31)])
def test_a_budget_of_k_over_n_buys_exactly_k_configs(n, k):
    from fasta_sm.policies.baseline import budget_count

    assert budget_count(n, k / n) == k


def test_bench_takes_its_tables_folder_as_any_path_like(tmp_path):
    """As table_paths does (pytest's `tmpdir`, say): only a list that is no path is load_tables's."""
    import os

    class Folder:
        def __fspath__(self):
            return os.fspath(tmp_path)

    (tmp_path / "bowl.json").write_text(json.dumps(landscapes.bowl(3)))
    assert [row["kernel"] for row in bench(Folder(), ["random"], seeds=1)["kernels"]] == ["synthetic_bowl_3"]


def test_bench_refuses_an_empty_list_of_loaded_tables_as_it_refuses_a_folder_of_none():
    with pytest.raises(TableError, match="no replay tables"):
        bench([], ["fasta", "random"], seeds=1)


def test_bench_reports_progress_once_per_run(tmp_path):
    (tmp_path / "bowl.json").write_text(json.dumps(landscapes.bowl(3)))
    calls = []
    bench(tmp_path, ["fasta", "random"], seeds=2, progress=lambda *a: calls.append(a))
    assert [c[0] for c in calls] == [1, 2, 3, 4] and all(c[1] == 4 for c in calls)


def test_bench_progress_names_two_tables_of_one_kernel_as_their_rows_do(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps(landscapes.bowl(3)))
    calls = []
    report = bench(tmp_path, ["random"], seeds=1, progress=lambda *a: calls.append(a))
    assert [c[2] for c in calls] == [row["kernel"] for row in report["kernels"]] and len({c[2] for c in calls}) == 2


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
def test_a_named_pipe_among_a_folders_tables_is_a_table_error_naming_it_not_a_bench_left_waiting(tmp_path):
    (tmp_path / "bowl.json").write_text(json.dumps(landscapes.bowl(3)))
    os.mkfifo(tmp_path / "pipe.json")  # nothing writes to it: opened, it would block
    with pytest.raises(TableError, match=re.escape(f"{tmp_path / 'pipe.json'}: not a regular file")):
        bench(tmp_path, ["random"], seeds=1)


def test_bench_seed_start_runs_the_seeds_from_there(tmp_path):
    data = landscapes.needle(4, count=40)
    (tmp_path / "needle.json").write_text(json.dumps(data))
    table = landscapes.as_table(data)
    report = bench(tmp_path, ["fasta"], seeds=1, seed_start=7)
    expected = run_policy(table, "fasta", 7).regret_pct
    assert report["kernels"][0]["median_regret_pct"] == pytest.approx(expected)


def test_exhaustive_cost_compiles_everything_and_times_what_ran():
    ran = sum(e is None for e in MATMUL.errors)
    assert MATMUL.exhaustive_cost_s == pytest.approx(MATMUL.compile_s.sum() + 0.125 * ran)


def test_a_parameter_of_the_wrong_kind_is_reported_as_such_not_as_an_unknown_one():
    with pytest.raises(PolicyError, match=r"policy 'must-measure' cannot take .*'must': 5") as refused:
        make_policy("must-measure", BOWL.configs, {"inner": "random", "must": 5})
    assert "takes" not in str(refused.value)


@pytest.mark.parametrize("index", [1.7, "1", True, np.bool_(True)])
def test_must_measure_refuses_an_index_that_is_not_a_whole_number(index):
    with pytest.raises(FastaError, match="is not a whole number"):
        make_policy("must-measure", BOWL.configs, {"inner": "random", "must": [0, index]})


@pytest.mark.parametrize("index", [np.int64(1), np.asarray(1)], ids=["numpy int", "0-d array"])
def test_must_measure_takes_the_whole_numbers_the_engine_takes_as_config_indices(index):
    """One check for both: a 0-d integer array, which a policy's batch may hold, was refused here."""
    policy = make_policy("must-measure", BOWL.configs, {"inner": "random", "must": [index, 0]})
    assert policy.must == [0, 1] and all(type(i) is int for i in policy.must)


def test_must_measure_fills_in_its_inner_policys_knobs_from_the_environment(monkeypatch):
    wrapped = {"inner": "fasta", "must": [0], "params": {"rounds": 4}}
    monkeypatch.setenv("FASTA_R1_PCT", "0.1")
    assert with_environment("must-measure", wrapped)["params"] == {"r1_frac": 0.1, "rounds": 4}
    monkeypatch.delenv("FASTA_R1_PCT")
    assert with_environment("must-measure", wrapped) == wrapped


def test_a_percentile_that_falls_on_a_finite_regret_is_that_regret_though_a_run_found_nothing():
    assert percentile([0.1, 0.2, math.inf], 50) == 0.2
    assert percentile([*(0.1 * i for i in range(20)), math.inf], 95) == pytest.approx(1.9)
    assert percentile([*range(8), *[math.inf] * 18], 28) == 7.0  # 28 % of 25 steps is 7 exactly


def test_bench_gives_fasta_exactly_the_leaders_count_when_it_is_not_the_leader(tmp_path):
    (tmp_path / "bowl.json").write_text(json.dumps(landscapes.bowl(2)))
    report = bench(tmp_path, ["random", "fasta"], seeds=2, budget=0.005)  # 4 configs, below fasta's floor of 13
    evals = {row["policy"]: row["evals_pct"] for row in report["kernels"]}
    assert evals["fasta"] == pytest.approx(evals["random"])


@pytest.mark.parametrize("name", ["exhaustive", "random", "coordesc", "trees", "fasta"])
def test_every_policy_refuses_an_empty_config_list_naming_itself(name):
    with pytest.raises(ConfigError, match=rf"policy '{name}': the config list is empty"):
        make_policy(name, [], {})


def _documented_baseline_parameters() -> dict[tuple[str, str], str]:
    doc = (Path(__file__).parents[2] / "docs" / "algorithm.md").read_text()
    rows = [line.split("|")[1:4] for line in doc.splitlines() if line.startswith(("| `random`", "| `coordesc`",
                                                                                       "| `trees`"))]
    return {(policy.strip(" `"), name.strip(" `")): default.strip(" `") for policy, name, default in rows}


def test_the_algorithm_doc_lists_every_baseline_parameter_with_its_default():
    from fasta_sm.policies import _REGISTRY, _load_builtin

    _load_builtin()
    in_code = {
        (policy, p.name): repr(p.default)
        for policy in ("exhaustive", "random", "coordesc", "trees")
        for p in list(inspect.signature(_REGISTRY[policy]).parameters.values())[1:]
    }
    assert _documented_baseline_parameters() == in_code
