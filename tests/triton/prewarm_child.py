"""Decorates a kernel and prints whether a fork server is running.

`--nested`: in a spawned child process; `--wrapped`: a `triton.heuristics`
wrapper, which the compile workers do not compile; `--in-main`: a kernel
defined in this script, which they do not import; `--torch-table`: a kernel
whose module holds a torch dtype table, after which the server's preload is
printed too. A server started here is killed before exit, so that it does not
outlive the test.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import tempfile

import triton
import triton.language as tl


@triton.jit
def main_script_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, 1.0, mask=offs < n)


def decorate_and_report(wrapped: bool = False, torch_table: bool = False, in_main: bool = False) -> bool:
    from kernels import CONFIGS, accumulate_kernel, make_tuned

    import fasta_sm

    if torch_table:
        from torch_at_import import copy_kernel

        fasta_sm.autotune(CONFIGS, key=["n"], state_dir=tempfile.mkdtemp())(copy_kernel)
    elif in_main:
        fasta_sm.autotune(CONFIGS, key=["n"], state_dir=tempfile.mkdtemp())(main_script_kernel)
    elif wrapped:
        kernel = triton.heuristics({"scale": lambda args: 2.0})(accumulate_kernel)
        fasta_sm.autotune(CONFIGS, key=["n"], state_dir=tempfile.mkdtemp())(kernel)
    else:
        make_tuned(tempfile.mkdtemp())
    from fasta_sm.triton.fork_server import fork_server_pid

    pid = fork_server_pid()
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    return pid is not None


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
        started = decorate_and_report(wrapped="--wrapped" in sys.argv, torch_table="--torch-table" in sys.argv,
                                      in_main="--in-main" in sys.argv)
    print("started" if started else "not started", flush=True)
    if "--torch-table" in sys.argv:
        from fasta_sm.triton.fork_server import preload_modules

        print(" ".join(preload_modules()), flush=True)
