"""What a live tune gains from an earlier tune of the kernel at another shape (fasta_sm.prior), over seeds.

`benchmarks/prior_transfer.py` measures the prior on the recorded tables;
this measures it on the GPU, through `fasta_sm.autotune`. Per kernel, in one
process: one exhaustive tune of the second shape (the reference pick), then
per seed two fasta tunes of the second shape with that seed: *plain*, in an
empty state dir, and *prior*, in a state dir where the first shape was just
tuned by fasta with the same seed (so its R1 starts from that tune's
winners). The arms alternate which goes first. Triton's cache is warm after
the exhaustive tune: what is measured is the pick and the configs timed,
not the wall time. Every distinct pick is then timed the same way, the
picks in turn, `--pick-repeats` times (median), and scored against the
exhaustive tune's pick, as `benchmarks/live_seeds.py` does.

On the H200:   python3 benchmarks/live_prior.py --kernels mm_skinny_bf16 mm_fp16 --seeds 10 --json $OUT/prior.json
On a CPU:      TRITON_INTERPRET=1 python benchmarks/live_prior.py --small --seeds 2 --kernels softmax
(--small: tiny shapes and few configs, host-clock timing; figures meaningless.)
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_env import device_or_exit, scratch  # noqa: E402
from live_seeds import each_kernel, seed_options  # noqa: E402
from triton_autotune import SMALL_SHAPES, close_pool, cold, load, make_do_bench, time_picks  # noqa: E402

PAIRS = {
    "mm_skinny_bf16": (dict(M=16, N=8192, K=8192), dict(M=32, N=4096, K=14336)),
    "mm_fp16": (dict(M=2048, N=2048, K=2048), dict(M=4096, N=4096, K=4096)),
    "attention_d128": (dict(Z=2, H=8, N_CTX=8192), dict(Z=16, H=16, N_CTX=1024)),
    "softmax": (dict(M=8192, N=8192), dict(M=32768, N=2048)),
    "rmsnorm": (dict(M=16384, N=8192), dict(M=32768, N=2048)),
}
"""First shape, then the shape scored: pairs of the recorded data set (shipped and held-out tables)."""

SMALL_FIRST = {
    "mm_skinny_bf16": dict(M=32, N=128, K=128), "mm_fp16": dict(M=128, N=64, K=64),
    "attention_d128": dict(Z=1, H=1, N_CTX=128), "softmax": dict(M=5, N=1000), "rmsnorm": dict(M=5, N=700),
}
SMALL_SECOND = {**{k: SMALL_SHAPES[k] for k in ("mm_skinny_bf16", "mm_fp16", "softmax", "rmsnorm")},
                "attention_d128": dict(Z=1, H=1, N_CTX=256)}
OFFERED = re.compile(r"(\d+) that earlier tunes of the kernel found fast")


def load_pair(name: str, small: int, max_configs: int):
    """The zoo kernel at its two shapes, over one config list (an evenly spread subset where asked)."""
    from fasta_sm.triton import zoo

    first, second = (SMALL_FIRST[name], SMALL_SECOND[name]) if small else PAIRS[name]
    scored = load(name, small, max_configs, shape=second)
    return zoo.ZOO[name](**first, configs=scored.configs), scored


def run_kernel(name: str, opts: argparse.Namespace) -> dict:
    import fasta_sm
    from fasta_sm.triton.autotune import to_fasta_config, to_triton_config
    from fasta_sm.triton.backend import TritonBackend
    from fasta_sm.triton.fork_server import interpreting

    first, scored = load_pair(name, opts.small, opts.max_configs)
    device = "cpu" if interpreting() else "cuda"
    first_args, scored_args = first.make_args(device), scored.make_args(device)
    key = [k for k in scored.shape if isinstance(scored.shape[k], int) and k in scored.fn.arg_names]
    configs = [to_triton_config(c) for c in scored.configs]
    do_bench = make_do_bench(opts.warmup_ms, opts.rep_ms)

    def tuned(spec, args, policy: str, seed: int, state_dir: str) -> dict:
        kernel = fasta_sm.autotune(configs, key=key, do_bench=do_bench, policy=policy, seed=seed,
                                   state_dir=state_dir)(spec.fn)
        start = time.perf_counter()
        kernel[spec.grid](*args, **spec.kwargs)
        state = next(iter(kernel.results.values())).state
        offered = OFFERED.search(state.rounds[0].reason)
        picked = to_fasta_config(kernel.best_config)
        return {"config": picked, "wall_s": round(time.perf_counter() - start, 3),
                "measured": state.measured_count(), "offered": int(offered.group(1)) if offered else 0,
                "r1": state.rounds[0].batch}

    def plain(seed: int) -> dict:
        return tuned(scored, scored_args, "fasta", seed, tempfile.mkdtemp(prefix="fasta-plain-"))

    def with_prior(seed: int) -> dict:
        state_dir = tempfile.mkdtemp(prefix="fasta-prior-")
        earlier = tuned(first, first_args, "fasta", seed, state_dir)
        run = tuned(scored, scored_args, "fasta", seed, state_dir)
        run["first_pick"] = earlier["config"].label()
        return run

    cold(scored.fn)
    reference = tuned(scored, scored_args, "exhaustive", 0, tempfile.mkdtemp(prefix="fasta-exhaustive-"))
    runs = []
    for seed in range(opts.seed_start, opts.seed_start + opts.seeds):
        arms = {"plain": plain, "prior": with_prior}
        order = list(arms) if seed % 2 == 0 else list(reversed(arms))
        runs.append({"seed": seed, **{arm: arms[arm](seed) for arm in order}})
    close_pool()
    backend = TritonBackend(scored.fn, scored_args, scored.grid, scored.kwargs, do_bench=do_bench)
    picks = [reference["config"], *(run[arm]["config"] for run in runs for arm in ("plain", "prior"))]
    medians, spreads = time_picks(backend, picks, opts.pick_repeats)
    against = medians[reference["config"].identity]
    for run in runs:
        for arm in ("plain", "prior"):
            us = medians[run[arm]["config"].identity]
            run[arm].update(config=run[arm]["config"].label(), us=round(us, 3),
                            regret_vs_exhaustive_pct=round(100 * (us - against) / against, 2))
    summary = {}
    for arm in ("plain", "prior"):
        regrets = [run[arm]["regret_vs_exhaustive_pct"] for run in runs]
        summary[arm] = {"within_2pct": f"{sum(r <= 2.0 for r in regrets)}/{len(regrets)}",
                        "mean_regret_pct": round(mean(regrets), 2), "regrets": sorted(regrets),
                        "mean_measured": round(mean(run[arm]["measured"] for run in runs), 1),
                        "mean_offered": round(mean(run[arm]["offered"] for run in runs), 1)}
    return {
        "kernel": scored.name,
        "first_shape": first.name,
        "N": len(configs),
        "exhaustive": {"config": reference["config"].label(), "us": round(against, 3),
                       "wall_s": reference["wall_s"], "spread_pct": round(spreads[reference["config"].identity], 2)},
        **summary,
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    seed_options(parser, 0, "an evenly spread subset (default: all)")
    opts = parser.parse_args()
    device_or_exit("live_prior.py")
    for row in each_kernel(opts, run_kernel):
        print(f"{row['kernel']:34s} after {row['first_shape']:34s} N={row['N']:4d}  "
              f"exhaustive pick {row['exhaustive']['us']:9.3f} us", flush=True)
        for arm in ("plain", "prior"):
            got = row[arm]
            print(f"    {arm:5s} within 2 %: {got['within_2pct']:>5s}  mean regret {got['mean_regret_pct']:5.2f} %  "
                  f"configs timed {got['mean_measured']:5.1f}  offered {got['mean_offered']:3.1f}  "
                  f"regrets {got['regrets']}", flush=True)


if __name__ == "__main__":
    with scratch("live_prior"):
        main()
