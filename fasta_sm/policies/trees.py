"""Extra-trees surrogate with lower-confidence-bound picks: the plain-ML baseline.

Fit an extra-trees forest on log2 features and log durations, pick the
unmeasured configs with the lowest mean minus one spread across trees, repeat
until the budget is spent. scikit-learn (the `bench` extra) is imported lazily: only the bench
uses this policy.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config import Config
from ..errors import MissingDependency
from ..protocols import Decision, Observations
from . import register
from .baseline import budget_count, budget_spent
from .fasta.features import extract_features


@register("trees")
class ExtraTreesLCB:
    """Random R1, then batches of lowest lower-confidence-bound predictions."""

    name = "trees"

    def __init__(
        self, configs: Sequence[Config], budget: float = 0.2, r1_frac: float = 0.4, rounds: int = 4, kappa: float = 1.0
    ) -> None:
        if importlib.util.find_spec("sklearn") is None:
            raise MissingDependency("the trees policy needs scikit-learn: pip install 'fasta-sm[bench]'")
        try:  # one installed but broken (built against another numpy, say) would fail only at the first refine
            import sklearn.ensemble  # noqa: F401
        except (ImportError, ValueError) as exc:  # ValueError: numpy's "dtype size changed" for a mismatched build
            raise MissingDependency(f"the trees policy needs scikit-learn, which is installed but does not import "
                                    f"({type(exc).__name__}: {exc}): pip install 'fasta-sm[bench]'") from None
        _check_knobs(r1_frac, rounds, kappa)
        self._n = len(configs)
        self._count = budget_count(self._n, budget)
        self._r1 = max(1, min(self._count, math.ceil(r1_frac * self._count)))
        self._batch = max(1, math.ceil((self._count - self._r1) / rounds))
        self._kappa = kappa
        self._x = extract_features(configs).unit

    def plan(self, rng: np.random.Generator) -> Decision:
        batch = np.sort(rng.choice(self._n, size=self._r1, replace=False))
        return Decision(batch=batch.tolist(), reason=f"trees: {self._r1} random configs")

    def refine(self, observed: Observations, rng: np.random.Generator) -> Decision:
        from sklearn.ensemble import ExtraTreesRegressor

        durations = np.asarray(observed.duration_us, dtype=float)
        left = self._count - int(np.sum(~np.isnan(durations)))
        candidates = np.flatnonzero(np.isnan(durations))
        rows = np.flatnonzero(np.isfinite(durations))
        if left <= 0 or candidates.size == 0:
            return budget_spent("trees", self._count)
        size = min(left, self._batch, candidates.size)
        if rows.size < 2 or self._x.shape[1] == 0:
            picks = rng.choice(candidates, size=size, replace=False)
            return Decision(batch=sorted(int(i) for i in picks), reason="trees: too little data, random picks")
        forest = ExtraTreesRegressor(n_estimators=50, random_state=int(rng.integers(2**31)), n_jobs=1)
        forest.fit(self._x[rows], np.log(durations[rows]))
        per_tree = np.stack([tree.predict(self._x[candidates]) for tree in forest.estimators_])
        bound = per_tree.mean(axis=0) - self._kappa * per_tree.std(axis=0)
        picks = candidates[np.argsort(bound, kind="stable")[:size]]
        return Decision(batch=sorted(int(i) for i in picks), reason=f"trees: {size} lowest confidence bounds")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _check_knobs(r1_frac: object, rounds: object, kappa: object) -> None:
    """Refuse knob values that would break the search mid-tune (a ValueError: make_policy names the policy)."""
    if isinstance(r1_frac, bool) or not isinstance(r1_frac, (int, float)) or not 0.0 < r1_frac <= 1.0:
        raise ValueError(f"r1_frac={r1_frac!r} must be a fraction in (0, 1]")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds={rounds!r} must be a whole number of at least 1")
    if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not 0 <= kappa <= sys.float_info.max:
        raise ValueError(f"kappa={kappa!r} must be a finite number, 0 or more")
