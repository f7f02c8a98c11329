"""torch.compile on a transformer block and an MLP (bf16, CUDA): default vs max-autotune vs fasta-sm.

Each variant runs in its own process with a fresh Inductor cache (and, for
fasta-sm, a fresh state dir), so compile and autotune costs are paid in full:

  default         torch.compile()
  fasta-sm        torch.compile() with fasta_sm.inductor.enable() (rich tile space, FASTA tune)
  pw-autotune     max_autotune_pointwise + coordinate descent, GEMMs on cuBLAS (the same kernels fasta-sm tunes)
  max-autotune    torch.compile(mode="max-autotune-no-cudagraphs")  (GEMM templates + coordinate descent)
  fasta-sm+gemm   fasta-sm for pointwise/reductions, Inductor's GEMM template autotuning (not run by default)

Measured per variant: wall time of the first call (compile + autotune),
steady-state time of one step (median over repeats, CUDA events), configs
compiled and benchmarked by Inductor's pointwise/reduction autotuners (GEMM
template autotuning is in the wall time, not in the counts), and the largest
difference from eager. One variant failing or timing out is recorded and the
others still run; the whole run keeps within --budget-s (default 510 s).

usage: python benchmarks/inductor_model.py [--out FILE] [--variants a,b] [--budget-s S] [--train]
Writes JSON to --out, else to $OUT/inductor_model.json when $OUT is set, and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_env import device_or_exit, scratch

VARIANTS = ("default", "fasta-sm", "pw-autotune", "max-autotune", "fasta-sm+gemm")
DEFAULT_VARIANTS = VARIANTS[:4]
"""In this order: the longest (GEMM autotuning) last, so a tight budget costs it, not fasta-sm."""
TIMEOUT_S = {"default": 90, "fasta-sm": 180, "pw-autotune": 150, "max-autotune": 240, "fasta-sm+gemm": 240}


# ----------------------------------------------------------------------------- child


def build_models(torch, args):
    nn = torch.nn

    class Block(nn.Module):
        """Pre-norm transformer block: attention (SDPA) and a GELU MLP, residuals."""

        def __init__(self, d: int, heads: int, ffn: int):
            super().__init__()
            self.heads = heads
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down = nn.Linear(d, ffn), nn.Linear(ffn, d)

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
            attn = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x)), approximate="tanh"))

    class MLP(nn.Module):
        def __init__(self, d: int, hidden: int):
            super().__init__()
            self.norm = nn.RMSNorm(d) if hasattr(nn, "RMSNorm") else nn.LayerNorm(d)
            self.gate, self.up, self.down = nn.Linear(d, hidden), nn.Linear(d, hidden), nn.Linear(hidden, d)

        def forward(self, x):
            h = self.norm(x)
            return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))

    torch.manual_seed(0)
    block = Block(args.d_model, args.heads, 4 * args.d_model).cuda().to(torch.bfloat16)
    mlp = MLP(args.d_model, args.mlp_hidden).cuda().to(torch.bfloat16)
    x = torch.randn(args.batch, args.seq, args.d_model, device="cuda", dtype=torch.bfloat16)
    return block, mlp, x


def count_configs(torch):
    """Count configs compiled and benchmarked by Inductor's Triton autotuners in this process.

    Compiled: compile results an autotuner holds when its launchers are first
    made (the worker's compiles) plus every compile in this process (R2,
    coordinate descent). Benchmarked: calls to `bench`.
    """
    from torch._inductor.runtime import triton_heuristics as th

    counts = {"autotuners": 0, "compiled": 0, "benchmarked": 0}
    cls = th.CachingAutotuner
    precompile, precompile_config, bench = cls.precompile, cls._precompile_config, cls.bench

    def counted_precompile(self, *a, **k):
        fresh = not self.launchers
        before = len(self.compile_results or ())
        out = precompile(self, *a, **k)
        if fresh and not k.get("warm_cache_only") and not (a and a[0]):
            counts["autotuners"] += 1
            counts["compiled"] += before
        return out

    def counted_precompile_config(self, *a, **k):
        counts["compiled"] += 1
        return precompile_config(self, *a, **k)

    def counted_bench(self, *a, **k):
        counts["benchmarked"] += 1
        return bench(self, *a, **k)

    cls.precompile, cls._precompile_config, cls.bench = counted_precompile, counted_precompile_config, counted_bench
    return counts


def steady_ms(torch, step, repeats: int = 7, iters: int = 30) -> float:
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            step()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    samples.sort()
    return samples[len(samples) // 2]


def run_child(args) -> dict:
    import torch

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="fasta-bench-inductor-"))
    counts = count_configs(torch)
    out: dict = {"variant": args.child, "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    block, mlp, x = build_models(torch, args)
    compile_kwargs: dict = {}
    if args.child == "max-autotune":
        compile_kwargs["mode"] = "max-autotune-no-cudagraphs"
    elif args.child == "pw-autotune":
        compile_kwargs["options"] = {"max_autotune_pointwise": True, "coordinate_descent_tuning": True}
    if args.child.startswith("fasta-sm"):
        import fasta_sm.inductor

        # one dir per variant: a second fasta-sm variant must not reuse the first one's finished tunes
        state_dir = os.path.join(args.state_dir or tempfile.mkdtemp(prefix="fasta-bench-states-"), args.child)
        settings = fasta_sm.inductor.enable(state_dir=state_dir, max_configs=args.max_configs)
        out["fasta_settings"] = settings.to_dict()
        if args.child == "fasta-sm+gemm":
            compile_kwargs["options"] = {"max_autotune_gemm": True}

    def model(inp):
        return mlp(block(inp))

    compiled = torch.compile(model, **compile_kwargs)
    if args.train:
        params = list(block.parameters()) + list(mlp.parameters())

        def make_step(fn):
            def step():
                loss = fn(x).float().square().mean()
                loss.backward()
                for p in params:
                    p.grad = None
            return step
    else:
        def make_step(fn):
            def step():
                with torch.no_grad():
                    return fn(x)
            return step

    torch.cuda.synchronize()
    started = time.perf_counter()
    make_step(compiled)()
    torch.cuda.synchronize()
    out["compile_autotune_s"] = time.perf_counter() - started
    out["configs"] = dict(counts)
    print(f"  [{args.child}] compiled + autotuned in {out['compile_autotune_s']:.1f} s; timing steady state",
          file=sys.stderr, flush=True)
    with torch.no_grad():
        out["max_abs_diff_vs_eager"] = float((compiled(x).float() - model(x).float()).abs().max())
    out["step_ms"] = steady_ms(torch, make_step(compiled))
    out["eager_step_ms"] = steady_ms(torch, make_step(model), repeats=3, iters=10)
    if args.child.startswith("fasta-sm"):
        out["fasta"] = fasta_summary(state_dir)
    return out


def fasta_summary(state_dir: str) -> dict:
    from fasta_sm.store import StateStore

    store = StateStore(state_dir)
    states = [store.read(p) for p in store.state_files()]
    return {
        "kernels": len(states),
        "done": sum(s.done for s in states),
        "space_configs": sum(s.n_configs for s in states),
        "compiled": sum(len(s.compiled) + len(s.failed) for s in states),
        "measured": sum(s.measured_count() for s in states),
        "timings": sum(s.evaluations() for s in states),
        "tune_compile_s": round(sum(s.cost.compile_s for s in states), 2),
        "tune_benchmark_s": round(sum(s.cost.benchmark_s for s in states), 2),
        "winner_vs_inductor_pick": [
            round(s.best_us / min(s.mean_us(i) for i in s.policy_params.get("must", []) if i in s.durations), 4)
            for s in states if s.done and any(i in s.durations for i in s.policy_params.get("must", []))
        ],
    }


# ----------------------------------------------------------------------------- parent


def run_in_own_session(cmd: list[str], env: dict, timeout_s: float) -> tuple[int | None, str]:
    """Run a child in its own session and kill the whole group afterwards (its compile workers too).

    Output goes to a file, not a pipe, so workers left behind cannot keep us
    waiting. Returns (exit status or None on timeout, stderr).
    """
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True, start_new_session=True)
        try:
            returncode = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        err.seek(0)
        return returncode, err.read()


def run_variant(name: str, args, timeout_s: float) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        result_path = handle.name
    cmd = [sys.executable, __file__, "--child", name, "--result", result_path, *args.child_args]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix=f"fasta-bench-{name}-")}
    started = time.perf_counter()
    returncode, stderr = run_in_own_session(cmd, env, timeout_s)
    wall = time.perf_counter() - started
    sys.stderr.write("".join(line + "\n" for line in stderr.splitlines() if line.startswith("  [")))
    if returncode is None:
        return {"variant": name, "error": f"timed out after {timeout_s:.0f} s", "stderr_tail": stderr[-3000:]}
    if returncode != 0:
        last = ([line for line in stderr.splitlines() if line.strip()] or ["(no output)"])[-1]
        return {"variant": name, "error": f"exit {returncode}: {last}", "stderr_tail": stderr[-3000:],
                "process_s": wall}
    result = json.loads(Path(result_path).read_text())
    result["process_s"] = wall
    return result


def table(results: list[dict]) -> str:
    rows = [f"{'variant':<14}{'compile+tune s':>15}{'step ms':>10}{'compiled':>10}{'benched':>9}  note"]
    for r in results:
        if "error" in r:
            rows.append(f"{r['variant']:<14}{'-':>15}{'-':>10}{'-':>10}{'-':>9}  {r['error'].splitlines()[0][:60]}")
            continue
        c = r["configs"]
        note = f"eager {r['eager_step_ms']:.3f} ms, max|diff| {r['max_abs_diff_vs_eager']:.3g}"
        rows.append(f"{r['variant']:<14}{r['compile_autotune_s']:>15.1f}{r['step_ms']:>10.3f}"
                    f"{c['compiled']:>10}{c['benchmarked']:>9}  {note}")
    return "\n".join(rows)


def run_variants(args) -> list[dict]:
    """Each variant in its own process, in turn, while the run's wall budget lasts."""
    deadline = time.perf_counter() + args.budget_s
    results: list[dict] = []
    for name in [v for v in args.variants.split(",") if v]:
        if name not in VARIANTS:
            results.append({"variant": name, "error": f"unknown variant; known: {', '.join(VARIANTS)}"})
            continue
        left = deadline - time.perf_counter()
        if left < 30:
            why = "run budget spent" if left < args.budget_s - 1 else "--budget-s below the 30 s a variant needs"
            results.append({"variant": name, "error": f"skipped: {why}"})
            continue
        print(f"[{time.strftime('%H:%M:%S')}] {name}: up to {min(TIMEOUT_S[name], left):.0f} s", flush=True)
        results.append(run_variant(name, args, min(TIMEOUT_S[name], left)))
        r = results[-1]
        print(f"[{time.strftime('%H:%M:%S')}] {name}: " +
              (r["error"].splitlines()[0][:200] if "error" in r else
               f"{r['compile_autotune_s']:.1f} s to compile+tune, {r['step_ms']:.3f} ms/step"), flush=True)
        if "stderr_tail" in r:
            print("\n".join(r["stderr_tail"].splitlines()[-15:]), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"any of {', '.join(VARIANTS)}")
    parser.add_argument("--budget-s", type=float, default=510.0, help="wall budget for the whole run")
    parser.add_argument("--train", action="store_true", help="time a training step (forward + backward)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--mlp-hidden", type=int, default=4096)
    parser.add_argument("--max-configs", type=int, default=64, help="fasta-sm: cap on each kernel's space")
    parser.add_argument("--state-dir",
                        help="fasta-sm: where its state files go (default: next to --out, else a temp dir)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        Path(args.result).write_text(json.dumps(run_child(args)))
        return
    out = args.out or (os.path.join(os.environ["OUT"], "inductor_model.json") if os.environ.get("OUT") else None)
    if args.state_dir is None and out:
        args.state_dir = os.path.join(os.path.dirname(os.path.abspath(out)), f"fasta-states-{int(time.time())}")
    shape = [f"--batch={args.batch}", f"--seq={args.seq}", f"--d-model={args.d_model}", f"--heads={args.heads}",
             f"--mlp-hidden={args.mlp_hidden}", f"--max-configs={args.max_configs}"]
    args.child_args = (([f"--state-dir={args.state_dir}"] if args.state_dir else []) + shape
                       + (["--train"] if args.train else []))
    device_or_exit("inductor_model.py", interpreter=False)
    with scratch("inductor_model"):
        results = run_variants(args)
    report = {
        "benchmark": "inductor_model",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "shape": {"batch": args.batch, "seq": args.seq, "d_model": args.d_model, "heads": args.heads,
                  "mlp_hidden": args.mlp_hidden, "dtype": "bf16", "train": args.train},
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "results": results,
    }
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2))
        print(f"wrote {out}")
    print(table(results))
    if all("error" in r for r in results):  # a run that measured nothing must not pass for one that did
        sys.exit("inductor_model: no variant produced a result (above)")


if __name__ == "__main__":
    main()
