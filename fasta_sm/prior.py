"""What earlier tunes of a kernel found fast, for a new tune of it to start from.

A kernel is tuned once per key value (a shape, a dtype): each is its own
tune, but the fast configs of one shape are often fast at the next. When a
tune starts, the tuner hands its policy the fastest configs of the finished
tunes of the same kernel in the same state dir, and a policy that takes them
(`TakesPrior`) puts them in R1. They are read once: R1 is in the tune's first
checkpoint, so a resumed tune never asks again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .config import Config
from .env import env_switch
from .errors import StateFileError
from .fork_safe import ForkSafeLock
from .state import FinishedTune
from .store import StateStore

log = logging.getLogger("fasta_sm.prior")

PER_TUNE = 3
"""How many of each earlier tune's fastest configs (of those the new tune's list holds) are offered."""

PRIOR_SWITCH = "FASTA_SM_PRIOR"
"""Set to a no (0, false, no, off) to start every tune from its own sample alone."""


@dataclass
class _Entry:
    stamp: tuple[int, int, int]  # the file's mtime, size and inode when read
    kernel: str | None
    decoded: bool = False
    finished: FinishedTune | None = None


_entries: dict[Path, _Entry] = {}
"""Per state file: the kernel it names and, once a tune of that kernel asked, its finished tune (or None). A file is
read once per process while it stays as it is, and decoded whole only for the kernel being tuned."""

_entries_lock = ForkSafeLock()
"""Threads that start tunes at once (Inductor's compile threads) share `_entries`: one reads a file, the others wait
for what it found rather than see it half-read."""
if hasattr(os, "register_at_fork"):  # a child forked mid-read starts from the files again
    os.register_at_fork(after_in_child=_entries.clear)


def earlier_winners(
    store: StateStore, key: str, kernel: str, configs: Sequence[Config], backend: str | None = None
) -> list[int]:
    """Indices in `configs` of the fastest configs of `kernel`'s finished tunes under other keys.

    Each tune offers its `PER_TUNE` fastest among the configs `configs`
    holds. Tunes measured the way `backend` describes (the same device and
    Triton, for a live tune) come first, then the most recently finished (as
    its state records it, not its file's mtime, which a copied state dir
    loses); each tune's fastest before any tune's second: the policy may
    take only the first few. A file that cannot be read is passed over (it
    is another tune's to set aside), and read again next time where the
    failure may pass.
    """
    index = {config.identity: i for i, config in enumerate(configs)}
    found: list[FinishedTune] = []
    with _entries_lock:
        for path in store.state_files():
            try:
                stat = path.stat()
                finished = _finished(path, (stat.st_mtime_ns, stat.st_size, stat.st_ino), kernel)
            except OSError as exc:
                log.debug("prior: passing over %s for now (%s)", path, exc)
                continue
            if finished is not None and finished.key != key:
                found.append(finished)
    found.sort(key=lambda finished: (finished.backend == backend, finished.finished_at), reverse=True)
    offered = [[index[c.identity] for c in finished.fastest if c.identity in index][:PER_TUNE] for finished in found]
    picks: dict[int, None] = {}
    for rank in range(PER_TUNE):
        for fastest in offered:
            if rank < len(fastest):
                picks.setdefault(fastest[rank])
    return list(picks)


def _finished(path: Path, stamp: tuple[int, int, int], kernel: str) -> FinishedTune | None:
    """The finished tune of `kernel` in `path` (None if it holds another kernel's, an unfinished or an invalid one).

    OSError (StateDirError among them) when the file cannot be read for now: nothing is remembered of it then.
    """
    entry = _entries.get(path)
    if entry is None or entry.stamp != stamp:
        entry = _Entry(stamp, StateStore.read_kernel(path))
        _entries[path] = entry
    if entry.kernel != kernel:
        return None
    if not entry.decoded:
        try:
            entry.finished = StateStore.read_finished(path)
        except StateFileError as exc:
            log.debug("prior: passing over %s (%s)", path, exc)
        entry.decoded = True
    return entry.finished


def prior_enabled() -> bool:
    """Whether new tunes start from earlier tunes' winners (`FASTA_SM_PRIOR`, on unless set to a no)."""
    return env_switch(PRIOR_SWITCH, default=True)
