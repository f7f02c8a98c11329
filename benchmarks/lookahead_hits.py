"""How much of the next guided batch the lookahead names, against the surrogate's ranking alone.

Usage: python benchmarks/lookahead_hits.py [--tables DIR] [--seeds 10] [--seed-start 0] [--guesses 9]

A backend that compiles ahead compiles the first guesses it is offered
(`fasta_sm/lookahead.py`). For every guided round of fasta tunes replayed
with noise, this script asks, as the machine does once the round before is
decided, which configs the next round is likely to pick, and counts how many
of the batch the next round really picked were among the first `--guesses`
(default 9) of them, and among as many untried configs the model predicts
fastest. The first guided batch is guessed while R1 is timed: the same count
for the guesses made with 8 and with 4 of R1's configs left to time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.bench import table_paths
from fasta_sm.data import tables_dir
from fasta_sm.lookahead import likely_next
from fasta_sm.machine import Tune
from fasta_sm.policies import make_policy

R1_LEFT = (8, 4)


def _untried(state) -> set[int]:
    return set(range(state.n_configs)) - set(state.compiled) - set(state.failed) - set(state.pending)


def hits(path: Path, seeds: range, guesses: int) -> dict[str, list[int]]:
    """Per kind of guess, [configs of the next batch among the guesses, configs of the batch]."""
    table = load_table(path)
    counts = {"lookahead": [0, 0], "ranking": [0, 0], **{f"R1, {left} left": [0, 0] for left in R1_LEFT}}
    for seed in seeds:
        tune = Tune.start(key=f"lookahead/{table.kernel}/{seed}", kernel=table.kernel, configs=table.configs,
                          backend=ReplayBackend(table, noise=True, seed=seed),
                          policy=make_policy("fasta", table.configs, {}), policy_params={}, seed=seed,
                          chunk_size=len(table.configs), benchmark_chunk=1)
        guessed: dict[object, list[int]] = {}  # by the round whose successor it guesses, or ("R1", configs left)
        try:
            while not tune.state.done:
                state = tune.state
                if state.phase == "R1" and state.step == "benchmark":
                    left = len(state.untimed())
                    if left in R1_LEFT and ("R1", left) not in guessed:
                        guessed["R1", left] = likely_next(state, tune.policy, tune._rng)[:guesses]
                if state.phase == "R2" and not state.retime and state.step == "compile" and state.round not in guessed:
                    untried = _untried(state)
                    order = np.argsort(np.asarray(state.predicted_us), kind="stable")
                    guessed[state.round] = likely_next(state, tune.policy, tune._rng)[:guesses]
                    guessed[("ranking", state.round)] = [int(i) for i in order if int(i) in untried][:guesses]
                tune.advance()
        finally:
            tune.close()
        guided = {r.round: r.batch for r in tune.state.rounds if r.phase == "R2" and not r.retime}
        for round_, batch in guided.items():
            if round_ - 1 in guessed:
                for kind, key in (("lookahead", round_ - 1), ("ranking", ("ranking", round_ - 1))):
                    counts[kind][0] += len(set(batch) & set(guessed[key]))
                    counts[kind][1] += len(batch)
        if 1 in guided:
            for left in R1_LEFT:
                if ("R1", left) in guessed:
                    counts[f"R1, {left} left"][0] += len(set(guided[1]) & set(guessed["R1", left]))
                    counts[f"R1, {left} left"][1] += len(guided[1])
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=Path, default=tables_dir())
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--seed-start", type=int, default=0)
    parser.add_argument("--guesses", type=int, default=9)
    args = parser.parse_args()
    seeds = range(args.seed_start, args.seed_start + args.seeds)
    kinds = ["lookahead", "ranking", *(f"R1, {left} left" for left in R1_LEFT)]
    table = Table(title=f"share of each next guided batch among the first {args.guesses} guesses "
                        f"({args.seeds} seeds from {args.seed_start})")
    table.add_column("kernel")
    for kind in kinds:
        table.add_column(kind, justify="right")
    total = {kind: [0, 0] for kind in kinds}
    for path in table_paths(args.tables):
        counts = hits(path, seeds, args.guesses)
        for kind in kinds:
            total[kind][0] += counts[kind][0]
            total[kind][1] += counts[kind][1]
        table.add_row(load_table(path).kernel, *(_share(counts[kind]) for kind in kinds))
    table.add_row("all kernels", *(_share(total[kind]) for kind in kinds), end_section=True)
    Console().print(table)


def _share(count: list[int]) -> str:
    return f"{count[0] / count[1]:.2f}" if count[1] else "-"


if __name__ == "__main__":
    main()
