"""The tests' kernels, compiled for an H100/H200 (sm_90) on any machine: Triton ships ptxas, compiling needs no GPU.

This module imports torch as kernel modules do; a compile worker must not
load it to compile the kernel.
"""

from __future__ import annotations

import torch  # noqa: F401  deferred in a compile worker until used
import triton
import triton.language as tl
from kernels import accumulate_kernel

__all__ = ["accumulate_kernel", "tile_dot_kernel"]


@triton.jit
def tile_dot_kernel(a_ptr, b_ptr, c_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One tile of a matmul with a pipelined K loop: its shared memory grows with the tile and the stages."""
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * BLOCK_N + rn[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * BLOCK_N + rn[None, :], acc)
