"""Wall time of a live tune, simulated on a recorded table: the machine, the policy and its lookahead run
for real; the compile pool, the prefetcher and the device are a virtual clock.

A live fasta tune on the H200 spends most of its wall time in guided rounds
waiting for compiles the lookahead did not start in time (benchmarks/compile_waits.py).
Each change to the lookahead or the prefetcher would need a device call to
judge; this replays the same decisions against the table's recorded compile
seconds instead: `WORKERS` workers, the prefetcher's own list and rules
(`prefetch.GuessList`: `SPARE`, reserve, certain work; top-up as each guess
ends), the live backend's `compile_first` (back at the first compile done,
the rest compiling on as guesses; `--whole-chunks` models the older order,
every compile of a chunk before any timing), a timing of `--timing-ms` per
config (`--first-timing-ms` models a shorter first timing of each config
for the fasta tune, a cheap screen before full-length re-timings), and the
tuning process's own seconds (policy and lookahead) added as
they are spent. It reports wall seconds per tune, the seconds spent waiting
on compiles in guided rounds, and how the guided configs handed back stood
when asked for (done, running, never started), over seeds; also the same for the
exhaustive policy, the baseline of the live target (fasta ≤ 0.3× its wall time).

A model, not a measurement: it says which change is worth a device call,
and only the device says what a change is worth (docs/benchmarks.md, run aa).
It leaves out the pool's start, Triton's loads in the tuning process and
any contention between compiles and timings.

    python benchmarks/live_sim.py --kernels mm_skinny_bf16_m16 add_gelu_bf16 --configs 150 --seeds 20
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fasta_sm import machine
from fasta_sm.backends.replay import ReplayBackend, ReplayTable, load_table
from fasta_sm.config import Config
from fasta_sm.data import tables_dir
from fasta_sm.policies.fasta.params import LIVE_DEFAULTS
from fasta_sm.protocols import BenchmarkOutcome, CompileOutcome
from fasta_sm.store import StateStore
from fasta_sm.triton import prefetch
from fasta_sm.triton.record import spread
from fasta_sm.tuner import tune


class SimulatedLive(ReplayBackend):
    """A replay backend on a virtual clock, with a pool of workers and a prefetcher like the live backend's."""

    def __init__(self, table: ReplayTable, workers: int, timing_s: float, seed: int,
                 first_timing_s: float | None = None) -> None:
        super().__init__(table, noise=True, seed=seed)
        self.workers = workers
        self.timing_s = timing_s
        self.first_timing_s = timing_s if first_timing_s is None else first_timing_s
        self.now = 0.0
        self._real = time.perf_counter()
        self._free = [0.0] * workers  # when each worker is next free
        self._guesses: dict[str, float] = {}  # started guess -> when it is compiled
        self._list = prefetch.GuessList()
        self.waits: list[tuple[str, float, int]] = []  # per compile call: d/r/n per config, wait s, configs before
        self.asked = 0  # configs compiled so far

    # the tuning process's own seconds count as they pass
    def _enter(self) -> None:
        self.now += time.perf_counter() - self._real

    def _leave(self) -> None:
        self._real = time.perf_counter()

    def _run_until(self, moment: float) -> None:
        """Advance the clock to `moment`, letting each finished guess hand its worker the next one."""
        while True:
            done = sorted(t for t in self._guesses.values() if self.now < t <= moment)
            if not done:
                break
            self.now = done[0]
            self._top_up()
        self.now = max(self.now, moment)

    def _submit(self, at: float, seconds: float) -> float:
        start = max(at, heapq.heappop(self._free))
        heapq.heappush(self._free, start + seconds)
        return start + seconds

    def _busy_guesses(self) -> int:
        return sum(t > self.now for t in self._guesses.values())

    def _top_up(self) -> None:
        busy = self._busy_guesses()
        while self._list.may_start(self.workers, busy):
            key, config = self._list.pop()
            if key in self._guesses:
                continue
            self._guesses[key] = self._submit(self.now, float(self.table.compile_s[self.table.index_of(config)]))
            busy += 1

    def prefetch(self, configs: Sequence[Config], reserve: int = 0, certain: int = 0) -> None:
        self._enter()
        self._list.replace([(c.identity, c) for c in configs], self._guesses, reserve, certain)
        self._top_up()
        self._leave()

    def _take_or_start(self, configs: Sequence[Config]) -> tuple[list[float], list[str]]:
        """When each config's compile ends (its guess's, or one started now), and how each stood: d/r/n."""
        ends, states = [], []
        for config in configs:
            key = config.identity
            self._list.remove(key)
            if key in self._guesses:
                end = self._guesses.pop(key)
                states.append("d" if end <= self.now else "r")
            else:
                end = self._submit(self.now, float(self.table.compile_s[self.table.index_of(config)]))
                states.append("n")
            ends.append(end)
        return ends, states

    def compile(self, configs: Sequence[Config]) -> list[CompileOutcome]:
        self._enter()
        start = self.now
        ready, states = self._take_or_start(configs)
        for end in sorted(ready):
            self._run_until(end)
            self._list.release()
            self._top_up()
        self.waits.append(("".join(states), self.now - start, self.asked))
        self.asked += len(configs)
        outcomes = super().compile(configs)
        self._leave()
        return outcomes

    def compile_first(self, configs: Sequence[Config]) -> dict[int, CompileOutcome]:
        """As the live backend's: back once the first config is compiled, with every one done by then;
        the others compile on as started guesses."""
        self._enter()
        start = self.now
        ends, states = self._take_or_start(configs)
        self._run_until(min(ends))
        done = [position for position, end in enumerate(ends) if end <= self.now]
        for position, config in enumerate(configs):
            if position not in done:
                self._guesses[config.identity] = ends[position]
        for _ in configs:  # each done compile frees its reserved worker; each one compiling on holds it as a guess
            self._list.release()
        self._top_up()
        self.waits.append(("".join(states[p] for p in done), self.now - start, self.asked))
        self.asked += len(done)
        outcomes = super().compile([configs[p] for p in done])
        self._leave()
        return dict(zip(done, outcomes))

    def benchmark(self, configs: Sequence[Config], repeat: Sequence[int] | None = None) -> BenchmarkOutcome:
        self._enter()
        repeat = list(repeat) if repeat is not None else [0] * len(configs)
        self._run_until(self.now + sum(self.first_timing_s if r == 0 else self.timing_s for r in repeat))
        outcome = super().benchmark(configs, repeat)
        self._leave()
        return outcome


def simulate(table: ReplayTable, policy: str, seed: int, opts) -> dict:
    first_ms = opts.first_timing_ms if policy == "fasta" and opts.first_timing_ms else opts.timing_ms
    backend = SimulatedLive(table, opts.workers, opts.timing_ms / 1e3, seed, first_ms / 1e3)
    store = StateStore(opts.scratch / f"{table.kernel}-{policy}-{seed}-{time.monotonic_ns()}")
    params = dict(LIVE_DEFAULTS) if policy == "fasta" else {}
    params.update(opts.params if policy == "fasta" else {})
    result = tune(f"sim-{seed}", table.kernel, table.configs, backend, policy=policy, policy_params=params,
                  seed=seed, store=store)
    rounds = result.state.rounds
    r1 = len(rounds[0].batch)
    waits = [(states, wait) for states, wait, before in backend.waits if before >= r1] if policy == "fasta" else []
    picked = table.mean_us[result.best_index]
    return {
        "wall_s": backend.now + opts.pool_start_s,
        "guided_wait_s": sum(wait for _, wait in waits),
        "takes": "".join(states for states, _ in waits),
        "rounds": len(rounds),
        "regret_pct": 100 * (picked - table.true_best_us) / table.true_best_us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", default=["mm_skinny_bf16_m16", "add_gelu_bf16", "rmsnorm_bf16",
                                                          "row_sum_fp32"])
    parser.add_argument("--configs", type=int, default=150, help="an evenly spread subset, as the live benchmark")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--timing-ms", type=float, default=46.0, help="one do_bench (10 + 40 ms on the H200)")
    parser.add_argument("--first-timing-ms", type=float, default=None,
                        help="fasta only: a config's first timing takes this long (a shorter do_bench), "
                             "re-timings --timing-ms; the exhaustive baseline keeps --timing-ms")
    parser.add_argument("--pool-start-s", type=float, default=0.0, help="added to every tune (0: pool up)")
    parser.add_argument("--params", default="{}", help="fasta policy params (JSON), over the live defaults")
    parser.add_argument("--spare", type=int, default=None, help="prefetch.SPARE for this run")
    parser.add_argument("--r1-guess-untimed", type=int, default=None, help="machine.R1_GUESS_UNTIMED for this run")
    parser.add_argument("--whole-chunks", action="store_true",
                        help="model a backend without compile_first: each chunk compiles whole before any timing")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    opts.params = json.loads(opts.params)
    opts.scratch = Path("/tmp/fasta-live-sim")
    if opts.whole_chunks:
        del SimulatedLive.compile_first
    if opts.spare is not None:
        prefetch.SPARE = opts.spare
    if opts.r1_guess_untimed is not None:
        machine.R1_GUESS_UNTIMED = opts.r1_guess_untimed
    out = {
        "simulated": True,
        "note": "a model of a live tune on recorded tables (virtual clock for compiles and timings), not a measurement",
        "argv": vars(opts) | {"scratch": str(opts.scratch)},
        "kernels": {},
    }
    print("simulated wall times (a model of a live tune on recorded tables, not a measurement)")
    print(f"{'kernel':22s} {'fasta s':>8s} {'exh s':>7s} {'f/e':>6s} {'wait s':>7s} {'d/r/n %':>12s} "
          f"{'rounds':>6s} {'catch2':>6s}")
    for name in opts.kernels:
        full = load_table(tables_dir() / f"{name}.json")
        keep = [full.index_of(c) for c in spread(full.configs, opts.configs)]
        table = ReplayTable(full.kernel, [full.configs[i] for i in keep], full.compile_s[keep],
                            [full.samples_us[i] for i in keep], [full.errors[i] for i in keep], full.meta, full.source)
        runs = [simulate(table, "fasta", seed, opts) for seed in range(opts.seeds)]
        exhaustive = simulate(table, "exhaustive", 0, opts)
        takes = "".join(run["takes"] for run in runs)
        shares = "/".join(f"{100 * takes.count(s) / max(1, len(takes)):.0f}" for s in "drn")
        wall = statistics.median(run["wall_s"] for run in runs)
        row = {"fasta_wall_s": wall, "exhaustive_wall_s": exhaustive["wall_s"],
               "ratio": wall / exhaustive["wall_s"],
               "guided_wait_s": statistics.median(run["guided_wait_s"] for run in runs),
               "takes_drn_pct": shares, "rounds": statistics.median(run["rounds"] for run in runs),
               "catch2": float(np.mean([run["regret_pct"] <= 2 for run in runs])), "runs": runs}
        out["kernels"][name] = row
        print(f"{name:22s} {wall:8.2f} {exhaustive['wall_s']:7.2f} {row['ratio']:6.3f} {row['guided_wait_s']:7.2f} "
              f"{shares:>12s} {row['rounds']:6.0f} {row['catch2']:6.2f}")
    if opts.json:
        Path(opts.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
