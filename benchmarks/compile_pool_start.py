"""How long a cold compile pool takes to start, and what a kernel module that uses torch on import costs it.

Each measurement runs in a fresh process (so the fork server starts cold)
with a CUDA context, as a tuning process has:

    python3 benchmarks/compile_pool_start.py                    # server up, first worker, all workers
    FASTA_WORKER_TORCH=0 python3 benchmarks/compile_pool_start.py --torch-at-import
    FASTA_WORKER_TORCH=1 python3 benchmarks/compile_pool_start.py --torch-at-import
    python3 benchmarks/compile_pool_start.py --user-script

With `--torch-at-import` every worker's first job imports
`tests/triton/torch_at_import.py`, a module that uses torch when imported,
and the time until all of them are done is printed: what the first compile
on each worker waits for, with torch imported per worker
(`FASTA_WORKER_TORCH=0`; unset, this script decorates no kernel, so torch
is deferred too) or once by the fork server (`FASTA_WORKER_TORCH=1`, as
when a decorated kernel's module is seen to use torch on import).

With `--user-script` the pool is started from a script that begins as
training scripts do, with `import torch.nn`, run as the main program: a
worker that ran the main script again before its first job (as
multiprocessing's children do) would import torch there.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import wait
from pathlib import Path

USER_SCRIPT = """
import time

import torch.nn

from fasta_sm.triton import compile_pool

if __name__ == "__main__":
    start = time.perf_counter()
    pool = compile_pool.CompilePool()
    pool.start()
    print(f"main script imports torch.nn: all {pool.workers} workers ready {time.perf_counter() - start:.2f} s")
    pool.close()
"""

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-at-import", action="store_true")
    parser.add_argument("--user-script", action="store_true")
    opts = parser.parse_args()
    if opts.user_script:
        with tempfile.TemporaryDirectory() as folder:  # a folder of its own: the script's folder leads sys.path
            script = Path(folder) / "train.py"
            script.write_text(USER_SCRIPT)
            done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
        print(done.stdout.strip() or done.stderr[-2000:])
        sys.exit(done.returncode)

    import torch

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "triton"))  # workers get this path
    from fasta_sm.triton import compile_pool, worker

    start = time.perf_counter()
    pool = compile_pool.CompilePool()
    if opts.torch_at_import:
        pool.start()
        ready = time.perf_counter() - start
        list(pool.run([worker.CompileJob("torch_at_import", "noop", (), {}) for _ in range(pool.workers)]))
        print(f"FASTA_WORKER_TORCH={os.environ.get('FASTA_WORKER_TORCH', '0')}: pool ready {ready:.2f} s, "
              f"first job on each of {pool.workers} workers (module uses torch on import) done at "
              f"{time.perf_counter() - start:.2f} s")
    else:
        executor, _ = pool._get()
        first = executor.submit(worker.do_nothing)
        server_up = time.perf_counter() - start
        first.result()
        first_ready = time.perf_counter() - start
        rest = [executor.submit(worker.do_nothing) for _ in range(pool.workers - 1)]
        forked = time.perf_counter() - start
        wait(rest)
        print(f"pool start: server up + 1st fork {server_up:.2f} s, 1st worker ready {first_ready:.2f} s, "
              f"all {pool.workers} forked {forked:.2f} s, all ready {time.perf_counter() - start:.2f} s")
    pool.close()
