"""One BLAS thread for the policy's small linear algebra.

The ridge fits multiply matrices of tens of rows, just past the size at
which OpenBLAS hands a product to its thread pool. Waking those threads
costs more than the product, and on a machine whose cores are busy (a
loaded 2-core CI box) the caller spins while it waits for them: the
refine calls took two to three times as long (docs/benchmarks.md, "Policy
overhead"; on the H200's 16 cores it made no difference). Running the
policy on one BLAS thread changes no decision on the shipped tables.

BLAS thread counts are process-wide, and OpenBLAS does not reliably take
a new count from a thread other than the main one once it has run there,
so only a policy call on the main thread sets the limit: elsewhere it
could be left on for good. While the limit is on, BLAS products in other
threads of the process (numpy's) also run on one thread.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

from threadpoolctl import ThreadpoolController

_depth = 0


@functools.cache
def _blas_libraries() -> tuple[Any, ...]:
    """Found once: finding the loaded libraries walks the process's shared objects (about a millisecond)."""
    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """On the main thread, run the block with every loaded BLAS library on one thread; elsewhere, as it is.

    The libraries' own setters, not threadpoolctl's `limit`: a call costs
    about 13 µs rather than 60, and the policy is called about twenty times
    a tune.
    """
    global _depth
    if threading.current_thread() is not threading.main_thread() or _depth:
        yield
        return
    restore = [(library, library.get_num_threads()) for library in _blas_libraries()]
    _depth = 1
    try:
        for library, threads in restore:
            if threads != 1:
                library.set_num_threads(1)
        yield
    finally:
        _depth = 0  # first: a setter that raises must not leave every later call unlimited
        for library, threads in restore:
            if threads != 1:
                library.set_num_threads(threads)
