"""A kernel edited and reloaded in this process after a worker compiled it: the worker must compile the new text.

Run without TRITON_INTERPRET, with TRITON_CACHE_DIR set to an empty folder and
the folder to write the kernel's module in as the argument. Prints (JSON) the
worker's error for one config under the first version of the kernel, which
refuses it, then under the edited version, which does not, then under a
version the worker cannot import (a constexpr global changed here after import).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import textwrap
from pathlib import Path

SOURCE = textwrap.dedent('''
    import triton
    import triton.language as tl

    LIMIT = tl.constexpr({limit})


    @triton.jit
    def edited_kernel(x_ptr, n, BLOCK: tl.constexpr):
        tl.static_assert(BLOCK <= LIMIT)
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) + 1, mask=offsets < n)
''')

if __name__ == "__main__":
    folder = Path(sys.argv[1])
    sys.path.insert(0, str(folder))
    module = folder / "edited_kernels.py"
    module.write_text(SOURCE.format(limit=64))

    import edited_kernels
    from triton.backends.compiler import GPUTarget

    from fasta_sm.triton.compile_pool import CompilePool
    from fasta_sm.triton.worker import CompileJob, TensorArg, kernel_key, tuning_triton_key

    def job() -> CompileJob:
        return CompileJob("edited_kernels", "edited_kernel", (TensorArg("torch.float32"), 4096),
                          {"BLOCK": 128, "num_warps": 4, "num_stages": 1}, GPUTarget("cuda", 90, 32),
                          tuning_triton_key(), str(folder), kernel_key=kernel_key(edited_kernels.edited_kernel))

    pool = CompilePool(1)
    try:
        first = pool.submit(job()).result(120)
        module.write_text(SOURCE.format(limit=1024))  # the program fixes its kernel and reloads it
        stat = module.stat()
        os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))  # a new mtime for the reload
        importlib.invalidate_caches()
        importlib.reload(edited_kernels)
        edited = pool.submit(job()).result(120)
        import triton.language as tl

        edited_kernels.LIMIT = tl.constexpr(256)  # no import in a worker makes this version
        edited_kernels.edited_kernel.hash = None
        changed = pool.submit(dataclasses.replace(job())).result(120)
    finally:
        pool.close()
    print(json.dumps({
        "first": first.error,
        "edited": edited.error,
        "changed": changed.error,
        "changed_unavailable": changed.unavailable,
    }))
