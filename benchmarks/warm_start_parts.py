"""Where a warm start's milliseconds go: the parts of a finished tune's reuse before the first launch.

One zoo kernel is tuned once into a state dir; then each of `--runs` fresh
decorators of it, in the same process (as the command of record's second
decorator), launches once. Each launch is cut into the tuning key (Triton's
key plus the kernel's source hash, taken at the first launch), the lookup
(`Autotuner._tune`: the DONE state read, checked and matched to the config
list), of which the state file's read and decode, and the rest before
Triton's own `run`. Medians over the runs, in ms.

    python benchmarks/warm_start_parts.py [--kernel mm_skinny_bf16] [--max-configs 150] [--runs 15]
    TRITON_INTERPRET=1 python benchmarks/warm_start_parts.py --small   (on a CPU; figures of the interpreter)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_env import device_or_exit, scratch

PARTS = ("key", "lookup", "of which read", "rest", "before launch")


def measure(opts: argparse.Namespace) -> dict[str, list[float]]:
    import fasta_sm
    from fasta_sm.store import StateStore
    from fasta_sm.triton import zoo
    from fasta_sm.triton.autotune import to_triton_config
    from fasta_sm.triton.fork_server import interpreting
    from fasta_sm.triton.record import spread

    shape = {"mm_skinny_bf16": dict(M=16, N=128, K=128)}.get(opts.kernel, {}) if opts.small else {}
    spec = zoo.ZOO[opts.kernel](**shape)
    if opts.max_configs and len(spec.configs) > opts.max_configs:
        spec.configs = spread(spec.configs, opts.max_configs)
    args = spec.make_args("cpu" if interpreting() else "cuda")
    key = [k for k in spec.shape if isinstance(spec.shape[k], int) and k in spec.fn.arg_names]
    configs = [to_triton_config(c) for c in spec.configs]
    state_dir = tempfile.mkdtemp(prefix="fasta-states-")

    def decorated():
        return fasta_sm.autotune(configs, key=key, policy=opts.policy, state_dir=state_dir)(spec.fn)

    start = time.perf_counter()
    decorated()[spec.grid](*args, **spec.kwargs)
    print(f"{spec.name}: {len(configs)} configs, {opts.policy} tune {time.perf_counter() - start:.1f} s", flush=True)

    parts: dict[str, list[float]] = {part: [] for part in PARTS}
    read, reading = StateStore.read, []

    def timed_read(path):
        begin = time.perf_counter()
        try:
            return read(path)
        finally:
            reading.append(time.perf_counter() - begin)

    StateStore.read = staticmethod(timed_read)
    for _ in range(opts.runs):
        reading.clear()
        spans = first_launch(decorated(), spec, args)
        spans["of which read"] = sum(reading)
        for part in PARTS:
            parts[part].append(spans[part])
    StateStore.read = staticmethod(read)
    return parts


def first_launch(kernel, spec, args) -> dict[str, float]:
    """Seconds of one launch of a fresh decorator before Triton's `run`: its key, its lookup and the rest."""
    spans, entered = {"key": 0.0, "lookup": 0.0}, []

    def timed(method, part):
        def call(*a, **kw):
            begin = time.perf_counter()
            try:
                return method(*a, **kw)
            finally:
                spans[part] += time.perf_counter() - begin
        return call

    kernel.key_of, kernel._tune = timed(kernel.key_of, "key"), timed(kernel._tune, "lookup")
    run = kernel.fn.run

    def launch(*a, **kw):
        entered.append(time.perf_counter())
        return run(*a, **kw)

    kernel.fn.run = launch
    begin = time.perf_counter()
    try:
        kernel[spec.grid](*args, **spec.kwargs)
    finally:
        kernel.fn.run = run
    spans["before launch"] = entered[0] - begin
    spans["rest"] = spans["before launch"] - spans["key"] - spans["lookup"]
    return spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", default="mm_skinny_bf16")
    parser.add_argument("--policy", default="fasta")
    parser.add_argument("--max-configs", type=int, default=150)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--small", action="store_true", help="a tiny shape, for the CPU interpreter")
    opts = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    device_or_exit("warm_start_parts.py")
    with scratch("warm_start_parts"):
        parts = measure(opts)
    print(f"{'part':<16}{'median ms':>10}{'min':>8}{'max':>8}   ({opts.runs} fresh decorators)")
    for part, seconds in parts.items():
        ms = [s * 1e3 for s in seconds]
        print(f"{part:<16}{statistics.median(ms):>10.2f}{min(ms):>8.2f}{max(ms):>8.2f}")


if __name__ == "__main__":
    main()
