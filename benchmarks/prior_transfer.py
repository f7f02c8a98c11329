"""What a tune gains from earlier tunes of the same kernel at other shapes (fasta_sm.prior), on the recorded tables.

Usage: python benchmarks/prior_transfer.py [--tables DIR ...] [--seeds 50] [--seed-start 0] [--json OUT]

Tables whose config lists are the same (one kernel recorded at several
shapes, across all the table sets given) form a family. For each seed, every
table is first tuned as a user's first shape would be: `fasta_sm.tune` in one
state dir per seed, nothing to start from, each family under one kernel name.
Then each table is tuned again, in memory as `fasta-sm bench` tunes it (same
seed, same replay noise), once plainly and once with the configs
`fasta_sm.prior.earlier_winners` reads from that state dir for it: the other
family members' finished tunes, never its own. Scores as `fasta-sm bench`
gives them: catch2 / catch5 on the recorded means, evals and cost as shares
of exhaustive.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from fasta_sm.backends.replay import ReplayBackend, ReplayTable, load_table
from fasta_sm.bench import table_paths
from fasta_sm.data import tables_dir
from fasta_sm.machine import Tune
from fasta_sm.policies import make_policy
from fasta_sm.prior import earlier_winners
from fasta_sm.store import StateStore
from fasta_sm.tuner import tune

HERE = Path(__file__).resolve().parent
DEFAULT_SETS = [tables_dir(), HERE / "tables_heldout", HERE / "tables_heldout2", HERE / "tables_heldout3"]


def _score(table: ReplayTable, seed: int, prior: list[int]) -> tuple[float, int, float]:
    """Regret %, configs benchmarked and seconds spent of one in-memory fasta tune, R1 offered `prior`."""
    n = len(table.configs)
    policy = make_policy("fasta", table.configs, {})
    policy.use_prior(prior)
    run = Tune.start(key=f"transfer/{table.kernel}/{seed}", kernel=table.kernel, configs=table.configs,
                     backend=ReplayBackend(table, noise=True, seed=seed), policy=policy, seed=seed,
                     chunk_size=n, benchmark_chunk=n)
    try:
        state = run.drive()
    finally:
        run.close()
    best = table.true_best_us
    regret = math.inf if state.best is None else 100.0 * (float(table.mean_us[state.best]) - best) / best
    return regret, state.measured_count(), state.cost.compile_s + state.cost.benchmark_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=Path, nargs="+", default=DEFAULT_SETS)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--seed-start", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    tables = {(d.name, p.stem): load_table(p) for d in args.tables for p in table_paths(d)}
    family_of: dict[tuple[str, str], str] = {}
    members: dict[frozenset, list[tuple[str, str]]] = defaultdict(list)
    for name, table in tables.items():
        members[frozenset(c.identity for c in table.configs)].append(name)
    for number, names in enumerate(members.values()):
        for name in names:
            family_of[name] = f"family{number}"

    results: dict[tuple[str, str], dict[str, list]] = {name: defaultdict(list) for name in tables}
    for seed in range(args.seed_start, args.seed_start + args.seeds):
        with tempfile.TemporaryDirectory() as scratch:
            store = StateStore(scratch)
            for name, table in tables.items():
                tune(f"{name}/{seed}", family_of[name], table.configs, ReplayBackend(table, noise=True, seed=seed),
                     seed=seed, store=store, prior=False)
            for name, table in tables.items():
                prior = earlier_winners(store, f"{name}/{seed}", family_of[name], table.configs)
                for arm, offered in (("plain", []), ("prior", prior)):
                    regret, measured, cost = _score(table, seed, offered)
                    results[name][arm].append((regret, measured, cost))
                results[name]["offered"].append(len(prior))

    def summary(name: tuple[str, str], arm: str) -> dict[str, float]:
        table, runs = tables[name], results[name][arm]
        regret = np.array([r[0] for r in runs])
        return {"catch2": float(np.mean(regret <= 2.0)), "catch5": float(np.mean(regret <= 5.0)),
                "evals_pct": float(100.0 * np.mean([r[1] for r in runs]) / len(table.configs)),
                "cost_pct": float(100.0 * np.mean([r[2] for r in runs]) / table.exhaustive_cost_s)}

    rows = []
    for name in tables:
        siblings = sum(1 for other in tables if other != name and family_of[other] == family_of[name])
        rows.append({"set": name[0], "table": name[1], "siblings": siblings,
                     "offered": float(np.mean(results[name]["offered"])),
                     "plain": summary(name, "plain"), "prior": summary(name, "prior")})
    sets = list(dict.fromkeys(name[0] for name in tables))
    overall = {s: {arm: {k: float(np.mean([r[arm][k] for r in rows if r["set"] == s]))
                         for k in ("catch2", "catch5", "evals_pct", "cost_pct")}
                   for arm in ("plain", "prior")} for s in sets}

    console = Console()
    out = Table(title=f"fasta with and without earlier tunes' winners ({args.seeds} seeds from {args.seed_start})",
                caption="catch2 / catch5 / cost %")
    for column in ("set", "table", "siblings", "offered", "plain", "prior"):
        out.add_column(column)
    for r in rows:
        cells = (f"{r[a]['catch2']:.2f} / {r[a]['catch5']:.2f} / {r[a]['cost_pct']:.1f}" for a in ("plain", "prior"))
        out.add_row(r["set"], r["table"], str(r["siblings"]), f"{r['offered']:.1f}", *cells)
    for s in sets:
        out.add_row(s, "overall", "", "",
                    *(f"{overall[s][a]['catch2']:.4f} / {overall[s][a]['catch5']:.4f} / {overall[s][a]['cost_pct']:.2f}"
                      for a in ("plain", "prior")), style="bold")
    console.print(out)
    if args.json:
        args.json.write_text(json.dumps({"seeds": [args.seed_start, args.seeds], "tables": rows, "overall": overall},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
