"""Starts the shared compile pool, leaves a long guess running in it, and exits normally (the exit test)."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":
    from fasta_sm.triton.compile_pool import shared_pool
    from fasta_sm.triton.worker import CompileJob

    started = Path(tempfile.mkdtemp()) / "started"
    pool = shared_pool()
    pool.start()
    guess = pool.try_submit(CompileJob("worker_probe", "slow", (), {"started": str(started), "seconds": 600.0}))
    deadline = time.monotonic() + 60
    while not started.exists():
        if time.monotonic() > deadline:
            sys.exit("the guess never started")
        time.sleep(0.05)
