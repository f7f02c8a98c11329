"""Starts a compile pool, prints its workers' pids, and dies without cleanup (the orphan test); or, as a
multiprocessing child's target (`tune_and_return`), starts one and returns."""

from __future__ import annotations

import os


def tune_and_return() -> None:
    """A multiprocessing child's target that tunes (its pool is up) and returns, as a rank of
    `torch.multiprocessing.spawn` does."""
    from fasta_sm.triton.compile_pool import shared_pool

    shared_pool().start()


if __name__ == "__main__":
    from fasta_sm.triton.compile_pool import CompilePool

    pool = CompilePool(2)
    pool.start()
    print(" ".join(str(pid) for pid in pool._executor._processes), flush=True)
    os._exit(9)
