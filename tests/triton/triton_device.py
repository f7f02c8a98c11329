"""Where the Triton tests run: a CUDA GPU when there is one and the interpreter is not asked for, else the CPU.

conftest.py reads this before Triton is imported, to decide whether to turn
the interpreter on; tests import it by this name (a `from conftest import`
would find whichever test directory's conftest was loaded last).
"""

from __future__ import annotations

import os

import torch

HAS_CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
DEVICE = "cuda" if HAS_CUDA else "cpu"
