"""The FASTA policy does its linear algebra on one BLAS thread, and gives the others back afterwards."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from driving import drive
from landscapes import as_table, matmul
from threadpoolctl import threadpool_info

import fasta_sm.policies.fasta.blas as blas
import fasta_sm.policies.fasta.policy as fasta_policy
from fasta_sm.policies.fasta.blas import one_blas_thread
from fasta_sm.policies.fasta.policy import FastaPolicy


def _blas_threads() -> list[int]:
    return [library["num_threads"] for library in threadpool_info() if library["user_api"] == "blas"]


@pytest.fixture
def several_blas_threads() -> list[int]:
    before = _blas_threads()
    if not before or max(before) < 2:
        pytest.skip(f"numpy's BLAS runs on one thread here already ({before}): nothing to limit")
    return before


def test_every_ridge_competition_of_a_tune_runs_on_one_blas_thread(several_blas_threads, monkeypatch):
    seen: list[list[int]] = []
    compete = fasta_policy.compete

    def watched(*args, **kwargs):
        seen.append(_blas_threads())
        return compete(*args, **kwargs)

    monkeypatch.setattr(fasta_policy, "compete", watched)
    table = as_table(matmul(0, size=300))
    drive(FastaPolicy(table.configs), table, seed=0)
    assert seen, "the tune fitted no surrogate"
    assert all(threads == [1] * len(threads) for threads in seen)


def test_the_blas_thread_count_is_restored_after_each_call(several_blas_threads):
    table = as_table(matmul(0, size=300))
    policy = FastaPolicy(table.configs)
    assert _blas_threads() == several_blas_threads
    policy.plan(np.random.default_rng(0))
    assert _blas_threads() == several_blas_threads


def test_a_policy_call_off_the_main_thread_leaves_the_blas_threads_alone(several_blas_threads):
    seen: list[list[int]] = []

    def off_main() -> None:
        with one_blas_thread():
            seen.append(_blas_threads())

    thread = threading.Thread(target=off_main)
    thread.start()
    thread.join(5)
    assert seen == [several_blas_threads]
    assert _blas_threads() == several_blas_threads


def test_a_nested_call_keeps_the_limit_until_the_outer_one_ends(several_blas_threads):
    with one_blas_thread():
        with one_blas_thread():
            pass
        assert _blas_threads() == [1] * len(several_blas_threads)
    assert _blas_threads() == several_blas_threads


def test_a_library_that_fails_to_report_its_threads_does_not_leave_later_calls_unlimited(
    several_blas_threads, monkeypatch
):
    class Failing:
        def get_num_threads(self) -> int:
            raise OSError("no openblas_get_num_threads")

    libraries = blas._blas_libraries()
    monkeypatch.setattr(blas, "_blas_libraries", lambda: (Failing(),))
    with pytest.raises(OSError), one_blas_thread():
        pass
    monkeypatch.setattr(blas, "_blas_libraries", lambda: libraries)
    with one_blas_thread():
        assert _blas_threads() == [1] * len(several_blas_threads)
    assert _blas_threads() == several_blas_threads
