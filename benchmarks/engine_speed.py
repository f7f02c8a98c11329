"""Engine speed: checkpoint write and load, transition overhead, memory per tune.

    python benchmarks/engine_speed.py            # N = 100, 1,000, 10,000; prints a markdown table

For each N (configs in the tune's list), on a realistic finished state (every
config compiled and timed, one round over all of them with a prediction per
config, a few failures, an RNG state):

- pack: `pack_state` (state → msgpack bytes).
- write: `StateStore.write` (temp file, write, fsync file, rename, fsync dir).
- checkpoint: pack + write, what the machine does after every step.
- load cold: `StateStore.read` (read, unpack, validate, build the TuneState) in a
  process that has not seen this config list before (first load, measured in a
  fresh subprocess for each repeat).
- load warm: the same once the process has decoded this config list (reloads:
  rollback, `fasta-sm ls`, a waiter reusing a DONE state).
- transition: one trigger (`compile`, `benchmark`, `refine`) fired through the
  shared `transitions` machine with its handler and checkpoint stubbed out,
  i.e. trigger lookup, condition checks, callback dispatch, state change.
- step, no-op backend: a whole step of a tune whose backend does nothing and
  whose checkpoint writes nothing (handler + pack, no I/O); chunks of
  max(16, N/50) configs.
- memory per tune: tracemalloc over K tunes started on the shared machine
  (state, policy, last checkpoint blob, machine registration).

Medians over repeats; times in µs unless marked.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from fasta_sm.config import Config
from fasta_sm.machine import Tune, shared_machine
from fasta_sm.policies import make_policy
from fasta_sm.protocols import BenchmarkOutcome, CompileOutcome
from fasta_sm.state import RoundRecord, TuneState, encode_rng, pack_state
from fasta_sm.store import StateStore

TARGETS = {"write_ms_1000": 2.0, "load_ms_1000": 1.0, "transition_us": 50.0}


def make_configs(n: int) -> list[Config]:
    return [
        Config({"BLOCK_M": 16 << (i % 4), "BLOCK_N": 16 << ((i // 4) % 4), "BLOCK_K": 32 << ((i // 16) % 3),
                "GROUP_M": 1 + i // 48}, num_warps=2 << (i % 3), num_stages=2 + (i // 3) % 3)
        for i in range(n)
    ]


def make_state(n: int, configs: list[Config] | None = None) -> TuneState:
    configs = configs or make_configs(n)
    rng = np.random.default_rng(0)
    times = (100 + 50 * rng.random(n)).tolist()
    failed = {i: "OutOfResources: out of resource: shared memory" for i in range(0, n, 17)}
    durations = {i: [t] for i, t in enumerate(times) if i not in failed}
    best = min(durations, key=lambda i: durations[i][0])
    return TuneState(
        key=f"mm:{n}", kernel="mm", configs=configs, policy="fasta", policy_params={"budget": 0.1}, seed=0,
        backend="replay mm (synthetic)", phase="DONE", round=0, step="done",
        compiled={i: 0.5 + 1e-3 * i for i in range(n) if i not in failed}, failed=failed, durations=durations,
        policy_state={"alpha": 0.1, "coef": rng.random(16).tolist()}, rng_state=encode_rng(rng),
        best=best, best_us=durations[best][0], predicted_us=(100 + 50 * rng.random(n)).tolist(),
        rounds=[RoundRecord(phase="R1", round=0, batch=list(range(n)), reason="all",
                            predicted_us=(100 + 50 * rng.random(n)).tolist(), started=1.0, finished=2.0)],
        stop_reason="budget spent",
    )


def median_us(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


COLD_LOAD = """
import sys, time
from fasta_sm.store import StateStore
path = sys.argv[1]
started = time.perf_counter()
StateStore.read(__import__("pathlib").Path(path))
print((time.perf_counter() - started) * 1e6)
"""


def cold_load_us(path: Path, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", COLD_LOAD, str(path)], capture_output=True, text=True, check=True)
        samples.append(float(out.stdout.strip()))
    return statistics.median(samples)


class NoOpBackend:
    def describe(self) -> str:
        return "no-op"

    def compile(self, configs):
        return [CompileOutcome(error=None, seconds=0.0) for _ in configs]

    def benchmark(self, configs, repeat=None):
        return BenchmarkOutcome(durations_us=[1.0] * len(configs), seconds=0.0)


class StubbedTune(Tune):
    """Handlers and checkpoint stubbed: what is left of a trigger is the machine's own work."""

    def _compile_chunk(self) -> None:
        pass

    def _benchmark_chunk(self) -> None:
        pass

    def _ask_policy(self) -> None:
        pass

    def _next_round(self) -> None:
        pass

    def _checkpoint(self) -> None:
        pass


def transition_us(configs: list[Config], repeats: int) -> dict[str, float]:
    policy = make_policy("exhaustive", configs)
    tune = StubbedTune.start("bench", "mm", configs, NoOpBackend(), policy)
    out = {}
    try:
        for step in ("compile", "benchmark", "refine"):
            tune.state.step = step
            trigger = getattr(tune, step)
            for _ in range(200):
                trigger()
            out[step] = median_us(trigger, repeats)
    finally:
        tune.close()
    return out


def step_us(configs: list[Config], chunk: int) -> float:
    """Mean wall time of a step of a whole no-op tune, no store (handler + pack, no I/O)."""
    policy = make_policy("exhaustive", configs)
    tune = Tune.start("bench", "mm", configs, NoOpBackend(), policy, chunk_size=chunk)
    steps = 0
    started = time.perf_counter()
    try:
        while not tune.state.done:
            tune.advance()
            steps += 1
    finally:
        tune.close()
    return (time.perf_counter() - started) / steps * 1e6


def memory_per_tune(configs: list[Config], count: int) -> float:
    policy_configs = configs
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tunes = [Tune.start(f"k{i}", "mm", policy_configs, NoOpBackend(), make_policy("exhaustive", policy_configs))
             for i in range(count)]
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    for tune in tunes:
        tune.close()
    return used / count


def machine_registration_bytes(count: int = 1000) -> float:
    """Memory the shared machine itself adds per model (add_model of bare objects)."""
    machine = shared_machine()

    class Bare:
        pass

    models = [Bare() for _ in range(count)]
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for model in models:
        machine.add_model(model, initial="R1")
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    for model in models:
        machine.remove_model(model)
    return used / count


def run(sizes: list[int], repeats: int, cold_repeats: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = StateStore(Path(tmp) / "states")
        for n in sizes:
            configs = make_configs(n)
            state = make_state(n, configs)
            blob = pack_state(state)
            path = store.write(state.key, blob)
            reps = max(20, repeats // max(1, n // 1000))
            pack = median_us(lambda state=state: pack_state(state), reps)
            write = median_us(lambda state=state, blob=blob: store.write(state.key, blob), reps)
            checkpoint = median_us(lambda state=state: store.write(state.key, pack_state(state)), reps)
            StateStore.read(path)
            warm = median_us(lambda path=path: StateStore.read(path), reps)
            cold = cold_load_us(path, cold_repeats)
            trans = transition_us(configs, 2000)
            step = step_us(configs, chunk=max(16, n // 50))
            count = {100: 1000, 1000: 200, 10000: 20}.get(n, max(1, 100_000 // n))
            memory = memory_per_tune(configs, count)
            rows.append({"n": n, "bytes": len(blob), "pack_us": pack, "write_us": write, "checkpoint_us": checkpoint,
                         "load_cold_us": cold, "load_warm_us": warm, "transition_us": trans, "step_us": step,
                         "tunes": count, "memory_per_tune_bytes": memory})
    return rows


def markdown(rows: list[dict], registration: float) -> str:
    lines = [
        "| N configs | state file | pack | write (fsync) | checkpoint (pack + write) | load, cold | load, warm "
        "| transition: compile / benchmark / refine | step, no-op backend | memory per tune (K tunes) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        t = r["transition_us"]
        lines.append(
            f"| {r['n']:,} | {r['bytes'] / 1024:,.0f} KiB | {r['pack_us'] / 1e3:.2f} ms "
            f"| {r['write_us'] / 1e3:.2f} ms "
            f"| {r['checkpoint_us'] / 1e3:.2f} ms | {r['load_cold_us'] / 1e3:.2f} ms "
            f"| {r['load_warm_us'] / 1e3:.2f} ms "
            f"| {t['compile']:.1f} / {t['benchmark']:.1f} / {t['refine']:.1f} µs | {r['step_us']:.0f} µs "
            f"| {r['memory_per_tune_bytes'] / 1024:,.1f} KiB ({r['tunes']:,}) |"
        )
    lines.append("")
    lines.append(f"Shared machine registration alone (`add_model` of a bare object, 1,000 models): "
                 f"{registration / 1024:.2f} KiB per tune.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--cold-repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print raw figures as JSON too")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = run(sizes, args.repeats, args.cold_repeats)
    registration = machine_registration_bytes()
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')} · {platform.processor() or platform.machine()} · "
          f"Python {platform.python_version()} · {platform.platform()}")
    print(markdown(rows, registration))
    by_n = {r["n"]: r for r in rows}
    if 1000 in by_n:
        r = by_n[1000]
        worst = max(max(row["transition_us"].values()) for row in rows)
        print()
        print(f"targets: write ≤ {TARGETS['write_ms_1000']} ms at N=1,000: {r['write_us'] / 1e3:.2f} ms "
              f"(checkpoint incl. pack {r['checkpoint_us'] / 1e3:.2f} ms); "
              f"load ≤ {TARGETS['load_ms_1000']} ms at N=1,000: cold {r['load_cold_us'] / 1e3:.2f} ms, "
              f"warm {r['load_warm_us'] / 1e3:.2f} ms; transition ≤ {TARGETS['transition_us']:.0f} µs: "
              f"worst {worst:.1f} µs")
    if args.json:
        print(json.dumps({"rows": rows, "registration_bytes": registration}, indent=1))


if __name__ == "__main__":
    main()
