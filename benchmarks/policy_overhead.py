"""How long the FASTA policy itself takes: all refine calls of one tune, summed.

Usage: python benchmarks/policy_overhead.py [--table PATH] [--seeds 20] [--warmup 1]

Without --table it builds a 1,000-config matmul-like space (six knobs, an
out-of-resource corner, 2 % noise). The target is <= 20 ms per tune on N = 1,000.

Each tune is timed twice: wall clock (the target) and the CPU time of this
thread, which a busy machine inflates far less. `--warmup` tunes run untimed
first (on other seeds), so the first timed tune does not pay the process's
first calls into numpy. With a multi-threaded BLAS on a busy machine, the
BLAS thread that building the rbf basis wakes spins on for about 0.1 s,
into the first refine calls; no refine call on N = 1,000 is large enough to
wake it, and `OPENBLAS_NUM_THREADS=1` shows the policy's time without it.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import numpy as np

from fasta_sm.backends.replay import (
    BENCH_OVERHEAD_S,
    ReplayBackend,
    ReplayTable,
    load_table,
    table_from_dict,
)
from fasta_sm.policies.fasta import FastaPolicy
from fasta_sm.protocols import Observations


def synthetic_table(size: int = 1000, seed: int = 0) -> ReplayTable:
    rng = np.random.default_rng(seed)
    grid = list(itertools.product([16, 32, 64, 128, 256], [16, 32, 64, 128, 256], [16, 32, 64, 128], [1, 8],
                                  [2, 4, 8], [2, 3, 4, 5]))
    rows = []
    for bm, bn, bk, group, warps, stages in (grid[i] for i in sorted(rng.choice(len(grid), size, replace=False))):
        failed = (bm + bn) * bk * 2 * stages > 232_448
        mean = 100 * (1 + 0.1 * (math.log2(bm) - 7) ** 2 + 0.1 * (math.log2(bn) - 7) ** 2 + 0.05 * abs(stages - 3))
        rows.append({"kwargs": {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group},
                     "num_warps": warps, "num_stages": stages, "compile_s": 1.0,
                     "duration_us": [] if failed else [mean * (1 + 0.02 * rng.standard_normal()) for _ in range(2)],
                     "error": "OutOfResources" if failed else None})
    meta = {"shape": {"configs": size}, "device": "synthetic", "torch": "-", "triton": "-"}
    return table_from_dict({"kernel": f"overhead_{size}", **meta, "configs": rows}, "synthetic")


def refine_seconds(table: ReplayTable, seed: int) -> tuple[float, float, float, int]:
    """Wall seconds spent inside refine() over one whole tune, the same in CPU seconds, the slowest call, the calls."""
    n = len(table.configs)
    backend = ReplayBackend(table, noise=True, seed=seed)
    rng = np.random.default_rng(seed)
    policy = FastaPolicy(table.configs)
    durations, sums, samples = np.full(n, np.nan), np.zeros(n), np.zeros(n, dtype=np.int64)
    compile_s = np.full(n, np.nan)
    failures: dict[int, str] = {}
    decision, spent, cpu, slowest, calls = policy.plan(rng), 0.0, 0.0, 0.0, 0
    tuning_s = 0.0  # compile and benchmark seconds, as the engine charges them: the re-time cap reads them
    while len(decision.batch):
        for i in decision.batch:
            if samples[i] == 0 and i not in failures:
                tuning_s += table.compile_s[i]
            if table.errors[i] is not None:
                durations[i] = math.inf
                failures[i] = table.errors[i]
                continue
            compile_s[i] = table.compile_s[i]
            sums[i] += backend.timing(i, int(samples[i]))
            samples[i] += 1
            durations[i] = sums[i] / samples[i]
        tuning_s += BENCH_OVERHEAD_S * len(decision.batch)
        observed = Observations(durations.copy(), samples.copy(), compile_s.copy(), tuning_s, dict(failures))
        started, started_cpu = time.perf_counter(), time.thread_time()
        decision = policy.refine(observed, rng)
        took = time.perf_counter() - started
        cpu += time.thread_time() - started_cpu
        spent += took
        slowest = max(slowest, took)
        calls += 1
    return spent, cpu, slowest, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", help="a replay table (default: synthetic, N = 1,000)")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=1, help="untimed tunes first, on seeds after the timed ones")
    args = parser.parse_args()
    table = load_table(args.table) if args.table else synthetic_table()
    for seed in range(args.seeds, args.seeds + args.warmup):
        refine_seconds(table, seed)
    results = np.array([refine_seconds(table, seed) for seed in range(args.seeds)])
    wall_ms, cpu_ms, slowest_ms, calls = results[:, 0] * 1e3, results[:, 1] * 1e3, results[:, 2] * 1e3, results[:, 3]
    print(f"{table.kernel}: N={len(table.configs)}, {args.seeds} tunes, {calls.mean():.1f} refine calls per tune")
    print(f"refine time per tune: median {np.median(wall_ms):.1f} ms, max {wall_ms.max():.1f} ms (target <= 20 ms)")
    print(f"refine CPU time per tune: median {np.median(cpu_ms):.1f} ms, max {cpu_ms.max():.1f} ms")
    print(f"slowest refine call of a tune: median {np.median(slowest_ms):.1f} ms, max {slowest_ms.max():.1f} ms")


if __name__ == "__main__":
    main()
