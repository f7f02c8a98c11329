"""Compile ahead: idle workers compile the configs the policy ranks next, all through a tune.

A guided round times three configs in about 0.15 s, but a config compiled
only once it is picked keeps the round waiting 0.3-1 s for it. The machine
offers a ranked list of untried configs as each batch starts compiling and
again while it is timed; between offers, every guess that finishes hands its
worker the next config on the list, so the workers a batch does not need
compile ahead the whole time, not just at the offers. A later `compile` of a
guessed config waits on that work instead of starting it again.

The same list also carries certain work: the configs of a large batch beyond
the chunk being compiled. Those may take every idle worker, and each compile
of the chunk that finishes frees one (`release`), so a batch of 150 compiles
without a pause at each chunk's slowest config.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Container, Sequence
from concurrent.futures import Future
from typing import Any

from .compile_pool import CompilePool
from .worker import CompileJob, describe_error

logger = logging.getLogger("fasta_sm.triton.prefetch")

SPARE = 4
"""Workers guesses leave free (at most half the pool), so the next batch's compiles seldom queue behind them."""


class GuessList:
    """The ranked list of compiles to start, and the rule for how many may start now.

    Kept apart from the pool so that `benchmarks/live_sim.py` models the
    prefetcher with these very rules on a virtual clock.
    """

    def __init__(self) -> None:
        self.wanted: deque = deque()
        self.certain = 0
        self.reserve = 0

    def replace(self, ranked: Sequence[tuple[str, Any]], started: Container[str], reserve: int, certain: int) -> None:
        """Take a new list (best first), less what has started; its first `certain` entries are certain work."""
        fresh = [(position, item) for position, item in enumerate(ranked) if item[0] not in started]
        self.wanted = deque(item for _, item in fresh)
        self.certain = sum(position < certain for position, _ in fresh)
        self.reserve = reserve

    def remove(self, key: str) -> None:
        """`key` is being compiled for the tune itself: no later top-up starts it."""
        for position, (wanted, _) in enumerate(self.wanted):
            if wanted == key:
                del self.wanted[position]
                if position < self.certain:
                    self.certain -= 1
                return

    def release(self) -> bool:
        """One reserved compile finished; False when none was reserved."""
        if self.reserve == 0:
            return False
        self.reserve -= 1
        return True

    def clear(self) -> None:
        self.wanted.clear()
        self.certain = 0

    def may_start(self, workers: int, busy: int) -> bool:
        """Whether the next entry may take a worker: certain work any idle one, a guess only past the spare ones."""
        idle = workers - self.reserve - busy
        spare = max(0, min(SPARE, workers // 2) - self.reserve)
        return bool(self.wanted) and idle > (0 if self.certain else spare)

    def pop(self) -> tuple[str, Any]:
        self.certain = max(0, self.certain - 1)
        return self.wanted.popleft()


class Prefetcher:
    """Guesses in flight for one backend, keyed by config identity."""

    def __init__(self, pool: CompilePool) -> None:
        self.pool = pool
        self._lock = threading.Lock()
        self._started: dict[str, Future] = {}
        self._list = GuessList()

    def offer(self, ranked: Sequence[tuple[str, CompileJob]], reserve: int = 0, certain: int = 0) -> None:
        """Replace the list (best first) and start as many as idle workers allow.

        The first `certain` entries are compiles the tune will ask for: they
        may use every worker not reserved. The others are guesses, which also
        leave `SPARE` workers free. `reserve` workers are kept for compiles
        about to be asked for; `release` frees them one by one. A pool still
        starting gets nothing: submitting to it would block the caller until
        the fork server is up.
        """
        if not self.pool.ready:
            return
        with self._lock:
            self._list.replace(ranked, self._started, reserve, certain)
        self._top_up()

    def release(self) -> None:
        """One compile of those reserved finished: its worker may take the next entry."""
        with self._lock:
            if not self._list.release():
                return
        self._top_up()

    def take(self, key: str) -> Future | None:
        """The guess for `key`, if one was started; the caller awaits it, or compiles `key` itself, from now on.

        Either way `key` leaves the list, so that no later top-up starts it a
        second time.
        """
        with self._lock:
            self._list.remove(key)
            return self._started.pop(key, None)

    def adopt(self, key: str, future: Future) -> None:
        """A compile the tune stopped waiting for (`compile_first`): kept as a started guess until taken.

        It holds the worker reserved for it, now counted among the guesses' busy ones.
        """
        with self._lock:
            self._list.remove(key)
            self._list.release()
            self._started[key] = future
        future.add_done_callback(self._guess_done)

    def cancel(self) -> None:
        """Start no more guesses and drop those not yet running (a finished tune needs none)."""
        with self._lock:
            self._list.clear()
            started, self._started = self._started, {}
        for future in started.values():
            future.cancel()

    def _top_up(self) -> None:
        with self._lock:
            workers = self.pool.workers
            busy = sum(not future.done() for future in self._started.values())
            while self._list.may_start(workers, busy):
                key, job = self._list.pop()
                if key in self._started:
                    continue
                try:
                    future = self.pool.try_submit(job)
                except Exception as error:  # noqa: BLE001  a guess that cannot start costs nothing
                    logger.debug("no more guesses: %s", describe_error(error))
                    future = None
                if future is None:  # the pool is closed, broken, starting or isolating a crash
                    self._list.clear()
                    return
                self._started[key] = future
                busy += 1
                future.add_done_callback(self._guess_done)

    def _guess_done(self, future: Future) -> None:
        """The worker that finished takes the next guess.

        This runs on the executor's own result thread, which may hold the
        executor's locks; the next guess is submitted from a thread of its own.
        A guess that failed with the pool (a dead worker) starts nothing: the
        pool is being replaced, and the next offer starts afresh.
        """
        if future.cancelled() or future.exception() is not None:
            return
        threading.Thread(target=self._top_up, name="fasta-prefetch", daemon=True).start()
