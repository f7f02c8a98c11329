"""What the replay noise allows: catch2 / catch5 of exhaustive tunes that time every config k times, or race.

Usage: python benchmarks/noise_ceiling.py [--tables DIR] [--seeds 50] [--seed-start 0] [--repeats 1 2 3 5]
                                          [--races 3x5 10x20]

`fasta-sm bench` scores a pick by its recorded mean, while every policy,
exhaustive included, sees noisy timings (`ReplayBackend(noise=True)`, the
same draws a bench run with that seed gets). This script times every config
that runs k times, crowns the lowest mean of its k timings, and scores the
pick as the bench does; its cost is compile plus k benchmarks per config,
over the exhaustive tune's one. A race `MxR` times every config once, then
the M fastest by that timing R times more, and crowns the lowest mean among
them: what
re-timing can do for a policy that has measured everything.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from fasta_sm.backends.replay import BENCH_OVERHEAD_S, ReplayBackend, load_table
from fasta_sm.bench import table_paths
from fasta_sm.data import tables_dir


def noisy_exhaustive(
    path: Path, seeds: range, plans: list[tuple[int, int, int]]
) -> tuple[str, list[tuple[float, float, float]]]:
    """Per plan (k timings of every config, then R more of the M fastest): (catch2, catch5, cost %)."""
    table = load_table(path)
    runs = [i for i, error in enumerate(table.errors) if error is None]
    mean, best = table.mean_us, table.true_best_us
    scores = []
    for k, m, r in plans:
        picks = []
        for seed in seeds:
            backend = ReplayBackend(table, noise=True, seed=seed)
            estimate = {i: np.mean([backend.timing(i, j) for j in range(k)]) for i in runs}
            raced = sorted(runs, key=estimate.get)[:m] or runs
            for i in raced[:m]:
                estimate[i] = np.mean([backend.timing(i, j) for j in range(k + r)])
            picks.append(mean[min(raced, key=estimate.get)])
        regret = (np.array(picks) - best) / best
        timings = k * len(runs) + min(m, len(runs)) * r
        cost = float(np.sum(table.compile_s)) + BENCH_OVERHEAD_S * timings
        scores.append((float(np.mean(regret <= 0.02)), float(np.mean(regret <= 0.05)),
                       100.0 * cost / table.exhaustive_cost_s))
    return table.kernel, scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=Path, default=tables_dir())
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--seed-start", type=int, default=0)
    parser.add_argument("--repeats", type=int, nargs="+", default=[1, 2, 3, 5])
    parser.add_argument("--races", nargs="*", default=["3x5", "10x20"], help="MxR: R more timings of the M fastest")
    args = parser.parse_args()
    seeds = range(args.seed_start, args.seed_start + args.seeds)
    plans = [(k, 0, 0) for k in args.repeats] + [(1, *map(int, race.split("x"))) for race in args.races]
    labels = [f"k={k}" for k in args.repeats] + [f"race {race}" for race in args.races]
    rows = [noisy_exhaustive(path, seeds, plans) for path in table_paths(args.tables)]

    title = f"Exhaustive under the replay noise, catch2 / catch5 ({args.seeds} seeds from {args.seed_start})"
    table = Table(title=title,
                  caption="race MxR: every config timed once, then the M fastest R times more")
    table.add_column("kernel", no_wrap=True)
    for label in labels:
        table.add_column(label, justify="right", no_wrap=True)
    for kernel, scores in rows:
        table.add_row(kernel, *(f"{c2:.2f} / {c5:.2f}" for c2, c5, _ in scores))
    overall = [(np.mean([s[p][0] for _, s in rows]), np.mean([s[p][1] for _, s in rows]),
                np.mean([s[p][2] for _, s in rows])) for p in range(len(plans))]
    table.add_row("overall", *(f"{c2:.4f} / {c5:.4f}" for c2, c5, _ in overall), end_section=True)
    table.add_row("cost %", *(f"{cost:.1f}" for _, _, cost in overall))
    Console(width=max(Console().width, 150)).print(table)


if __name__ == "__main__":
    main()
