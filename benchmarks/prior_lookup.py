"""The first lookup of earlier tunes for a new key: `earlier_winners` over a state dir of many finished tunes.

One replay tune of TABLE is finished, then copied under `--tunes` − 1 other
keys, each over its own order of the config list (as `prune_configs_by`
per shape would leave it, so that no two lists have the same bytes); a
fresh process then times `earlier_winners` for a new key, which reads
every one of them once.

    python benchmarks/prior_lookup.py [--table transpose_fp32] [--tunes 500]
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.bench import table_paths
from fasta_sm.config import configs_hash
from fasta_sm.state import pack_state
from fasta_sm.store import StateStore
from fasta_sm.tuner import tune

LOOKUP = r"""
import sys, time
from fasta_sm.backends.replay import load_table
from fasta_sm.prior import earlier_winners
from fasta_sm.store import StateStore
table = load_table(sys.argv[1])
started = time.perf_counter()
picks = earlier_winners(StateStore(sys.argv[2]), "new-key", "k", table.configs, "another backend")
print(f"{time.perf_counter() - started:.3f} {len(picks)}")
"""


def write_tunes(table_path: Path, directory: Path, count: int) -> None:
    """`count` finished tunes of kernel "k", the first tuned, the others its copies over reordered lists."""
    table = load_table(table_path)
    store = StateStore(directory)
    state = tune("key-0", "k", table.configs, ReplayBackend(table), store=store).state
    n = len(state.configs)
    for copy in range(1, count):
        moved = copy % n
        order = [i for i in range(n) if i != moved] + [moved]
        where = {old: new for new, old in enumerate(order)}
        configs = [state.configs[i] for i in order]
        reordered = dataclasses.replace(
            state,
            key=f"key-{copy}",
            configs=configs,
            configs_hash=configs_hash(configs),
            durations={where[i]: t for i, t in state.durations.items()},
            compiled={where[i]: s for i, s in state.compiled.items()},
            failed={where[i]: e for i, e in state.failed.items()},
            best=where[state.best],
        )
        store.write(reordered.key, pack_state(reordered))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default="transpose_fp32", help="a shipped table's name")
    parser.add_argument("--tunes", type=int, default=500)
    args = parser.parse_args()
    shipped = table_paths(Path(__file__).parents[1] / "fasta_sm" / "data" / "tables")
    table_path = next(p for p in shipped if p.stem == args.table)
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch) / "states"
        write_tunes(table_path, directory, args.tunes)
        done = subprocess.run([sys.executable, "-c", LOOKUP, str(table_path), str(directory)],
                              capture_output=True, text=True, check=True)
        seconds, picks = done.stdout.split()
    print(f"{args.table}: first lookup over {args.tunes} finished tunes, each over its own list order: "
          f"{seconds} s ({picks} configs offered)")


if __name__ == "__main__":
    main()
