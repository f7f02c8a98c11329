"""triton.autotune vs fasta_sm.autotune vs an exhaustive tune on fasta-sm's parallel backend (issue 7, items 5–6).

For each zoo kernel, in one process:
  triton     `triton.autotune` (exhaustive, compiles serially as it times),
  exhaustive `fasta_sm.autotune(policy="exhaustive")`: every config, compiled in the compile pool,
  fasta      `fasta_sm.autotune(policy="fasta")`,
  exhaustive-pool-up, fasta-pool-up (only if asked for): the same two with the compile pool
             already running, as every tune after a process's first finds it,
  exhaustive-imported, fasta-imported (only if asked for): the same two decorated
             `--import-lead` seconds before the first call, untimed, as in a program that imports
             its kernels and then builds a model (the decorator starts the fork server),
each from cold caches (a fresh Triton cache dir, a fresh state dir, a fresh compile pool, the
kernel's in-memory JIT cache cleared), then warm: a second launch of the same object, and for
fasta-sm a new decorator over the same state dir (what a second process sees). Then each
method's chosen config is timed the same way (do_bench median), the distinct picks in turn,
`--pick-repeats` times (median of those), and compared with the best.
`--crash` adds the live crash test: a child process tunes with fasta and is killed mid-R2; a
second child resumes; the script checks that no config timed before the kill is timed again
(deliberate re-time rounds excepted).

On the H200:   python3 benchmarks/triton_autotune.py --json $OUT/autotune.json --crash
On a CPU:      TRITON_INTERPRET=1 python benchmarks/triton_autotune.py --small --crash
(--small [N]: tiny shapes and at most N (12) configs per kernel, host-clock timing; figures meaningless.)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_env import device_or_exit, scratch

from fasta_sm.triton.fork_server import interpreting

SMALL_SHAPES = {
    "mm_bf16_gelu": dict(M=64, N=64, K=64), "mm_fp16": dict(M=64, N=64, K=64),
    "mm_skinny_bf16": dict(M=16, N=128, K=128), "mm_skinny_fp16": dict(M=16, N=128, K=128),
    "attention": dict(Z=1, H=1, N_CTX=256, HEAD_DIM=16), "row_sum": dict(M=33, N=1000),
    "rmsnorm": dict(M=9, N=1500), "softmax": dict(M=9, N=2100), "add_gelu": dict(M=37, N=300),
    "transpose": dict(M=70, N=90),
}
DEFAULT_KERNELS = ["mm_skinny_bf16", "attention", "row_sum", "rmsnorm"]


def load(name: str, small: int, max_configs: int = 0, shape: dict | None = None):
    """The zoo kernel; with `small`, tiny shapes and at most `small` of its configs;
    with `max_configs`, full shapes and an evenly spread subset of that many configs;
    with `shape`, at that shape instead."""
    from fasta_sm.triton import zoo
    from fasta_sm.triton.record import spread

    spec = zoo.ZOO[name](**(shape if shape is not None else SMALL_SHAPES[name] if small else {}))
    if small:
        spec.configs = [c for c in spread(spec.configs, small) if c.kwargs.get("BLOCK_M", 0) <= 64]
    elif max_configs and len(spec.configs) > max_configs:
        spec.configs = spread(spec.configs, max_configs)
    return spec


def make_do_bench(warmup_ms: float, rep_ms: float):
    """One timing method for all three tuners (the interpreter has no device clock)."""
    from fasta_sm.triton.backend import host_bench

    if interpreting():
        return lambda fn, quantiles=None: [host_bench(fn, rep_ms)] * 3
    import triton.testing

    return lambda fn, quantiles=None: triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=quantiles)


def sync() -> None:
    import torch

    if torch.cuda.is_available() and not interpreting():
        torch.cuda.synchronize()


def close_pool() -> None:
    """Close the shared compile pool once the guesses it is still compiling have landed."""
    from fasta_sm.triton import compile_pool

    if compile_pool._shared is not None:
        if compile_pool._shared._executor is not None:
            compile_pool._shared._executor.shutdown(wait=True, cancel_futures=True)
        compile_pool._shared.close()
        compile_pool._shared = None


def cold(fn, pool_up: bool = False) -> Path:
    """Empty Triton cache dir, empty in-memory JIT cache, no compile pool and no fork server yet.

    The next fasta-sm tune starts its fork server and pool inside the timed
    region: a fresh process pays that once, so the cold figures include it.
    With `pool_up`, the fork server is kept and a fresh pool is started and
    warmed here, outside the timed region: what every tune after a
    process's first sees. Its workers fork from a server that inherited the
    first cache dir, so that dir is emptied rather than replaced.
    """
    import triton

    from fasta_sm.triton import compile_pool, fork_server

    if hasattr(fn, "device_caches"):
        fn.device_caches.clear()
    close_pool()
    current = os.environ.get("TRITON_CACHE_DIR")
    if pool_up and current and fork_server.fork_server_pid() is not None:
        cache = Path(current)
        shutil.rmtree(cache)
        cache.mkdir()
    else:
        fork_server.stop_fork_server()
        cache = Path(tempfile.mkdtemp(prefix="triton-cache-"))
        os.environ["TRITON_CACHE_DIR"] = str(cache)  # inherited by the fork server, hence by the workers
        triton.knobs.cache.dir = str(cache)
    if pool_up:
        compile_pool.shared_pool().start()
    return cache


@contextlib.contextmanager
def first_launch_probe(kernel):
    """Where a second process's first launch spends its time: the lookup (`_tune`), and garbage collections."""
    probe = {"lookup_s": 0.0, "gc": [0, 0, 0]}
    tune = kernel._tune

    def timed_tune(*args, **kwargs):
        start = time.perf_counter()
        try:
            return tune(*args, **kwargs)
        finally:
            probe["lookup_s"] += time.perf_counter() - start

    def count(phase, info):
        if phase == "start":
            probe["gc"][info["generation"]] += 1

    kernel._tune = timed_tune
    gc.callbacks.append(count)
    try:
        yield probe
    finally:
        gc.callbacks.remove(count)
        del kernel._tune


def timed_launch(kernel, spec, args) -> float:
    sync()
    start = time.perf_counter()
    kernel[spec.grid](*args, **spec.kwargs)
    sync()
    return time.perf_counter() - start


def time_picks(backend, configs, repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Each distinct config's median µs over `repeats` do_bench medians, taken in turn, and their spread in %.

    One do_bench median per pick, each taken right after the last, differed
    by 1.6 % for the same config (run z), as much as the picks differ: taking
    the picks in turn, several times, puts each under the same clocks.
    """
    distinct = {config.identity: config for config in configs}
    samples: dict[str, list[float]] = {key: [] for key in distinct}
    for turn in range(repeats):
        keys = list(distinct)
        for key in keys[turn % len(keys):] + keys[: turn % len(keys)]:
            samples[key].append(backend.time_ms(distinct[key]) * 1e3)
    medians = {key: float(np.median(values)) for key, values in samples.items()}
    spreads = {key: 100 * (max(values) - min(values)) / medians[key] for key, values in samples.items()}
    return medians, spreads


def run_options(methods: list[str], small: int = 0, pick_repeats: int = 1) -> argparse.Namespace:
    """`run_kernel` options as in the command of record (150 configs, do_bench 10 + 40 ms, seed 0)."""
    return argparse.Namespace(small=small, max_configs=150, warmup_ms=10.0, rep_ms=40.0, budget=None, seed=0,
                              methods=methods, variants={}, keep_states=None, import_lead=6.0,
                              pick_repeats=pick_repeats)


def run_kernel(name: str, opts) -> dict:
    import triton

    import fasta_sm
    from fasta_sm.triton.autotune import to_fasta_config, to_triton_config
    from fasta_sm.triton.backend import TritonBackend

    spec = load(name, opts.small, opts.max_configs)
    device = "cpu" if interpreting() else "cuda"
    args = spec.make_args(device)
    key = [k for k in spec.shape if isinstance(spec.shape[k], int) and k in spec.fn.arg_names]
    configs = [to_triton_config(c) for c in spec.configs]
    do_bench = make_do_bench(opts.warmup_ms, opts.rep_ms)
    row: dict = {"kernel": spec.name, "N": len(configs)}
    chosen = {}

    def triton_decorator(state_dir):
        return triton.autotune(configs, key=key, do_bench=do_bench)(spec.fn)

    def fasta_decorator(policy, params=None):
        return lambda state_dir: fasta_sm.autotune(configs, key=key, do_bench=do_bench, policy=policy,
                                                   budget=opts.budget if policy == "fasta" else None,
                                                   seed=opts.seed, state_dir=state_dir,
                                                   policy_params=params)(spec.fn)

    methods = {"triton": triton_decorator, "exhaustive": fasta_decorator("exhaustive"),
               "fasta": fasta_decorator("fasta"), "exhaustive-pool-up": fasta_decorator("exhaustive"),
               "fasta-pool-up": fasta_decorator("fasta"), "exhaustive-imported": fasta_decorator("exhaustive"),
               "fasta-imported": fasta_decorator("fasta")}
    methods.update({name: fasta_decorator("fasta", params) for name, params in opts.variants.items()})
    for method in [*opts.methods, *opts.variants]:
        decorate = methods[method]
        cold(spec.fn, pool_up=method.endswith("-pool-up"))
        state_dir = tempfile.mkdtemp(prefix="fasta-states-")
        kernel = decorate(state_dir)
        if method.endswith("-imported"):
            time.sleep(opts.import_lead)
        cold_s = timed_launch(kernel, spec, args)
        warm_s = timed_launch(kernel, spec, args)
        entry = {"cold_s": round(cold_s, 3), "warm_s": round(warm_s, 6), "config": str(kernel.best_config)}
        if method != "triton":
            close_pool()  # a second process has no compile workers busy with the first one's guesses
            fresh = decorate(state_dir)  # what a second process builds: reads the DONE state
            with first_launch_probe(fresh) as probe:
                first = timed_launch(fresh, spec, args)
            launch = float(np.median([timed_launch(fresh, spec, args) for _ in range(20)]))
            entry["second_process_first_launch_s"] = round(first, 6)
            entry["second_process_before_launch_s"] = round(first - launch, 6)
            entry["second_process_lookup_s"] = round(probe["lookup_s"], 6)  # key and DONE state, in _tune
            entry["second_process_gc"] = probe["gc"]  # collections by generation during the first launch
            result = next(iter(kernel.results.values()))
            entry["evaluated"] = result.state.evaluations()
            entry["measured"] = result.state.measured_count()
            entry["rounds"] = [  # name, configs, wall s, compile s (summed over workers), benchmark s
                [r.name, len(r.batch),
                 round((r.finished or r.started) - r.started, 3), round(r.compile_s, 3), round(r.benchmark_s, 3)]
                for r in result.state.rounds]
            assert next(iter(fresh.results.values())).reused
            if opts.keep_states:
                for path in Path(state_dir).glob("*.fsm"):
                    shutil.copyfile(path, Path(opts.keep_states) / f"live-h200-{spec.name}-{method}.fsm")
        chosen[method] = kernel.best_config
        row[method] = entry

    backend = TritonBackend(spec.fn, args, spec.grid, spec.kwargs, do_bench=do_bench)
    picks = {m: to_fasta_config(c) for m, c in chosen.items()}
    medians, spreads = time_picks(backend, list(picks.values()), opts.pick_repeats)
    best = min(medians.values())
    for method, config in picks.items():
        us = medians[config.identity]
        row[method]["chosen_us"] = round(us, 3)
        row[method]["chosen_spread_pct"] = round(spreads[config.identity], 2)
        row[method]["regret_pct"] = round(100 * (us - best) / best, 2)
    pairs = [("fasta", "triton"), ("fasta", "exhaustive"), ("fasta-pool-up", "triton"),
             ("fasta-pool-up", "exhaustive-pool-up"), ("fasta-imported", "triton"),
             ("fasta-imported", "exhaustive-imported")]
    for variant in opts.variants:
        pool_up = variant.endswith("-pool-up")
        pairs += [(variant, "triton"), (variant, "exhaustive-pool-up" if pool_up else "exhaustive")]
    for fasta, baseline in pairs:
        if fasta in row and baseline in row:
            row[f"{fasta}_vs_{baseline}_cold"] = round(row[fasta]["cold_s"] / row[baseline]["cold_s"], 3)
    return row


def crash_child(opts) -> None:
    """Tune `opts.kernel` with fasta; log each config before timing it; die (os._exit) after `kill_after`."""
    import fasta_sm
    from fasta_sm.triton.autotune import to_triton_config
    from fasta_sm.triton.backend import TritonBackend

    spec = load(opts.kernel, opts.small, opts.max_configs)
    log = Path(opts.log)
    count = 0
    real = TritonBackend.time_ms

    def logged(self, config):
        nonlocal count
        if opts.kill_after and count >= opts.kill_after:
            os._exit(9)
        count += 1
        with log.open("a") as handle:
            handle.write(config.identity + "\n")
        return real(self, config)

    TritonBackend.time_ms = logged
    args = spec.make_args("cpu" if interpreting() else "cuda")
    key = [k for k in spec.shape if isinstance(spec.shape[k], int) and k in spec.fn.arg_names]
    kernel = fasta_sm.autotune([to_triton_config(c) for c in spec.configs], key=key, seed=opts.seed,
                               do_bench=make_do_bench(opts.warmup_ms, opts.rep_ms),
                               state_dir=opts.state_dir)(spec.fn)
    kernel[spec.grid](*args, **spec.kwargs)
    print("reused" if next(iter(kernel.results.values())).reused else "tuned", flush=True)


def crash_test(opts) -> dict:
    from fasta_sm.policies import make_policy
    from fasta_sm.store import StateStore

    spec = load(opts.crash_kernel, opts.small, opts.max_configs)
    r1 = len(make_policy("fasta", spec.configs, {}).plan(np.random.default_rng(opts.seed)).batch)
    work = Path(tempfile.mkdtemp(prefix="fasta-crash-"))
    state_dir = work / "states"
    base = [sys.executable, __file__, "--child", "--kernel", opts.crash_kernel, "--state-dir", str(state_dir),
            "--seed", str(opts.seed), "--warmup-ms", str(opts.warmup_ms), "--rep-ms", str(opts.rep_ms)]
    base += ["--small", str(opts.small)] if opts.small else []
    base += ["--max-configs", str(opts.max_configs)] if opts.max_configs else []
    kill_after = r1 + 2
    first = subprocess.run(base + ["--log", str(work / "first.log"), "--kill-after", str(kill_after)],
                           capture_output=True, text=True)
    store = StateStore(state_dir)
    (state_file,) = store.state_files()
    before = store.read(state_file)
    saved = {before.configs[i].identity for i in before.durations}
    start = time.perf_counter()
    second = subprocess.run(base + ["--log", str(work / "second.log"), "--kill-after", "0"],
                            capture_output=True, text=True)
    resume_s = time.perf_counter() - start
    after = store.read(state_file)
    retimed = {after.configs[i].identity for r in after.rounds if r.retime for i in r.batch}
    second_log = work / "second.log"
    timed_second = set(second_log.read_text().split()) if second_log.exists() else set()
    again = timed_second & saved
    in_flight = set((work / "first.log").read_text().split()) - saved  # timed, killed before its checkpoint
    return {
        "kernel": spec.name, "N": before.n_configs, "r1": r1, "killed_after_timings": kill_after,
        "killed_rc": first.returncode, "phase_at_kill": before.phase, "round_at_kill": before.position(),
        "measured_before_kill": len(saved), "resumed_rc": second.returncode, "resumed_output": second.stdout.strip(),
        "resume_wall_s": round(resume_s, 2), "done_after_resume": after.done,
        "measured_again_not_retime": len(again - retimed), "measured_again_in_retime_rounds": len(again & retimed),
        "lost_in_flight": len(in_flight), "lost_in_flight_timed_again": len(in_flight & timed_second),
        "stderr_tail": (first.stderr[-300:] + second.stderr[-300:]) if second.returncode else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", nargs="+", default=DEFAULT_KERNELS)
    parser.add_argument("--methods", nargs="+", default=["triton", "exhaustive", "fasta"],
                        choices=list(METHODS),
                        help="*-pool-up: cold caches, but the compile pool already running (a process's later "
                        "tunes); *-imported: cold, decorated --import-lead seconds before the first call")
    parser.add_argument("--import-lead", type=float, default=6.0,
                        help="seconds between decorating and calling, for the *-imported methods")
    parser.add_argument("--small", type=int, nargs="?", const=12, default=0,
                        help="tiny shapes and at most N configs (default 12) per kernel, for the CPU interpreter")
    parser.add_argument("--warmup-ms", type=float, default=25.0)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--budget", type=float, default=None, help="fasta budget fraction (default: its routing)")
    parser.add_argument("--variant", nargs=2, action="append", default=[], metavar=("NAME", "JSON"),
                        help="one more fasta method, NAME, with these policy params (a JSON object); "
                        "a NAME ending in -pool-up runs with the compile pool already up")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spare", type=int, default=None,
                        help="compile workers the guesses leave free (fasta_sm.triton.prefetch.SPARE) for this run")
    parser.add_argument("--pick-repeats", type=int, default=7,
                        help="each method's chosen config is timed this many times, the picks in turn (median)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--crash", action="store_true", help="also run the live crash test")
    parser.add_argument("--max-configs", type=int, default=0,
                        help="an evenly spread subset of each space (to fit a device call); 0: all")
    parser.add_argument("--keep-states", default=None, help="copy each fasta-sm tune's state file into this dir")
    parser.add_argument("--crash-kernel", default="rmsnorm")
    parser.add_argument("--no-tune", action="store_true", help="only the crash test")
    parser.add_argument("--full-failure-compiles", action="store_true",
                        help="give the compile workers no shared-memory limit, so that a config past it compiles "
                        "in full and fails at load, as before the workers stopped early (an A/B of that stop)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kernel", help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    parser.add_argument("--kill-after", type=int, default=0, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    opts.variants = {}
    for name, params in opts.variant:
        try:
            opts.variants[name] = json.loads(params)
        except json.JSONDecodeError as error:
            parser.error(f"--variant {name}: {params!r} is not JSON: {error}")
        if not isinstance(opts.variants[name], dict):
            parser.error(f"--variant {name}: {params!r} must be a JSON object of policy params")
        if name in METHODS or "_vs_" in name:
            parser.error(f"--variant {name}: a method of that name exists, or the name contains '_vs_'")
    if len(opts.variants) != len(opts.variant):
        parser.error("--variant: each NAME once")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if opts.child:
        crash_child(opts)
        return
    device_or_exit("triton_autotune.py")
    with scratch("triton_autotune"):
        run(opts)


def run(opts: argparse.Namespace) -> None:
    """Every tune `opts` asks for, then the crash test; results printed and written as they come."""
    from fasta_sm.triton import backend, prefetch

    if opts.spare is not None:
        prefetch.SPARE = opts.spare
    if opts.full_failure_compiles:
        backend._device_max_shared = lambda: None
    if opts.keep_states:
        Path(opts.keep_states).mkdir(parents=True, exist_ok=True)
    results: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": sys.argv, "kernels": []}
    import torch
    import triton

    results.update(device=backend.device_name(), torch=torch.__version__, triton=triton.__version__,
                   prefetch_spare=prefetch.SPARE, workers_shared_memory_limit=backend._device_max_shared())
    if not opts.no_tune:
        for name in opts.kernels:
            row = run_kernel(name, opts)
            results["kernels"].append(row)
            print(json.dumps(row), flush=True)
            if opts.json:
                Path(opts.json).write_text(json.dumps(results, indent=1))
    if opts.crash:
        results["crash"] = crash_test(opts)
        print(json.dumps(results["crash"]), flush=True)
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=1))
    print_table(results["kernels"])


METHODS = ("triton", "exhaustive", "fasta", "exhaustive-pool-up", "fasta-pool-up", "exhaustive-imported",
           "fasta-imported")
SHORT = {"triton": "t", "exhaustive": "e", "fasta": "f", "exhaustive-pool-up": "e+", "fasta-pool-up": "f+",
         "exhaustive-imported": "ei", "fasta-imported": "fi"}


def print_table(rows: list[dict]) -> None:
    """Cold seconds and regret per method, the fasta ratios, and fasta's second-process start."""
    variants = sorted({m for row in rows for m in row if isinstance(row[m], dict) and m not in METHODS})
    methods = [m for m in METHODS if any(m in row for row in rows)] + variants
    short = {**SHORT, **{v: f"v{i}" for i, v in enumerate(variants, 1)}}
    ratios = sorted({k for row in rows for k in row if k.endswith("_cold")})
    names = [short[m] for m in methods]
    ratio_names = ["/".join(short[part] for part in k[: -len("_cold")].split("_vs_")) for k in ratios]
    for variant in variants:
        print(f"{short[variant]}: {variant}")
    print(f"{'kernel':26s} {'N':>5s} " + " ".join(f"{n + ' s':>7s}" for n in names) + " "
          + " ".join(f"{n:>6s}" for n in ratio_names) + f" {'regret ' + '/'.join(names) + ' %':>24s}"
          + "  2nd proc: before / first launch ms")
    for row in rows:
        cold = " ".join(f"{row[m]['cold_s']:7.2f}" if m in row else f"{'-':>7s}" for m in methods)
        ratio = " ".join(f"{row[k]:6.3f}" if k in row else f"{'-':>6s}" for k in ratios)
        regrets = "/".join(f"{row[m]['regret_pct']:.1f}" if m in row else "-" for m in methods)
        fasta = row.get("fasta", {})
        start = "-"
        if "second_process_first_launch_s" in fasta:
            before, first = fasta["second_process_before_launch_s"], fasta["second_process_first_launch_s"]
            start = f"{before * 1e3:.2f} / {first * 1e3:.2f}"
        print(f"{row['kernel']:26s} {row['N']:5d} {cold} {ratio} {regrets:>24s}  {start}")


if __name__ == "__main__":
    main()
