"""How often a live fasta tune picks a config within 2 % of the exhaustive tune's, over seeds (issue 7, item 5).

The command of record tunes each kernel once per method, so "chosen kernel
within 2 %" there is one draw per run. Here, in one process per kernel: one
exhaustive tune (`fasta_sm.autotune(policy="exhaustive")`), then `--seeds`
fasta tunes, each in a fresh state dir with the compile pool up and Triton's
cache warm (what is measured is the pick, not the wall time), then every
distinct pick timed the same way, the picks in turn, `--pick-repeats` times
(median). A pick's regret is against the exhaustive tune's pick, as in the
command of record, and against the fastest pick of all.

On the H200:   python3 benchmarks/live_seeds.py --kernels mm_skinny_bf16 add_gelu --seeds 10 --json $OUT/seeds.json
On a CPU:      TRITON_INTERPRET=1 python benchmarks/live_seeds.py --small --seeds 2
(--small: tiny shapes and few configs, host-clock timing; figures meaningless.)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_env import device_or_exit, scratch  # noqa: E402
from triton_autotune import close_pool, cold, load, make_do_bench, time_picks  # noqa: E402


def run_kernel(name: str, opts: argparse.Namespace) -> dict:
    import fasta_sm
    from fasta_sm.triton.autotune import to_fasta_config, to_triton_config
    from fasta_sm.triton.backend import TritonBackend
    from fasta_sm.triton.fork_server import interpreting

    spec = load(name, opts.small, opts.max_configs)
    args = spec.make_args("cpu" if interpreting() else "cuda")
    key = [k for k in spec.shape if isinstance(spec.shape[k], int) and k in spec.fn.arg_names]
    configs = [to_triton_config(c) for c in spec.configs]
    do_bench = make_do_bench(opts.warmup_ms, opts.rep_ms)

    def tuned(policy: str, seed: int):
        state_dir = tempfile.mkdtemp(prefix="fasta-seeds-")
        kernel = fasta_sm.autotune(configs, key=key, do_bench=do_bench, policy=policy, seed=seed,
                                   state_dir=state_dir)(spec.fn)
        start = time.perf_counter()
        kernel[spec.grid](*args, **spec.kwargs)
        result = next(iter(kernel.results.values()))
        return to_fasta_config(kernel.best_config), time.perf_counter() - start, result.state

    cold(spec.fn)
    reference, exhaustive_s, _ = tuned("exhaustive", 0)
    runs = []
    for seed in range(opts.seed_start, opts.seed_start + opts.seeds):
        picked, wall_s, state = tuned("fasta", seed)
        runs.append({"seed": seed, "config": picked, "wall_s": round(wall_s, 3),
                     "measured": state.measured_count(), "timings": state.evaluations()})
    close_pool()
    backend = TritonBackend(spec.fn, args, spec.grid, spec.kwargs, do_bench=do_bench)
    medians, spreads = time_picks(backend, [reference, *(run["config"] for run in runs)], opts.pick_repeats)
    fastest = min(medians.values())
    against = medians[reference.identity]
    for run in runs:
        us = medians[run["config"].identity]
        run.update(config=run["config"].label(), us=round(us, 3),
                   regret_vs_exhaustive_pct=round(100 * (us - against) / against, 2),
                   regret_vs_fastest_pct=round(100 * (us - fastest) / fastest, 2))
    within = [run["regret_vs_exhaustive_pct"] <= 2.0 for run in runs]
    return {
        "kernel": spec.name,
        "N": len(configs),
        "exhaustive": {"config": reference.label(), "us": round(against, 3), "wall_s": round(exhaustive_s, 3),
                       "spread_pct": round(spreads[reference.identity], 2)},
        "fastest_pick_us": round(fastest, 3),
        "within_2pct_of_exhaustive": f"{sum(within)}/{len(within)}",
        "runs": runs,
    }


def seed_options(parser: argparse.ArgumentParser, max_configs: int, max_configs_help: str) -> None:
    """The options of a live run over seeds (this script's and benchmarks/live_prior.py's)."""
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--seed-start", type=int, default=0)
    parser.add_argument("--max-configs", type=int, default=max_configs, help=max_configs_help)
    parser.add_argument("--warmup-ms", type=float, default=10.0)
    parser.add_argument("--rep-ms", type=float, default=40.0)
    parser.add_argument("--pick-repeats", type=int, default=7)
    parser.add_argument("--small", nargs="?", type=int, const=12, default=0,
                        help="tiny shapes and at most N configs (default 12), for the CPU interpreter")
    parser.add_argument("--json", default=None, help="write the results here (after each kernel)")


def each_kernel(opts: argparse.Namespace, run: Callable[[str, argparse.Namespace], dict]) -> Iterator[dict]:
    """`run` on each of `--kernels` in turn, each result written to `--json` (with those before) as it comes."""
    rows = []
    for name in opts.kernels:
        rows.append(run(name, opts))
        if opts.json:
            Path(opts.json).write_text(json.dumps({"argv": sys.argv, "kernels": rows}, indent=1))
        yield rows[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", default=["mm_skinny_bf16"])
    seed_options(parser, 150, "an evenly spread subset, as in the command")
    opts = parser.parse_args()
    device_or_exit("live_seeds.py")
    for row in each_kernel(opts, run_kernel):
        print(f"{row['kernel']:22s} N={row['N']:4d}  exhaustive pick {row['exhaustive']['us']:9.3f} us  "
              f"fasta within 2 %: {row['within_2pct_of_exhaustive']}  regrets "
              f"{sorted(run['regret_vs_exhaustive_pct'] for run in row['runs'])}", flush=True)


if __name__ == "__main__":
    with scratch("live_seeds"):
        main()
