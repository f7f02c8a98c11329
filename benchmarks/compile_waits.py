"""Where a live fasta tune waits: each compile call's wall time and guesses, each load's seconds.

Runs `triton_autotune.run_kernel` with the backend's compiles in the pool
(`_compile_in_pool`, under both `compile` and `compile_first`), `_load` and
`benchmark` and the prefetcher's `take` wrapped to log, per compile call,
how many configs it had (and how many it handed back), how long it took, and whether each config's guess
had finished (d), was still compiling (r) or was never started (n); and per
load in the tuning process, its seconds (on Triton 3.6 the first loads from
a cold Triton cache build Triton's C launcher with gcc).

    python3 benchmarks/compile_waits.py --kernels add_gelu mm_skinny_bf16 rmsnorm \\
        --methods fasta fasta-pool-up --out waits.json
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

from fasta_sm.triton import backend, prefetch  # noqa: E402

LOG: list[dict] = []
T0 = [time.perf_counter()]


def log(**event) -> None:
    event["t"] = round(time.perf_counter() - T0[0], 3)
    LOG.append(event)


def wrap_take(take):
    def logged(self, key):
        future = take(self, key)
        log(what="take", state="none" if future is None else ("done" if future.done() else "running"))
        return future

    return logged


def wrap_compile(compile_):
    def logged(self, configs, jobs, first):
        start, logged_before = time.perf_counter(), len(LOG)
        outcomes = compile_(self, configs, jobs, first)
        takes = [event["state"] for event in LOG[logged_before:] if event["what"] == "take"]
        log(what="compile", n=len(configs), back=len(outcomes), wall=round(time.perf_counter() - start, 3),
            takes=takes)
        return outcomes

    return logged


def wrap_load(load):
    def logged(self, config, worker_seconds):
        start = time.perf_counter()
        outcome = load(self, config, worker_seconds)
        log(what="load", s=round(time.perf_counter() - start, 4), worker_s=round(worker_seconds, 3))
        return outcome

    return logged


def wrap_benchmark(benchmark):
    def logged(self, configs, repeat=None):
        start = time.perf_counter()
        outcome = benchmark(self, configs, repeat=repeat)
        log(what="benchmark", n=len(configs), wall=round(time.perf_counter() - start, 3))
        return outcome

    return logged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", default=["add_gelu", "mm_skinny_bf16", "rmsnorm"])
    parser.add_argument("--methods", nargs="+", default=["fasta", "fasta-pool-up"])
    parser.add_argument("--small", type=int, default=0, help="tiny shapes and at most N configs (the interpreter)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device_or_exit("compile_waits.py")
    prefetch.Prefetcher.take = wrap_take(prefetch.Prefetcher.take)
    backend.TritonBackend._compile_in_pool = wrap_compile(backend.TritonBackend._compile_in_pool)
    backend.TritonBackend._load = wrap_load(backend.TritonBackend._load)
    backend.TritonBackend.benchmark = wrap_benchmark(backend.TritonBackend.benchmark)
    opts = triton_autotune.run_options(args.methods, small=args.small)
    results = []
    for kernel in args.kernels:
        LOG.clear()
        T0[0] = time.perf_counter()
        row = triton_autotune.run_kernel(kernel, opts)
        results.append({"kernel": kernel, "row": row, "log": list(LOG)})
    Path(args.out).write_text(json.dumps(results, indent=1))
    for result in results:
        calls = [event for event in result["log"] if event["what"] == "compile"]
        shown = " | ".join(f"{e['n']}:{e['wall']}:{''.join(s[0] for s in e['takes'])}" for e in calls)
        print(result["kernel"], "compile calls (configs:wall s:guesses):", shown)
        loads = [event["s"] for event in result["log"] if event["what"] == "load"]
        print(result["kernel"], "first loads (s):", loads[:5])


if __name__ == "__main__":
    with scratch("compile_waits"):
        main()
