"""Coordinate descent in the style of Inductor's CoordescTuner, at a budget.

Start from a default config and sweep the fields one at a time, as
CoordescTuner.autotune does: time the next larger and then the next smaller
value of the field (every other field equal), keep a candidate at once when
it beats the best by more than 0.1 %, go on to the next field from there, and
sweep again until a whole sweep improves nothing or the budget runs out. A
config that fails counts as an infinite timing (CoordescTuner's
compare_config), so a default config that fails is improved on by any
neighbour that runs. A bench baseline: it shows what local search finds for the
same number of evaluations.

What it is given differs from CoordescTuner (docs/benchmarks.md, "Where
`coordesc` is not CoordescTuner"): the most central config stands in for
Inductor's default; a neighbour is the next value the list holds, not a
doubled, halved or ±1 value timed whether listed or not; and every column
that varies is swept, num_stages (which CoordescTuner tunes only with
is_mm=True) and fields outside CoordescTuner's list included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config import Config
from ..protocols import Decision, Observations
from . import register
from .baseline import budget_count, budget_spent
from .fasta.features import extract_features

_INDUCTOR_FIELDS = ("XBLOCK", "YBLOCK", "ZBLOCK", "R0_BLOCK", "R1_BLOCK", "BLOCK_M", "BLOCK_N", "BLOCK_K",
                    "num_warps", "num_stages")
"""CoordescTuner's order of tunable fields (its num_stages only with is_mm=True); a table's other fields are swept
after them, in column order."""
IMPROVEMENT = 0.001
"""CoordescTuner.has_improvement: a candidate is kept when it is more than 0.1 % faster than the best."""


@register("coordesc")
class CoordinateDescent:
    """Greedy one-field-at-a-time search from the most central config."""

    name = "coordesc"

    def __init__(self, configs: Sequence[Config], budget: float = 0.2) -> None:
        self._n = len(configs)
        self._count = budget_count(self._n, budget)
        features = extract_features(configs)
        self._levels = features.levels
        short = [name.removeprefix("kwargs.") for name in features.names]
        known = [short.index(f) for f in _INDUCTOR_FIELDS if f in short]
        self._order = known + [j for j in range(len(short)) if j not in known]
        self._neighbours: dict[tuple[int, int], list[int]] = {}  # each refine replays the sweep from the start

    def _start(self) -> int:
        """The config nearest the middle value of every field: Inductor's default sits mid-range."""
        if self._levels.shape[1] == 0:
            return 0
        middle = self._levels.max(axis=0) / 2.0
        distance = np.abs(self._levels - middle).sum(axis=1)
        return int(np.argmin(distance))

    def _field_neighbours(self, index: int, j: int) -> list[int]:
        """The configs one step up, then one step down, from `index` in field `j` (CoordescTuner's order)."""
        if (index, j) not in self._neighbours:
            self._neighbours[index, j] = self._find_neighbours(index, j)
        return self._neighbours[index, j]

    def _find_neighbours(self, index: int, j: int) -> list[int]:
        row = self._levels[index]
        same_elsewhere = np.all(np.delete(self._levels, j, axis=1) == np.delete(row, j), axis=1)
        others = np.flatnonzero(same_elsewhere)
        values = self._levels[others, j]
        below = others[values < row[j]]
        above = others[values > row[j]]
        found = []
        if above.size:
            found.append(int(above[np.argmin(self._levels[above, j])]))
        if below.size:
            found.append(int(below[np.argmax(self._levels[below, j])]))
        return found

    def _next(self, durations: np.ndarray) -> int | None:
        """CoordescTuner.autotune replayed on the timings so far: the first config it would time that has not
        been, or None where it stops (a whole sweep kept nothing). Failed configs are timed inf."""
        best = self._start()
        best_us = float(durations[best])
        improved = True
        while improved:
            improved = False
            for j in self._order:
                for candidate in self._field_neighbours(best, j):
                    timing = float(durations[candidate])
                    if math.isnan(timing):
                        return candidate
                    if timing < best_us * (1.0 - IMPROVEMENT):
                        best, best_us, improved = candidate, timing, True
        return None

    def plan(self, rng: np.random.Generator) -> Decision:
        return Decision(batch=[self._start()], reason="coordesc: the default config")

    def refine(self, observed: Observations, rng: np.random.Generator) -> Decision:
        durations = np.asarray(observed.duration_us, dtype=float)
        tried = int(np.sum(~np.isnan(durations)))
        if self._count - tried <= 0:
            return budget_spent("coordesc", self._count)
        candidate = self._next(durations)
        if candidate is None:
            return Decision(batch=[], reason="coordesc: a whole sweep of the fields kept no improvement")
        return Decision(batch=[candidate], reason=f"coordesc: config #{candidate}, one field from the best")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
