"""Imported once by the compile workers' fork server, so that every worker it forks inherits the work.

Triton keys its cache with a hash of its own shared library (about 500 MB),
computed once per process: 0.4 s on a quiet core, more when fourteen fresh
workers read the same file at once. Hashed here, before the server forks,
it costs each worker nothing. torch is deferred, not imported: a worker
compiles without it, and loads it only if a kernel's module uses it on
import. Nothing here touches a device: forking after CUDA is initialised is
unsafe, forking after hashing a file is not.
"""

import sys

import triton  # noqa: F401

from .compile_pool import defer_import, set_up_specializer_without_torch, warm_triton_key

if "torch" not in sys.modules:
    set_up_specializer_without_torch()
    defer_import("torch")
warm_triton_key()
