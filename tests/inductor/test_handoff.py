"""The worker-to-parent handoff of a tune through its state file, across real processes (replay backend)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.driver import parent_phase, wanted_after_worker, worker_phase
from fasta_sm.policies.must_measure import MustMeasure
from fasta_sm.store import StateStore

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from handoff_child import make_plan


class CountingBackend(ReplayBackend):
    def __init__(self, table):
        super().__init__(table)
        self.compiled, self.benchmarked = [], []

    def compile(self, configs):
        self.compiled += configs
        return super().compile(configs)

    def benchmark(self, configs, repeat=None):
        self.benchmarked += configs
        return super().benchmark(configs, repeat)


def child(table_file: Path, state_dir: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, str(HERE / "handoff_child.py"), str(table_file), str(state_dir), *args],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.stdout or done.returncode == -9 or done.returncode == 9, done.stderr
    return json.loads(done.stdout) if done.stdout else {"returncode": done.returncode}


def uninterrupted(table, state_dir: Path):
    return parent_phase(make_plan(table, str(state_dir)), ReplayBackend(table))


def test_worker_plans_and_compiles_r1_then_parent_finishes(table_file, tmp_path):
    table = load_table(table_file)
    states = tmp_path / "states"
    worker = child(table_file, states, "worker")
    assert worker["position"] == "R1 benchmark", "the worker stops once R1 is compiled"
    state = StateStore(states).load("handoff/toy")
    r1 = state.rounds[0].batch
    assert {0, 5} <= set(r1), "Inductor's own configs are always in R1"
    assert sorted(worker["compiled"]) == sorted(i for i in r1 if i not in state.failed)
    assert set(worker["wanted"]) == set(r1) - set(state.failed)
    assert not state.durations, "nothing is benchmarked in a worker"

    backend = CountingBackend(table)
    done = parent_phase(make_plan(table, str(states)), backend)
    assert done.done
    assert not set(map(table.index_of, backend.compiled)) & set(r1), "the parent never recompiles R1"
    reference = uninterrupted(table, tmp_path / "reference")
    assert (done.best, sorted(done.durations)) == (reference.best, sorted(reference.durations))

    again = child(table_file, states, "worker")
    assert again["position"] == "DONE" and again["wanted"] == [done.best]
    third = CountingBackend(table)
    assert parent_phase(make_plan(table, str(states)), third).best == done.best
    assert third.compiled == [] and third.benchmarked == [], "a third run tunes nothing"


@pytest.mark.parametrize("kill_after", [1, 3])
def test_parent_killed_mid_tune_resumes_where_it_stopped(table_file, tmp_path, kill_after):
    table = load_table(table_file)
    states = tmp_path / "states"
    child(table_file, states, "worker")
    killed = child(table_file, states, "parent", str(kill_after))
    assert killed.get("returncode") in (9, -9)
    cut = StateStore(states).load("handoff/toy")
    assert not cut.done and cut.durations, "the kill left a checkpoint part-way"

    worker = worker_phase(make_plan(table, str(states)), ReplayBackend(table))
    wanted = wanted_after_worker(worker)
    assert wanted and not set(wanted) & set(worker.round_done), "the worker hands over the round's configs left to time"
    backend = CountingBackend(table)
    done = parent_phase(make_plan(table, str(states)), backend)
    reference = uninterrupted(table, tmp_path / "reference")
    assert (done.best, sorted(done.durations)) == (reference.best, sorted(reference.durations))
    assert done.evaluations() == reference.evaluations(), "no timing lost or taken twice (re-times are planned)"
    assert len(backend.benchmarked) == done.evaluations() - cut.evaluations()


def test_a_corrupt_state_file_is_set_aside_and_the_tune_starts_afresh(table_file, tmp_path):
    table = load_table(table_file)
    store = StateStore(tmp_path / "states")
    path = store.file_for("handoff/toy")
    path.write_bytes(b"\x00 not msgpack \xff")
    state = worker_phase(make_plan(table, str(store.path)), ReplayBackend(table))
    assert state.position() == "R1 benchmark"
    assert list(store.path.glob("*.corrupt-*")), "the damaged file is kept aside"


def test_must_measure_is_built_in_so_a_process_that_never_imports_the_driver_resumes_it():
    import subprocess
    import sys

    probe = ("from fasta_sm.config import Config; from fasta_sm.policies import make_policy; "
             "configs = [Config({'X': 1}), Config({'X': 2})]; "
             "policy = make_policy('must-measure', configs, {'inner': 'random', 'must': [1]}); "
             "print(policy.name == 'must-measure')")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stderr


def test_must_measure_wraps_any_policy(table_file):
    import numpy as np

    table = load_table(table_file)
    policy = MustMeasure(table.configs, inner="random", must=[1, 2, 47], params={"budget": 0.1})
    batch = policy.plan(np.random.default_rng(0)).batch
    assert {1, 2, 47} <= set(batch) and len(batch) <= 5 + 3
