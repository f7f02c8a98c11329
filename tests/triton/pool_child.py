"""Starts a compile pool, prints its workers' pids, and dies without cleanup (the orphan test)."""

from __future__ import annotations

import os

if __name__ == "__main__":
    from fasta_sm.triton.compile_pool import CompilePool

    pool = CompilePool(2)
    pool.start()
    print(" ".join(str(pid) for pid in pool._executor._processes), flush=True)
    os._exit(9)
