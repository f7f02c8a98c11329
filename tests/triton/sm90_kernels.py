"""A kernel compiled for an H100/H200 (sm_90) on any machine: Triton ships ptxas, and compiling needs no GPU.

It imports torch as kernel modules do; a compile worker must not load it
to compile this kernel.
"""

from __future__ import annotations

import torch  # noqa: F401  deferred in a compile worker until used
import triton
import triton.language as tl


@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + 2 * y, mask=mask)
