"""A kernel author's script with no `if __name__ == "__main__":` guard, as Triton's own tutorials are written.

It appends a line to the file named by argv[1] each time its top level
runs, starts a compile pool, and prints what two of its workers report: the
file of their `__main__` and what torch is there. A worker that ran this
script again would start a pool while bootstrapping and die.
"""

import json
import os
import sys
from pathlib import Path

import torch.nn  # noqa: F401  a script's usual first line: imports torch itself, not a stand-in

sys.path.insert(0, str(Path(__file__).parent))
from triton.backends.compiler import GPUTarget  # noqa: E402

from fasta_sm.triton.compile_pool import CompilePool  # noqa: E402
from fasta_sm.triton.worker import CompileJob  # noqa: E402

with open(sys.argv[1], "a") as runs:
    runs.write(f"{os.getpid()}\n")
target = GPUTarget("cuda", 90, 32)
pool = CompilePool(2)
try:
    pool.start()
    reports = {name: pool.submit(CompileJob("worker_probe", name, (), {}, target)).result(60).error
               for name in ("main_probe", "torch_probe")}
finally:
    pool.close()
print(json.dumps(reports))
