"""Uses multiprocessing's fork server for the program's own pool, as another library would, and fasta-sm's
compile pool, in the order given (`program-first` or `fasta-first`); prints what a child of each saw (JSON).

A child of the program's pool reports whether fasta-sm's worker preload was
imported in it; a compile worker reports the same and the `__main__` file it
ran (None: the script did not run again there).
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def preloaded() -> bool:
    return "fasta_sm.triton.worker_preload" in sys.modules


def programs_child_preloaded() -> bool:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver")) as executor:
        return executor.submit(preloaded).result(60)


def compile_workers_report() -> str:
    from fasta_sm.triton.compile_pool import CompilePool
    from fasta_sm.triton.worker import CompileJob

    pool = CompilePool(1)
    try:
        pool.start()
        return pool.submit(CompileJob("worker_probe", "preload_probe", (), {})).result(60).error
    finally:
        pool.close()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    if sys.argv[1] == "program-first":
        program = programs_child_preloaded()
        worker = compile_workers_report()
    else:
        worker = compile_workers_report()
        program = programs_child_preloaded()
    print(json.dumps({"program_child_preloaded": program, "worker": worker}))
