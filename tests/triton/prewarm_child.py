"""Decorates a kernel and prints whether a fork server is running (`--nested`: in a spawned child process)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import sys
import tempfile


def decorate_and_report() -> bool:
    from kernels import make_tuned

    make_tuned(tempfile.mkdtemp())
    return multiprocessing.forkserver._forkserver._forkserver_pid is not None


def _report_to(queue) -> None:
    queue.put(decorate_and_report())


if __name__ == "__main__":
    if "--nested" in sys.argv:
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=_report_to, args=(queue,))
        child.start()
        started = queue.get(timeout=300)
        child.join()
    else:
        started = decorate_and_report()
    print("started" if started else "not started", flush=True)
