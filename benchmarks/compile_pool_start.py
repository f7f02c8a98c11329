"""How long a cold compile pool takes to start, and what a kernel module that uses torch on import costs it.

Each measurement runs in a fresh process (so the fork server starts cold)
with a CUDA context, as a tuning process has:

    python3 benchmarks/compile_pool_start.py                    # server up, first worker, all workers
    FASTA_WORKER_TORCH=0 python3 benchmarks/compile_pool_start.py --torch-at-import
    FASTA_WORKER_TORCH=1 python3 benchmarks/compile_pool_start.py --torch-at-import

With `--torch-at-import` every worker's first job imports
`tests/triton/torch_at_import.py`, a module that uses torch when imported,
and the time until all of them are done is printed: what the first compile
on each worker waits for, with torch imported per worker
(`FASTA_WORKER_TORCH=0`; unset, this script decorates no kernel, so torch
is deferred too) or once by the fork server (`FASTA_WORKER_TORCH=1`, as
when a decorated kernel's module is seen to use torch on import).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import wait
from pathlib import Path

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-at-import", action="store_true")
    opts = parser.parse_args()

    import torch

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "triton"))  # workers get this path
    from fasta_sm.triton import compile_pool

    start = time.perf_counter()
    pool = compile_pool.CompilePool()
    if opts.torch_at_import:
        pool.start()
        ready = time.perf_counter() - start
        list(pool.run([compile_pool.CompileJob("torch_at_import", "noop", (), {}) for _ in range(pool.workers)]))
        print(f"FASTA_WORKER_TORCH={os.environ.get('FASTA_WORKER_TORCH', '0')}: pool ready {ready:.2f} s, "
              f"first job on each of {pool.workers} workers (module uses torch on import) done at "
              f"{time.perf_counter() - start:.2f} s")
    else:
        executor, _ = pool._get()
        first = executor.submit(compile_pool._started)
        server_up = time.perf_counter() - start
        first.result()
        first_ready = time.perf_counter() - start
        rest = [executor.submit(compile_pool._started) for _ in range(pool.workers - 1)]
        forked = time.perf_counter() - start
        wait(rest)
        print(f"pool start: server up + 1st fork {server_up:.2f} s, 1st worker ready {first_ready:.2f} s, "
              f"all {pool.workers} forked {forked:.2f} s, all ready {time.perf_counter() - start:.2f} s")
    pool.close()
