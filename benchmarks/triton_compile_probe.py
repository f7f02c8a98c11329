"""Where a cold R1 of the live Triton backend spends its time (a probe, not a benchmark).

On a GPU:  python3 benchmarks/triton_compile_probe.py rmsnorm   (or mm_skinny_bf16, ...)

Prints one JSON line: the pool's start, each phase of a worker's first job
(device, stream, kernel import, warm-up compile), a second batch on the same
workers, a cold pool running 12 jobs end to end, and 12 configs compiled in
1, 4 and 12 threads of this process (fresh Triton caches); and what the fork
server's own start costs, step by step, in a fresh interpreter (`import
torch` dominates: 4.5-5.5 s on the H200 machine). It drove the
changes described in docs/benchmarks.md (issue 7). Run against a commit
before those changes, it shows the CUDA context each worker created.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from bench_env import device_or_exit, scratch

T0 = time.perf_counter()


def now():
    return round(time.perf_counter() - T0, 3)


import torch
import triton

IMPORT_S = now()
from fasta_sm.triton import compile_pool, fork_server, worker, zoo
from fasta_sm.triton.backend import TritonBackend
from fasta_sm.triton.record import spread


def seconds(call):
    """(result, seconds) of one call."""
    start = time.perf_counter()
    result = call()
    return result, time.perf_counter() - start


def probe(job):
    """In a worker: how long each step of its first job takes."""
    from triton.runtime import driver
    from triton.runtime.cache import triton_key

    t = {"key_cached": triton_key.cache_info().currsize, "pid": os.getpid()}
    dev, t["device"] = seconds(driver.active.get_current_device)
    _, t["stream"] = seconds(lambda: driver.active.get_current_stream(dev))
    fn, t["resolve"] = seconds(lambda: worker.resolve(job.module, job.qualname))
    args = [worker.stand_in(arg) for arg in job.args]
    _, t["warmup"] = seconds(lambda: fn.warmup(*args, grid=(1,), **job.kwargs))
    return t


def fresh_cache(spec=None):
    """A new, empty Triton cache dir for this process and the workers it starts; the kernel's memory cache cleared."""
    path = tempfile.mkdtemp()
    os.environ["TRITON_CACHE_DIR"] = path
    triton.knobs.cache.dir = path
    if spec is not None:
        spec.fn.device_caches.clear()


def stop_pool(pool):
    pool.close()
    fork_server.stop_fork_server()


FRESH_INTERPRETER = r"""
import json, time
steps, start = {}, time.perf_counter()
def step(name):
    global start
    steps[name] = round(time.perf_counter() - start, 3)
    start = time.perf_counter()
import torch; step("import torch")
import triton; step("import triton")
from triton.runtime.cache import triton_key
triton_key(); step("triton_key")
from triton.runtime import driver
driver.active.get_current_target(); step("driver and target")
print(json.dumps(steps))
"""


def fresh_interpreter_steps():
    """What a fork server pays before its first fork (and a spawned worker before its first job)."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", FRESH_INTERPRETER], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel", choices=sorted(zoo.ZOO), help="a kernel of the zoo")
    kernel = parser.parse_args().kernel
    device_or_exit("triton_compile_probe.py", interpreter=False)
    fresh_cache()
    out = {}
    spec = zoo.ZOO[kernel]()
    spec.configs = spread(spec.configs, 150)
    args = spec.make_args("cuda")
    torch.cuda.synchronize()
    backend = TritonBackend(spec.fn, args, spec.grid, spec.kwargs)
    first, second = spec.configs[::12][:12], spec.configs[6::12][:12]
    out["args_ready"] = now()

    def probe_batch(pool, configs):
        return seconds(lambda: [f.result() for f in [pool._get()[0].submit(probe, j) for j in backend._jobs(configs)]])

    # 1. the pool's start alone; 2. first jobs on warm workers, each step timed
    pool = compile_pool.CompilePool()
    _, out["pool_start_s"] = seconds(pool.start)
    res, out["r1_probe_wall_s"] = probe_batch(pool, first)
    out["r1_probe"] = {
        k: [round(r[k], 3) for r in res] for k in ("key_cached", "device", "stream", "resolve", "warmup")
    }
    # 3. a second batch on the same (now used) workers
    res, out["second_batch_wall_s"] = probe_batch(pool, second)
    out["second_probe_warmup"] = [round(r["warmup"], 3) for r in res]
    # 4. the parent loads what the workers compiled
    out["parent_load_s"] = [round(seconds(lambda c=c: backend._load(c, 0.0))[1], 3) for c in first]
    stop_pool(pool)
    # 5. a cold pool running 12 jobs end to end, as a tune's R1 did before in-process compiles
    fresh_cache(spec)
    pool = compile_pool.CompilePool()
    _, out["cold_pool_run_12_s"] = seconds(lambda: list(pool.run(backend._jobs(second))))
    stop_pool(pool)
    # 6. 12 configs compiled in 1, 4 and 12 threads of this process, fresh caches
    for n in (1, 4, 12):
        fresh_cache(spec)
        configs = spec.configs[(n % 11) :: 12][:12]
        with ThreadPoolExecutor(n) as ex:
            outs, out[f"parent_threads_{n}_s"] = seconds(
                lambda ex=ex, configs=configs: list(ex.map(lambda c: backend._load(c, 0.0), configs))
            )
        out[f"parent_threads_{n}_errors"] = sum(o.error is not None for o in outs)
    out["import"] = IMPORT_S
    out["fresh_interpreter"] = [fresh_interpreter_steps() for _ in range(2)]
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    with scratch("triton_compile_probe"):
        main()
