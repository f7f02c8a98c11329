"""A warm start in a fresh process: the seconds `fasta_sm.autotune` spends before the first launch.

A child process tunes the tests' kernel over 150 configs (exhaustive; on the
GPU when there is one, else under Triton's interpreter) into a state dir; then each of `--runs`
fresh processes decorates the same kernel and times the lookup of its first
call (`Autotuner._tune`: the DONE state, the config list) and all that
fasta-sm does before Triton's own first launch (the lookup, the tuning key
and the kernel's source hash, taken at the first launch). The benchmark
in `triton_autotune.py` times a second decorator in the same process, which
has every module already imported; this one does not.

    python benchmarks/warm_start.py [--runs 7] [--device auto|cpu|cuda] [--profile 30]

`--profile N` adds one fresh process whose first call runs under cProfile
and prints, of all that comes before Triton's own launch, its N costliest
functions by cumulative time: where the milliseconds go on a machine where
they run long.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_env import device_or_exit, scratch

CHILD = r"""
import os, sys, time
if sys.argv[4] == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, sys.argv[3])
import torch, triton, fasta_sm
from kernels import accumulate_kernel, grid
configs = [triton.Config({"BLOCK": b}, num_warps=w, num_stages=s)
           for b in (16, 32, 64, 128, 256, 512) for w in (1, 2, 4, 8, 16) for s in (1, 2, 3, 4, 5)]
kernel = fasta_sm.autotune(configs, key=["n"], reset_to_zero=["out_ptr"], state_dir=sys.argv[1],
                           policy="exhaustive")(accumulate_kernel)
x, out = torch.randn(1000, device=sys.argv[4]), torch.zeros(1000, device=sys.argv[4])
if sys.argv[2] == "lookup":
    tune, seconds = kernel._tune, []
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return tune(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)
    kernel._tune = timed
    run, entered = kernel.fn.run, []
    def launch(*args, **kwargs):
        entered.append(time.perf_counter())
        return run(*args, **kwargs)
    kernel.fn.run = launch
if sys.argv[2].startswith("profile"):
    import cProfile, pstats
    profile, run = cProfile.Profile(), kernel.fn.run
    def launch(*args, **kwargs):
        profile.disable()
        return run(*args, **kwargs)
    kernel.fn.run = launch
    profile.enable()
    kernel[grid](x, out, 1000, 2.0)
    rows = sorted(pstats.Stats(profile).stats.items(), key=lambda item: -item[1][3])
    print(f"{'cum ms':>8} {'own ms':>8} {'calls':>6}  function")
    for (path, line, name), (_, calls, own, cum, _) in rows[:int(sys.argv[2][len("profile"):])]:
        print(f"{cum * 1e3:8.3f} {own * 1e3:8.3f} {calls:6d}  {path}:{line}({name})")
    sys.exit()
start = time.perf_counter()
kernel[grid](x, out, 1000, 2.0)
if sys.argv[2] == "lookup":
    print(seconds[0] * 1e3, (entered[0] - start) * 1e3)
"""


def child(state_dir: str, step: str, kernels: str, device: str) -> str:
    """Run one step in a fresh interpreter; its stdout, or its stderr in the error."""
    done = subprocess.run([sys.executable, "-c", CHILD, state_dir, step, kernels, device], capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {step} process failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: the GPU if torch sees one, else the interpreter")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="one more fresh process: its first call's N costliest functions under cProfile")
    opts = parser.parse_args()
    device = opts.device
    if device == "cuda":
        device_or_exit("warm_start.py --device cuda", interpreter=False)
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    kernels = str(Path(__file__).resolve().parent.parent / "tests" / "triton")
    state_dir = tempfile.mkdtemp(prefix="fasta-warm-")
    child(state_dir, "tune", kernels, device)
    runs = []
    for run in range(opts.runs):  # each as it ends: a run cut short by a time limit keeps the processes it timed
        lookup, before = (float(ms) for ms in child(state_dir, "lookup", kernels, device).split()[-2:])
        runs.append((lookup, before))
        print(f"process {run + 1}: lookup {lookup:.2f} ms, all of fasta-sm's part {before:.2f} ms", flush=True)
    for name, times in (("lookup (_tune)", [lookup for lookup, _ in runs]),
                        ("all of fasta-sm's part (key, source hash, lookup)", [before for _, before in runs])):
        print(f"fresh-process {name} before the first launch, 150 configs, {device}, {opts.runs} processes: "
              f"median {statistics.median(times):.2f} ms, min {min(times):.2f}, max {max(times):.2f}")
    if opts.profile:
        print(child(state_dir, f"profile{opts.profile}", kernels, device))


if __name__ == "__main__":
    with scratch("warm_start"):
        main()
