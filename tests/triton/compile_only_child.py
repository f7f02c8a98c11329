"""Compiles sm_90 kernels in a compile worker, then one in this process, and prints what each did (JSON).

Run without TRITON_INTERPRET, with TRITON_CACHE_DIR set to an empty folder:
the worker compiles for the target and with the cache-key prefix it is
given, with no driver, torch or GPU of its own; this process then compiles
the same launch with torch dtypes, which must find the worker's binary in
the cache under the same key. The worker also compiles a matmul tile under
a shared-memory limit below its need, under one above it (this process's
compile of it must then be a cache hit too), and another tile with no limit;
last, a job that names another cache, which its binary must land in.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    from triton.backends.compiler import GPUTarget

    from fasta_sm.triton.compile_pool import CompilePool
    from fasta_sm.triton.worker import CompileJob, CompileOnlyDriver, TensorArg, tuning_triton_key

    target = GPUTarget("cuda", 90, 32)
    launch = {"BLOCK": 256, "num_warps": 4, "num_stages": 1}
    f32 = TensorArg("torch.float32")
    pool = CompilePool(1)
    try:
        pool.start()
        job = CompileJob("sm90_kernels", "accumulate_kernel", (f32, f32, 4096, 2.0), launch, target,
                         tuning_triton_key())
        error = pool.submit(job).result(120).error
        torch_in_worker = pool.submit(CompileJob("worker_probe", "torch_probe", (), {}, target)).result(60).error
        f16 = TensorArg("torch.float16")
        tile = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}

        def tile_job(stages: int, limit: int | None) -> CompileJob:
            return CompileJob("sm90_kernels", "tile_dot_kernel", (f16, f16, f16, 4096), tile | {"num_stages": stages},
                              target, tuning_triton_key(), max_shared=limit)

        over_error = pool.submit(tile_job(3, 1024)).result(120).error
        over_files = sorted(path.suffix for path in Path(os.environ["TRITON_CACHE_DIR"]).rglob("tile_dot_kernel.*"))
        under_error = pool.submit(tile_job(3, 232448)).result(120).error
        no_limit_error = pool.submit(tile_job(2, None)).result(120).error  # after a limit, in the same worker
        elsewhere = Path(os.environ["TRITON_CACHE_DIR"] + "_elsewhere")  # a cache set after the pool started
        pool.submit(CompileJob("sm90_kernels", "accumulate_kernel", (f32, f32, 4096, 2.0), launch | {"BLOCK": 128},
                               target, tuning_triton_key(), cache_dir=str(elsewhere))).result(120)
        elsewhere_cubins = sorted(path.name for path in elsewhere.rglob("*.cubin"))
    finally:
        pool.close()
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    compiled = sorted(path.name for path in cache.rglob("*.cubin"))
    entries_before = sorted(path.name for path in cache.iterdir())

    import torch
    from sm90_kernels import accumulate_kernel, tile_dot_kernel
    from triton.runtime.driver import driver

    driver.set_active(CompileOnlyDriver(target))
    kernel = accumulate_kernel.warmup(torch.float32, torch.float32, 4096, 2.0, grid=(1,), **launch)
    tile_kernel = tile_dot_kernel.warmup(torch.float16, torch.float16, torch.float16, 4096, grid=(1,), **tile)
    print(json.dumps({
        "worker_error": error,
        "over_limit_error": over_error,
        "over_limit_files": over_files,
        "under_limit_error": under_error,
        "no_limit_error": no_limit_error,
        "tile_shared": tile_kernel.metadata.shared,
        "torch_in_worker": torch_in_worker,
        "cubins": compiled,
        "elsewhere_cubins": elsewhere_cubins,
        "new_cache_entries": sorted(set(path.name for path in cache.iterdir()) - set(entries_before)),
        "parent_hash": kernel.hash,
    }))
