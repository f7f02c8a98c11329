"""Build the states/ corpus: real state files at every position, with their renderings.

Run it only to ADD files for a new schema or position; files already in states/
are never rewritten (that is the point of a compatibility corpus):

    python tests/states/build_corpus.py [--tables DIR] [--out states]

Each file comes from a replay tune of a recorded table, stopped at a chosen
position, and is written next to its `fasta-sm show --json` rendering.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from fasta_sm.backends.replay import ReplayBackend, ReplayTable, load_table
from fasta_sm.data import table_path
from fasta_sm.protocols import BenchmarkOutcome
from fasta_sm.render import state_to_json
from fasta_sm.state import TuneState
from fasta_sm.store import StateStore
from fasta_sm.tuner import open_tune

Stop = Callable[[TuneState], bool]


class FailingAfter(ReplayBackend):
    """Replays faithfully, then returns a NaN timing: a broken timer, as seen in the wild."""

    def __init__(self, table: ReplayTable, good_calls: int) -> None:
        super().__init__(table, noise=True, seed=0)
        self.good_calls = good_calls

    def benchmark(self, configs, repeat=None) -> BenchmarkOutcome:
        if self.good_calls == 0:
            return BenchmarkOutcome(durations_us=[float("nan")] * len(configs), seconds=0.0)
        self.good_calls -= 1
        return super().benchmark(configs, repeat)


class CompilesOn(ReplayBackend):
    """Hands back one config of each compile call (its last), the others still compiling: as the live
    Triton backend's `compile_first` does when that one finishes first."""

    def compile_first(self, configs):
        return {len(configs) - 1: self.compile([configs[-1]])[0]}


def snapshot(table: ReplayTable, out: Path, name: str, *, stop: Stop | None = None, policy: str = "fasta",
             backend: ReplayBackend | None = None, configs=None,
             prepare: Callable[[StateStore, str], None] | None = None, chunk_size: int = 16, seed: int = 0) -> None:
    """Tune `table` in a scratch store until `stop` (or DONE), then keep the file and its rendering."""
    target = out / f"{name}.fsm"
    if target.exists():
        print(f"kept    {target} (corpus files are never rewritten)")
        return
    with tempfile.TemporaryDirectory() as scratch:
        store = StateStore(scratch)
        key = f"corpus/{name}"
        if prepare is not None:
            prepare(store, key)
        tune = open_tune(store, key, table.kernel, configs or table.configs,
                         backend or ReplayBackend(table, noise=True, seed=seed), policy=policy, seed=seed,
                          chunk_size=chunk_size)
        assert not isinstance(tune, TuneState)
        try:
            tune.drive(until=stop)
        except Exception as exc:  # the error is the point of some snapshots: it is in the file
            print(f"        {name}: stopped by {type(exc).__name__}: {exc}")
        finally:
            tune.close()
        shutil.copyfile(store.file_for(key), target)
    state = StateStore.read(target)
    target.with_suffix(".json").write_text(json.dumps(state_to_json(state), indent=2, sort_keys=True) + "\n")
    print(f"wrote   {target}: {state.position()}")


def build(tables: Path | None, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    load = (lambda name: load_table(tables / f"{name}.json")) if tables else (lambda name: load_table(table_path(name)))
    matmul = load("mm_bf16_gelu_4096")
    snapshot(matmul, out, "v1-r1-compile", stop=lambda s: True)
    snapshot(matmul, out, "v1-r1-benchmark", stop=lambda s: s.step == "benchmark" and len(s.round_done) > 0,
             chunk_size=4)
    snapshot(matmul, out, "v1-r2-compile", stop=lambda s: s.phase == "R2")
    snapshot(matmul, out, "v1-r2-benchmark", stop=lambda s: s.phase == "R2" and s.round >= 2 and s.step == "benchmark")
    snapshot(matmul, out, "v1-done-with-failures")
    snapshot(matmul, out, "v1-done-exhaustive", policy="exhaustive")
    snapshot(matmul, out, "v1-handler-error", backend=FailingAfter(matmul, good_calls=3))

    def corrupt_first(store: StateStore, key: str) -> None:
        store.file_for(key).write_bytes(b"\x93truncated")

    snapshot(matmul, out, "v1-restarted-after-quarantine", prepare=corrupt_first)
    small = load("softmax_fp32")
    snapshot(small, out, "v1-coverage-done", configs=small.configs[:: max(1, len(small.configs) // 10)][:10])
    snapshot(load("attention_fwd_fp16_d64"), out, "v1-done-polish-rules")
    snapshot(matmul, out, "v1-done-retime-contenders", seed=36)
    snapshot(matmul, out, "v1-r2-benchmark-compiling", backend=CompilesOn(matmul, noise=True, seed=0),
             stop=lambda s: s.phase == "R2" and s.step == "benchmark" and any(i not in s.compiled for i in s.pending))
    # schema 2: the same states, each file ending with its crc32
    snapshot(matmul, out, "v2-r2-benchmark", stop=lambda s: s.phase == "R2" and s.round >= 2 and s.step == "benchmark")
    snapshot(matmul, out, "v2-done-with-failures")
    # the stop says how re-timing ended, and the final predictions come from a refit on every timing
    snapshot(matmul, out, "v2-done-retime-cut")

    # schema 3: `carried_taken` names the results a tune took from the one it superseded
    def tuned_without_the_last_24(store: StateStore, key: str) -> None:
        tune = open_tune(store, key, matmul.kernel, matmul.configs[:-24], ReplayBackend(matmul, noise=True, seed=0),
                         policy="fasta", seed=0)
        try:
            tune.drive()
        finally:
            tune.close()

    snapshot(matmul, out, "v3-done-carried", prepare=tuned_without_the_last_24)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=Path, default=None, help="Directory of tables (default: the shipped ones).")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "states")
    args = parser.parse_args()
    build(args.tables, args.out)


if __name__ == "__main__":
    main()
