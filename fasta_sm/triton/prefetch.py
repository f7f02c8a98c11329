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
from collections.abc import Sequence
from concurrent.futures import Future

from .compile_pool import CompileJob, CompilePool, describe_error

logger = logging.getLogger("fasta_sm.triton.prefetch")

SPARE = 4
"""Workers guesses leave free (at most half the pool), so the next batch's compiles seldom queue behind them."""


class Prefetcher:
    """Guesses in flight for one backend, keyed by config identity."""

    def __init__(self, pool: CompilePool) -> None:
        self.pool = pool
        self._lock = threading.Lock()
        self._started: dict[str, Future] = {}
        self._wanted: deque[tuple[str, CompileJob]] = deque()
        self._certain = 0
        self._reserve = 0

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
            fresh = [(position, item) for position, item in enumerate(ranked) if item[0] not in self._started]
            self._wanted = deque(item for _, item in fresh)
            self._certain = sum(position < certain for position, _ in fresh)
            self._reserve = reserve
        self._top_up()

    def release(self) -> None:
        """One compile of those reserved finished: its worker may take the next entry."""
        with self._lock:
            if self._reserve == 0:
                return
            self._reserve -= 1
        self._top_up()

    def take(self, key: str) -> Future | None:
        """The guess for `key`, if one was started; the caller awaits it, or compiles `key` itself, from now on.

        Either way `key` leaves the list, so that no later top-up starts it a
        second time.
        """
        with self._lock:
            for position, (wanted, _) in enumerate(self._wanted):
                if wanted == key:
                    del self._wanted[position]
                    if position < self._certain:
                        self._certain -= 1
                    break
            return self._started.pop(key, None)

    def cancel(self) -> None:
        """Start no more guesses and drop those not yet running (a finished tune needs none)."""
        with self._lock:
            self._wanted.clear()
            self._certain = 0
            started, self._started = self._started, {}
        for future in started.values():
            future.cancel()

    def _top_up(self) -> None:
        with self._lock:
            workers = self.pool.workers
            busy = sum(not future.done() for future in self._started.values())
            idle = workers - self._reserve - busy
            spare = max(0, min(SPARE, workers // 2) - self._reserve)
            while self._wanted and idle > (0 if self._certain else spare):
                key, job = self._wanted.popleft()
                self._certain = max(0, self._certain - 1)
                if key in self._started:
                    continue
                try:
                    future = self.pool.try_submit(job)
                except Exception as error:  # noqa: BLE001  a guess that cannot start costs nothing
                    logger.debug("no more guesses: %s", describe_error(error))
                    future = None
                if future is None:  # the pool is closed, broken, starting or isolating a crash
                    self._wanted.clear()
                    self._certain = 0
                    return
                self._started[key] = future
                idle -= 1
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
