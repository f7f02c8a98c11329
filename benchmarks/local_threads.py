"""Cold fasta (and exhaustive) wall time with 2, 1 or 0 compile threads in process while the pool starts.

Sets `compile_pool.LOCAL_THREADS` per variant and runs
`triton_autotune.run_kernel` cold, printing each tune's wall time, its R1's,
and when the pool was ready, counted from the tune's first compile call.

    python3 benchmarks/local_threads.py --kernels add_gelu mm_skinny_bf16 rmsnorm row_sum --out threads.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import triton_autotune  # noqa: E402
from bench_env import device_or_exit, scratch  # noqa: E402

from fasta_sm.triton import backend, compile_pool  # noqa: E402

READY: list[float] = []
FIRST_COMPILE: list[float] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", default=["add_gelu", "mm_skinny_bf16", "rmsnorm", "row_sum"])
    parser.add_argument("--variants", nargs="+", default=["2,8", "0,8", "1,8"], help="LOCAL_THREADS values")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--exhaustive", nargs="*", default=["2,8", "0,8"], help="variants that also time exhaustive")
    parser.add_argument("--small", type=int, default=0, help="tiny shapes and at most N configs (the interpreter)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device_or_exit("local_threads.py")
    start, compile_ = compile_pool.CompilePool.start, backend.TritonBackend._compile_in_pool

    def timed_start(self):
        start(self)
        READY.append(time.perf_counter())

    def timed_compile(self, configs, jobs, first):
        FIRST_COMPILE.append(time.perf_counter())
        return compile_(self, configs, jobs, first)

    compile_pool.CompilePool.start = timed_start
    backend.TritonBackend._compile_in_pool = timed_compile
    results = []
    for rep in range(args.reps):
        for variant in args.variants:
            compile_pool.LOCAL_THREADS = tuple(int(x) for x in variant.split(","))
            for kernel in args.kernels:
                methods = ["fasta"] + (["exhaustive"] if rep == 0 and variant in args.exhaustive else [])
                opts = triton_autotune.run_options(methods, small=args.small)
                READY.clear()
                FIRST_COMPILE.clear()
                row = triton_autotune.run_kernel(kernel, opts)
                ready = round(READY[0] - FIRST_COMPILE[0], 3) if READY and FIRST_COMPILE else None
                result = {"rep": rep, "threads": variant, "kernel": kernel, "pool_ready_after_first_compile_s": ready}
                for method in methods:
                    result[method] = row[method]["cold_s"]
                    result[f"{method}_R1"] = row[method]["rounds"][0][2]
                results.append(result)
                print(json.dumps(result), flush=True)
                Path(args.out).write_text(json.dumps(results, indent=1))
    print("threads kernel: fasta s per rep | its R1 s | exhaustive s | pool ready s")
    for variant in args.variants:
        for kernel in args.kernels:
            rows = [r for r in results if r["threads"] == variant and r["kernel"] == kernel]
            print(variant, kernel, [r["fasta"] for r in rows], [r["fasta_R1"] for r in rows],
                  [r.get("exhaustive") for r in rows], [r["pool_ready_after_first_compile_s"] for r in rows])


if __name__ == "__main__":
    with scratch("local_threads"):
        main()
