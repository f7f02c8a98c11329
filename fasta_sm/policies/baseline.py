"""The yardsticks: exhaustive (the true best, at full cost) and random at a budget."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config import Config
from ..errors import PolicyError
from ..protocols import Decision, Observations
from . import register


def check_budget(budget: float, prefix: str = "") -> float:
    """`budget` as a float when it is a fraction in (0, 1], numpy's included; else a PolicyError naming it (True is
    not 1.0)."""
    if isinstance(budget, (bool, np.bool_)) or not (isinstance(budget, numbers.Real) and 0.0 < budget <= 1.0):
        raise PolicyError(f"{prefix}budget={budget!r} must be a fraction in (0, 1]")
    return float(budget)


def bought(n_configs: int, fraction: float) -> int:
    """Configs a budget fraction buys in a space of `n_configs`, before any floor or cap.

    The product is rounded to 9 digits first, so that a budget of k / N buys
    exactly k configs and not k + 1 through a floating-point residue.
    """
    return math.ceil(round(fraction * n_configs, 9))


def budget_count(n_configs: int, budget: float) -> int:
    """How many configs a fractional budget buys: at least one, at most all."""
    return max(1, min(n_configs, bought(n_configs, check_budget(budget))))


def budget_spent(policy: str, count: int) -> Decision:
    """The empty batch a budgeted baseline ends with, and why."""
    return Decision(batch=[], reason=f"{policy}: budget of {count} config{'s' if count != 1 else ''} spent")


@register("exhaustive")
class Exhaustive:
    """Measures every config once, in list order, in one round."""

    name = "exhaustive"

    def __init__(self, configs: Sequence[Config]) -> None:
        self._n = len(configs)

    def plan(self, rng: np.random.Generator) -> Decision:
        return Decision(batch=list(range(self._n)), reason="exhaustive: every config")

    def refine(self, observed: Observations, rng: np.random.Generator) -> Decision:
        return Decision(batch=[], reason="exhaustive: every config measured")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@register("random")
class RandomSearch:
    """Measures a uniform random sample of `budget` × N configs in one round."""

    name = "random"

    def __init__(self, configs: Sequence[Config], budget: float = 0.2) -> None:
        self._n = len(configs)
        self._count = budget_count(self._n, budget)

    def plan(self, rng: np.random.Generator) -> Decision:
        batch = np.sort(rng.choice(self._n, size=self._count, replace=False))
        return Decision(batch=batch.tolist(), reason=f"random: {self._count} of {self._n} configs")

    def refine(self, observed: Observations, rng: np.random.Generator) -> Decision:
        return budget_spent("random", self._count)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
