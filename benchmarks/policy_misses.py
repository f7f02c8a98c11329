"""Why a policy's picks miss catch2: the search never measured a config within 2 %, or the noise crowned another.

Usage: python benchmarks/policy_misses.py [--tables DIR] [--policy fasta] [--seeds 50] [--seed-start 0]

Each tune runs as `fasta-sm bench` runs it (the engine in memory, the replay
noise of its seed). A miss is *not found* when no config within 2 % of the
true best was measured, and *outtimed* when one was, but the lowest mean the
policy saw was another's; for those the timings of both are listed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.bench import table_paths
from fasta_sm.data import tables_dir
from fasta_sm.machine import Tune
from fasta_sm.policies import make_policy


def misses(path: Path, policy: str, seeds: range) -> tuple[str, int, list[str]]:
    """The kernel, its number of misses not found, and one line per outtimed miss."""
    table = load_table(path)
    near = table.true_best_us * 1.02
    not_found, outtimed = 0, []
    for seed in seeds:
        tune = Tune.start(key=f"misses/{table.kernel}/{seed}", kernel=table.kernel, configs=table.configs,
                          backend=ReplayBackend(table, noise=True, seed=seed),
                          policy=make_policy(policy, table.configs, {}), policy_params={}, seed=seed,
                          chunk_size=len(table.configs), benchmark_chunk=len(table.configs))
        try:
            state = tune.drive()
        finally:
            tune.close()
        if state.best is not None and table.mean_us[state.best] <= near:
            continue
        found = {i: len(t) for i, t in state.durations.items() if table.mean_us[i] <= near}
        if not found:
            not_found += 1
            continue
        crowned = f"#{state.best} ×{len(state.durations[state.best])}"
        outtimed.append(f"seed {seed}: {crowned} over " + ", ".join(f"#{i} ×{n}" for i, n in found.items()))
    return table.kernel, not_found, outtimed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=Path, default=tables_dir())
    parser.add_argument("--policy", default="fasta")
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--seed-start", type=int, default=0)
    args = parser.parse_args()
    seeds = range(args.seed_start, args.seed_start + args.seeds)
    table = Table(title=f"{args.policy}: catch2 misses ({args.seeds} seeds from {args.seed_start})",
                  caption="#i ×n: config i, timed n times", show_lines=True)
    for column in ("kernel", "not found", "outtimed", "outtimed runs"):
        table.add_column(column, justify="left" if column in ("kernel", "outtimed runs") else "right")
    totals = [0, 0]
    for path in table_paths(args.tables):
        kernel, not_found, outtimed = misses(path, args.policy, seeds)
        totals[0] += not_found
        totals[1] += len(outtimed)
        if not_found or outtimed:
            table.add_row(kernel, str(not_found), str(len(outtimed)), "\n".join(outtimed))
    table.add_row("all kernels", str(totals[0]), str(totals[1]), "")
    Console(width=max(Console().width, 150)).print(table)


if __name__ == "__main__":
    main()
