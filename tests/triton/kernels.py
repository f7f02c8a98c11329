"""Kernels for the Triton tests: small enough for the interpreter, with a mutated output.

Importable by path so a tune can run in a child process (kill and resume).
"""

from __future__ import annotations

import triton
import triton.language as tl

import fasta_sm

CONFIGS = [
    triton.Config({"BLOCK": block}, num_warps=warps, num_stages=stages)
    for block in (16, 32, 64, 128, 256, 512)
    for warps in (1, 2, 4)
    for stages in (1, 2)
]


@triton.jit
def accumulate_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    """out += scale · x: run twice without a reset and the result is wrong."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    acc = tl.load(out_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, acc + scale * x, mask=mask)


def grid(meta):
    return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def make_tuned(state_dir: str, policy: str = "fasta", **options):
    """A fresh decorated kernel (a new Autotuner, as a new process would build)."""
    return fasta_sm.autotune(
        CONFIGS, key=["n"], reset_to_zero=["out_ptr"], policy=policy, state_dir=state_dir, **options
    )(accumulate_kernel)


class _Crash:
    """Stands in for a kernel whose compile kills the worker (a compiler segfault)."""

    def warmup(self, *args, **kwargs):
        import os

        os._exit(11)


crash_kernel = _Crash()


class _Slow:
    """Stands in for a kernel that takes `SECONDS` to compile (passed as a keyword), then is refused as a config
    too large for the device is: a config failure, recorded where it happened."""

    def warmup(self, *args, SECONDS=0.0, **kwargs):
        import time

        from triton.runtime.errors import OutOfResources

        time.sleep(SECONDS)
        raise OutOfResources(1, 0, "slow stand-in")


slow_kernel = _Slow()
