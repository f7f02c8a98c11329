"""Locks that a forked child gets afresh.

A child forked while another thread of its parent held a lock inherits it
held, and no thread of the child will ever release it: the child's first
tune would wait forever, holding its own key's state-file lock meanwhile.
Data loaders and process pools fork at any moment, so every lock a tune
takes is one of these.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType


class ForkSafeLock:
    """A `threading.Lock` (used only as a context manager) that is unheld in a forked child."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._lock.release()
