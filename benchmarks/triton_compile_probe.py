"""Where a cold R1 of the live Triton backend spends its time (a probe, not a benchmark).

On a GPU:  python3 benchmarks/triton_compile_probe.py rmsnorm   (or mm_skinny_bf16, ...)

Prints one JSON line: the pool's start, each phase of a worker's first job
(device, stream, kernel import, warm-up compile), a second batch on the same
workers, a cold pool running 12 jobs end to end, and 12 configs compiled in
1, 4 and 12 threads of this process (fresh Triton caches). It drove the
changes described in docs/benchmarks.md (issue 7). Run against a commit
before those changes, it shows the CUDA context each worker created.
"""

import json
import multiprocessing.forkserver
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

T0 = time.perf_counter()


def now():
    return round(time.perf_counter() - T0, 3)


import torch
import triton

IMPORT_S = now()
from fasta_sm.triton import compile_pool, zoo
from fasta_sm.triton.backend import TritonBackend
from fasta_sm.triton.record import spread


def probe(job):
    t = {}
    s = time.perf_counter()
    from triton.runtime import driver
    from triton.runtime.cache import triton_key

    t["key_cached"] = triton_key.cache_info().currsize
    s = time.perf_counter()
    dev = driver.active.get_current_device()
    t["device"] = time.perf_counter() - s
    s = time.perf_counter()
    driver.active.get_current_stream(dev)
    t["stream"] = time.perf_counter() - s
    s = time.perf_counter()
    fn = compile_pool.resolve(job.module, job.qualname)
    t["resolve"] = time.perf_counter() - s
    s = time.perf_counter()
    fn.warmup(*job.args, grid=(1,), **job.kwargs)
    t["warmup"] = time.perf_counter() - s
    t["pid"] = os.getpid()
    return t


def fresh_cache_dir():
    d = tempfile.mkdtemp()
    os.environ["TRITON_CACHE_DIR"] = d
    triton.knobs.cache.dir = d


def fresh_cache(spec):
    d = tempfile.mkdtemp()
    os.environ["TRITON_CACHE_DIR"] = d
    triton.knobs.cache.dir = d
    spec.fn.device_caches.clear()


def main():
    fresh_cache_dir()
    out = {}
    spec = zoo.ZOO[sys.argv[1]]()
    spec.configs = spread(spec.configs, 150)
    args = spec.make_args("cuda")
    torch.cuda.synchronize()
    backend = TritonBackend(spec.fn, args, spec.grid, spec.kwargs)
    cfgs = spec.configs[::12][:12]
    jobs = backend._jobs(cfgs)
    out["args_ready"] = now()
    # 1. pool start alone
    pool = compile_pool.CompilePool()
    s = time.perf_counter()
    pool.start()
    out["pool_start_s"] = round(time.perf_counter() - s, 3)
    # 2. first jobs on warm workers (probe each phase)
    s = time.perf_counter()
    futs = [pool._get().submit(probe, j) for j in jobs]
    res = [f.result() for f in futs]
    out["r1_probe_wall_s"] = round(time.perf_counter() - s, 3)
    out["r1_probe"] = {
        k: [round(r[k], 3) for r in res] for k in ("key_cached", "device", "stream", "resolve", "warmup")
    }
    # 3. second batch on the same (now used) workers
    cf2 = spec.configs[6::12][:12]
    j2 = backend._jobs(cf2)
    s = time.perf_counter()
    res2 = [f.result() for f in [pool._get().submit(probe, j) for j in j2]]
    out["second_batch_wall_s"] = round(time.perf_counter() - s, 3)
    out["second_probe_warmup"] = [round(r["warmup"], 3) for r in res2]
    # 4. parent loads what workers compiled (launcher build etc)
    loads = []
    for c in cfgs:
        t1 = time.perf_counter()
        backend._load(c, 0.0)
        loads.append(round(time.perf_counter() - t1, 3))
    out["parent_load_s"] = loads
    pool.close()
    multiprocessing.forkserver._forkserver._stop()
    # 5. cold pool + run() end to end (as a tune's R1), fresh cache
    fresh_cache(spec)
    pool = compile_pool.CompilePool()
    s = time.perf_counter()
    list(pool.run(backend._jobs(cf2)))
    out["cold_pool_run_12_s"] = round(time.perf_counter() - s, 3)
    pool.close()
    multiprocessing.forkserver._forkserver._stop()
    # 6. parent-thread compile of 12 configs, 1 vs 12 threads, fresh caches
    for n in (1, 4, 12):
        fresh_cache(spec)
        cf = spec.configs[(n % 11) :: 12][:12]
        s = time.perf_counter()
        with ThreadPoolExecutor(n) as ex:
            outs = list(ex.map(lambda c: backend._load(c, 0.0), cf))
        out[f"parent_threads_{n}_s"] = round(time.perf_counter() - s, 3)
        out[f"parent_threads_{n}_errors"] = sum(o.error is not None for o in outs)
    out["import"] = IMPORT_S
    print(json.dumps(out))


if __name__ == "__main__":
    main()
