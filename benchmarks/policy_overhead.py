"""How long the FASTA policy itself takes: all refine calls of one tune, summed.

Usage: python benchmarks/policy_overhead.py [--table PATH] [--seeds 20]

Without --table it builds a 1,000-config matmul-like space (six knobs, an
out-of-resource corner, 2 % noise). The target is <= 20 ms per tune on N = 1,000.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import numpy as np

from fasta_sm.backends.replay import (
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
    return table_from_dict({"kernel": f"overhead_{size}", "configs": rows}, "synthetic")


def refine_seconds(table: ReplayTable, seed: int) -> tuple[float, int]:
    """Seconds spent inside refine() over one whole tune, and how many calls."""
    n = len(table.configs)
    backend = ReplayBackend(table, noise=True, seed=seed)
    rng = np.random.default_rng(seed)
    policy = FastaPolicy(table.configs)
    durations, sums, samples = np.full(n, np.nan), np.zeros(n), np.zeros(n, dtype=np.int64)
    compile_s = np.full(n, np.nan)
    decision, spent, calls = policy.plan(rng), 0.0, 0
    while len(decision.batch):
        for i in decision.batch:
            if table.errors[i] is not None:
                durations[i] = math.inf
                continue
            compile_s[i] = table.compile_s[i]
            sums[i] += backend.timing(i, int(samples[i]))
            samples[i] += 1
            durations[i] = sums[i] / samples[i]
        observed = Observations(durations.copy(), samples.copy(), compile_s.copy(), 0.0)
        started = time.perf_counter()
        decision = policy.refine(observed, rng)
        spent += time.perf_counter() - started
        calls += 1
    return spent, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", help="a replay table (default: synthetic, N = 1,000)")
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    table = load_table(args.table) if args.table else synthetic_table()
    results = [refine_seconds(table, seed) for seed in range(args.seeds)]
    per_tune_ms = np.array([s for s, _ in results]) * 1e3
    calls = np.array([c for _, c in results])
    print(f"{table.kernel}: N={len(table.configs)}, {args.seeds} tunes, {calls.mean():.1f} refine calls per tune")
    print(f"refine time per tune: median {np.median(per_tune_ms):.1f} ms, max {per_tune_ms.max():.1f} ms (target <= 20 ms)")


if __name__ == "__main__":
    main()
