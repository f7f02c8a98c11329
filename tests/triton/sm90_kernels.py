"""The tests' kernel, compiled for an H100/H200 (sm_90) on any machine: Triton ships ptxas, compiling needs no GPU.

This module imports torch as kernel modules do; a compile worker must not
load it to compile the kernel.
"""

from __future__ import annotations

import torch  # noqa: F401  deferred in a compile worker until used
from kernels import accumulate_kernel

__all__ = ["accumulate_kernel"]
