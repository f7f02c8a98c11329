"""Concurrency: many processes tuning the same kernel at once share one tune.

Each process is forked and released at once by a barrier; each runs `tune()`
with a replay backend that fsyncs every timing it hands out to one shared
append-only log (engine_harness.LoggingBackend), and sleeps a few ms per call so
the tune lasts long enough for every process to arrive while it runs.
"""

from __future__ import annotations

import json
import multiprocessing
from collections import Counter
from pathlib import Path

import crash_child
import pytest
from crash_child import KEY
from engine_harness import read_log

from fasta_sm.store import StateStore

FORK = multiprocessing.get_context("fork")
PROCESSES = 12


def _tune_after(barrier, kwargs):
    barrier.wait(timeout=60)
    crash_child.tune_child(**kwargs)


def run_together(n: int, make_kwargs) -> list[int]:
    barrier = FORK.Barrier(n)
    processes = [FORK.Process(target=_tune_after, args=(barrier, make_kwargs(i)), daemon=True) for i in range(n)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    return [process.exitcode for process in processes]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["exhaustive", "fasta"])
def test_processes_tuning_one_kernel_at_once_measure_each_config_once_and_agree(policy, table_path, tmp_path):
    state_dir, log_path = tmp_path / "states", tmp_path / "bench.log"

    def kwargs(i: int) -> dict:
        return dict(table_path=str(table_path), state_dir=str(state_dir), log_path=str(log_path), policy=policy,
                    seed=11, chunk_size=4, delay_s=0.004, result_path=str(tmp_path / f"result-{i}.json"), tag=str(i))

    codes = run_together(PROCESSES, kwargs)
    assert codes == [0] * PROCESSES

    results = [json.loads((tmp_path / f"result-{i}.json").read_text()) for i in range(PROCESSES)]
    assert len({(r["best"], r["best_us"]) for r in results}) == 1, results
    assert sum(not r["reused"] for r in results) == 1  # one process tuned, the others used its result

    log = read_log(log_path)
    timings = Counter((entry["index"], entry["k"]) for entry in log)
    assert log and max(timings.values()) == 1, [t for t, n in timings.items() if n > 1]
    assert len({entry["tag"] for entry in log}) == 1  # all measured by the one process that tuned

    store = StateStore(state_dir)
    state = store.read(store.file_for(KEY))
    assert state.done and state.evaluations() == len(log)
    assert sorted(p.name for p in state_dir.iterdir()) == sorted(
        [store.file_for(KEY).name, store.lock_path_for(KEY).name])  # no temp, corrupt or stray files


@pytest.mark.slow
def test_processes_tuning_different_kernels_in_one_state_dir_do_not_interfere(table_path, tmp_path):
    state_dir = tmp_path / "states"

    def kwargs(i: int) -> dict:
        return dict(table_path=str(table_path), state_dir=str(state_dir), log_path=str(tmp_path / f"bench-{i}.log"),
                    policy="random", params={"budget": 0.5}, seed=i, chunk_size=4, delay_s=0.002,
                    result_path=str(tmp_path / f"result-{i}.json"), key=f"kernel-{i}")

    assert run_together(8, kwargs) == [0] * 8

    store = StateStore(state_dir)
    files = store.state_files()
    assert len(files) == 8
    assert all(store.read(path).done for path in files)
    assert not list(Path(state_dir).glob("*.corrupt-*")) and not list(Path(state_dir).glob("*.tmp"))
    for i in range(8):
        result = json.loads((tmp_path / f"result-{i}.json").read_text())
        assert not result["reused"]
        counts = Counter(e["index"] for e in read_log(tmp_path / f"bench-{i}.log"))
        assert max(counts.values()) == 1
