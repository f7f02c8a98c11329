"""Coordinate descent in the style of Inductor's CoordescTuner, at a budget.

Start from a default config, try its neighbours one field at a time (the
next smaller and next larger value of that field, every other field equal),
move to the best improvement, and repeat until no neighbour improves or the
budget runs out. A bench baseline: it shows what local search finds for the
same number of evaluations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config import Config
from ..protocols import Decision, Observations
from . import register
from .baseline import budget_count
from .fasta.features import extract_features


@register("coordesc")
class CoordinateDescent:
    """Greedy one-field-at-a-time search from the most central config."""

    name = "coordesc"

    def __init__(self, configs: Sequence[Config], budget: float = 0.2) -> None:
        self._n = len(configs)
        self._count = budget_count(self._n, budget)
        self._levels = extract_features(configs).levels

    def _start(self) -> int:
        """The config nearest the middle value of every field: Inductor's default sits mid-range."""
        if self._levels.shape[1] == 0:
            return 0
        middle = self._levels.max(axis=0) / 2.0
        distance = np.abs(self._levels - middle).sum(axis=1)
        return int(np.argmin(distance))

    def _neighbours(self, index: int) -> list[int]:
        """Configs one step away in one field; a missing grid point is skipped over."""
        row = self._levels[index]
        found = []
        for j in range(self._levels.shape[1]):
            same_elsewhere = np.all(np.delete(self._levels, j, axis=1) == np.delete(row, j), axis=1)
            others = np.flatnonzero(same_elsewhere)
            values = self._levels[others, j]
            below = others[values < row[j]]
            above = others[values > row[j]]
            if below.size:
                found.append(int(below[np.argmax(self._levels[below, j])]))
            if above.size:
                found.append(int(above[np.argmin(self._levels[above, j])]))
        return found

    def plan(self, rng: np.random.Generator) -> Decision:
        return Decision(batch=[self._start()], reason="coordesc: the default config")

    def refine(self, observed: Observations, rng: np.random.Generator) -> Decision:
        durations = np.asarray(observed.duration_us, dtype=float)
        tried = int(np.sum(~np.isnan(durations)))
        left = self._count - tried
        finite = np.flatnonzero(np.isfinite(durations))
        if finite.size == 0:
            return Decision(batch=[], reason="coordesc: the default config failed; no config to step from")
        if left <= 0:
            return Decision(batch=[], reason=f"coordesc: budget of {self._count} configs spent")
        best = int(finite[np.argmin(durations[finite])])
        fresh = [i for i in self._neighbours(best) if np.isnan(durations[i])]
        if not fresh:
            return Decision(batch=[], reason="coordesc: no neighbour of the best improves")
        return Decision(batch=fresh[:left], reason=f"coordesc: neighbours of config #{best}")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
