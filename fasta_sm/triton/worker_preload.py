"""Imported once by the compile workers' fork server, so that every worker it forks inherits the work.

It imports Triton, and defers torch rather than importing it: a worker
compiles without it, and loads it only if a kernel's module uses it on
import. Workers forked from it do not run the tuning process's main script
again (`skip_main_in_workers`). It does not hash Triton's library for the
cache key (0.4 s): each job brings the tuning process's key. Nothing here
touches a device: forking after CUDA is initialised is unsafe.
"""

import sys

import triton  # noqa: F401

from .worker import defer_import, set_up_specializer_without_torch, skip_main_in_workers

skip_main_in_workers()

if "torch" not in sys.modules:
    set_up_specializer_without_torch()
    defer_import("torch")
