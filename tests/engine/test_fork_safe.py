"""Every lock a tune takes is free in a child forked while another thread of its parent held it."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

import fasta_sm.machine as machine
import fasta_sm.prior as prior
import fasta_sm.triton.worker as worker
from fasta_sm.fork_safe import ForkSafeLock

LOCKS = {
    "the prior's file cache": lambda: prior._entries_lock,
    "the shared state machine's": lambda: machine._machine_lock,
    "Triton's cache key": lambda: worker._TRITON_KEY_LOCK,
    "a deferred import's": lambda: worker._DEFERRED_LOCK,
}


def _taken_in_a_child_forked_while_held(lock) -> bool:
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(5)

    def child() -> None:
        with lock:
            os._exit(0)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(5)
    taken = process.exitcode == 0
    if process.is_alive():
        process.kill()
    release.set()
    holder.join()
    return taken


# Python ≥ 3.12 warns of forking with a live thread, which is the point here
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.parametrize("name", LOCKS)
def test_a_lock_a_tune_takes_is_free_in_a_child_forked_while_a_thread_held_it(name):
    assert _taken_in_a_child_forked_while_held(LOCKS[name]())


def test_a_fork_safe_lock_still_excludes_threads_in_the_process_that_made_it():
    lock, inside, order = ForkSafeLock(), threading.Event(), []

    def first() -> None:
        with lock:
            inside.set()
            threading.Event().wait(0.1)
            order.append("first")

    thread = threading.Thread(target=first)
    thread.start()
    inside.wait(5)
    with lock:
        order.append("second")
    thread.join()
    assert order == ["first", "second"]
