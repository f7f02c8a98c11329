"""Ridge surrogates over several feature bases, competed by rank-correlated LOOCV.

Each basis expands the unit-scaled features into columns; a ridge regression
on the measured configs' log durations predicts every other config. The bases
compete every round: the one whose leave-one-out predictions rank the measured
configs best (Spearman) wins. Leave-one-out comes for free from the hat
matrix: the held-out residual of point i is e_i / (1 - H_ii).

Beyond the reference's five smooth bases, two more compete: `rbf`, random
Fourier features of a Gaussian kernel (a smooth local model; the default
incumbent, which the others must beat by a margin), and `pairs`, a tree-like
basis: one indicator per level of every column and per level pair of every
two columns, for thresholds and interactions (an out-of-register BLOCK_M
only at high num_stages) that no low-order polynomial captures; it is not
in the default competition.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from .features import FeatureSpace


def _linear(space: FeatureSpace) -> list[np.ndarray]:
    return [space.unit[:, j] for j in range(space.dims)]


def _squares(space: FeatureSpace) -> list[np.ndarray]:
    return [space.unit[:, j] ** 2 for j in range(space.dims)]


def _crosses(space: FeatureSpace) -> list[np.ndarray]:
    x = space.unit
    return [x[:, i] * x[:, j] for i, j in combinations(range(space.dims), 2)]


def _quad(space: FeatureSpace) -> list[np.ndarray]:
    return _linear(space) + _squares(space)


def _full(space: FeatureSpace) -> list[np.ndarray]:
    return _quad(space) + _crosses(space)


def _fourier(space: FeatureSpace) -> list[np.ndarray]:
    columns = []
    for j in range(space.dims):
        x = space.unit[:, j]
        columns += [x, np.sin(np.pi * x), np.cos(np.pi * x), np.sin(2 * np.pi * x), np.cos(2 * np.pi * x)]
    return columns


def _cubic(space: FeatureSpace) -> list[np.ndarray]:
    x, d = space.unit, space.dims
    columns = _full(space) + [x[:, j] ** 3 for j in range(d)]
    columns += [x[:, i] ** 2 * x[:, j] for i in range(d) for j in range(d) if i != j]
    columns += [x[:, i] * x[:, j] * x[:, k] for i, j, k in combinations(range(d), 3)]
    return columns


def _pairs(space: FeatureSpace) -> list[np.ndarray]:
    codes = space.levels
    columns = []
    for j in range(space.dims):
        columns += [(codes[:, j] == level).astype(float) for level in range(codes[:, j].max() + 1)]
    for i, j in combinations(range(space.dims), 2):
        joint = codes[:, i] * (codes[:, j].max() + 1) + codes[:, j]
        columns += [(joint == value).astype(float) for value in np.unique(joint)]
    return columns


RBF_FEATURES = 200
RBF_LENGTH = 0.35


def _rbf(space: FeatureSpace) -> list[np.ndarray]:
    """Random Fourier features of a Gaussian kernel: a smooth local model.

    The projection is drawn from a fixed seed, so the basis is the same in
    every process; it is part of the basis's definition, not a random choice.
    """
    draw = np.random.default_rng(20240607)
    weights = draw.standard_normal((space.dims, RBF_FEATURES)) / RBF_LENGTH
    phases = draw.uniform(0.0, 2 * np.pi, RBF_FEATURES)
    projected = np.cos(space.unit @ weights + phases) * np.sqrt(2.0 / RBF_FEATURES)
    return list(projected.T)


BASES: dict[str, Callable[[FeatureSpace], list[np.ndarray]]] = {
    "linear": _linear,
    "quad": _quad,
    "full": _full,
    "fourier": _fourier,
    "cubic": _cubic,
    "pairs": _pairs,
    "rbf": _rbf,
}
BASIS_NAMES = tuple(BASES)

# Bases whose column count must stay below half the measured configs: with
# more, leave-one-out cannot tell third-order structure from noise.
IDENTIFIABILITY_GATED = frozenset({"cubic"})


def build_basis(name: str, space: FeatureSpace) -> np.ndarray:
    """The (N, p) design matrix of basis `name`, without an intercept column."""
    columns = BASES[name](space)
    if not columns:
        return np.zeros((space.raw.shape[0], 0))
    return np.column_stack(columns)


def _centred_ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank, so a constant side has no order), minus their mean.

    Leave-one-out predictions rarely tie; without ties the ranks are the
    sort positions, whose mean is (n - 1) / 2.
    """
    n = values.size
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    tied = ordered[1:] == ordered[:-1]
    ranks = np.empty(n)
    if not tied.any():
        ranks[order] = np.arange(n) - (n - 1) / 2.0
        return ranks
    starts_group = np.concatenate(([True], ~tied))
    group = np.cumsum(starts_group) - 1
    starts = np.flatnonzero(starts_group)
    ends = np.append(starts[1:], n)
    ranks[order] = ((starts + ends - 1) / 2.0)[group]
    return ranks - ranks.sum() / n


def spearman(a: np.ndarray, b: np.ndarray, a_ranks: np.ndarray | None = None) -> float:
    """Rank correlation; 0 when either side is constant or there are < 3 points.

    `a_ranks` (`_centred_ranks(a)`) saves re-ranking the same side.
    """
    if a.size < 3:
        return 0.0
    ra = _centred_ranks(a) if a_ranks is None else a_ranks
    rb = _centred_ranks(b)
    denominator = math.sqrt((ra @ ra) * (rb @ rb))
    if denominator == 0.0:
        return 0.0
    return float((ra @ rb) / denominator)


@dataclass(frozen=True)
class Ridge:
    """Ridge coefficients and the centring they apply to: enough to predict any row of the basis."""

    coef: np.ndarray
    x_mean: np.ndarray
    y_mean: float

    def predict(self, design: np.ndarray) -> np.ndarray:
        """Predicted value of every row of `design` (the same basis the fit used)."""
        return design @ self.coef + (self.y_mean - float(self.x_mean @ self.coef))


@dataclass(frozen=True)
class RidgeFit(Ridge):
    """A ridge fit on the measured rows and its leave-one-out diagnostics."""

    basis: str
    loo_predicted: np.ndarray
    loo_rho: float
    loo_r2: float
    loo_rmse: float


def _solve(
    design: np.ndarray, rows: np.ndarray, y: np.ndarray, lam: float
) -> tuple[Ridge, np.ndarray, np.ndarray, np.ndarray]:
    """Ridge with an unpenalised intercept, solved in whichever of p or n is smaller.

    Returns the model, the centred design rows and targets, and the hat
    diagonal (the intercept's 1/n included) that the leave-one-out shortcut
    needs. Means are sums over n: np.mean's result, without its overhead.
    """
    n = rows.size
    x = design[rows]
    x_mean = x.sum(axis=0) / n
    y_mean = float(y.sum() / n)
    xc = x - x_mean
    yc = y - y_mean
    p = xc.shape[1]
    if p <= n:
        gram_inv = _inverse(xc.T @ xc + lam * np.eye(p))
        coef = gram_inv @ (xc.T @ yc)
        leverage = np.einsum("ij,ij->i", xc @ gram_inv, xc)
    else:
        kernel = xc @ xc.T
        kernel_inv = _inverse(kernel + lam * np.eye(n))
        coef = xc.T @ (kernel_inv @ yc)
        leverage = np.einsum("ij,ij->i", kernel, kernel_inv)
    return Ridge(coef=coef, x_mean=x_mean, y_mean=y_mean), xc, yc, leverage + 1.0 / n


def _inverse(matrix: np.ndarray) -> np.ndarray:
    """The inverse, or the pseudo-inverse where a tiny `ridge_lambda` leaves the matrix singular."""
    try:
        return np.linalg.inv(matrix)
    except np.linalg.LinAlgError:
        return np.linalg.pinv(matrix)


def solve_ridge(design: np.ndarray, rows: np.ndarray, y: np.ndarray, lam: float) -> Ridge:
    """A ridge model without the leave-one-out diagnostics, for a model that only predicts."""
    return _solve(design, rows, y, lam)[0]


def fit_ridge(
    name: str, design: np.ndarray, rows: np.ndarray, y: np.ndarray, lam: float, y_ranks: np.ndarray | None = None
) -> RidgeFit:
    """A ridge model and its leave-one-out diagnostics, which come free from the hat matrix.

    The hat diagonal includes the intercept's 1/n, so the shortcut is exact
    where 1 − Hᵢᵢ ≥ 0.01; past that it is floored there (docs/algorithm.md).
    Only the winner of a competition predicts the unmeasured rows, which
    keeps a round cheap. `y_ranks` is `_centred_ranks(y)`, shared by the
    bases of one competition.
    """
    ridge, xc, yc, leverage = _solve(design, rows, y, lam)
    residual = yc - xc @ ridge.coef
    loo_predicted = y - residual / np.maximum(1.0 - leverage, 0.01)
    loo_error = y - loo_predicted
    total = float(yc @ yc)
    loo_r2 = 0.0 if total == 0.0 else min(max(1.0 - float(loo_error @ loo_error) / total, 0.0), 1.0)
    return RidgeFit(
        coef=ridge.coef,
        x_mean=ridge.x_mean,
        y_mean=ridge.y_mean,
        basis=name,
        loo_predicted=loo_predicted,
        loo_rho=spearman(y, loo_predicted, y_ranks),
        loo_r2=loo_r2,
        loo_rmse=math.sqrt(float((loo_error**2).sum() / rows.size)),
    )


def compete(
    designs: dict[str, np.ndarray],
    names: Sequence[str],
    rows: np.ndarray,
    y: np.ndarray,
    lam: float,
    handicap: dict[str, float] | None = None,
) -> tuple[RidgeFit, dict[str, float]]:
    """Fit every admissible basis; the best leave-one-out Spearman wins.

    `handicap` is subtracted from a basis's score before the comparison:
    a basis that wins on leave-one-out ranking by less than its handicap
    does not replace one with a better record on real spaces.
    Returns the winner and every competitor's raw score (for the state
    file). Ties go to the earlier basis in `names`.
    """
    handicap = handicap or {}
    best: RidgeFit | None = None
    scores: dict[str, float] = {}
    y_ranks = _centred_ranks(y)
    for name in names:
        design = designs[name]
        if design.shape[1] == 0:
            continue
        if name in IDENTIFIABILITY_GATED and not design.shape[1] < rows.size / 2:
            continue
        fit = fit_ridge(name, design, rows, y, lam, y_ranks)
        scores[name] = fit.loo_rho
        if best is None or fit.loo_rho - handicap.get(name, 0.0) > best.loo_rho - handicap.get(best.basis, 0.0):
            best = fit
    if best is None:
        raise ValueError("no basis has a column; the feature space is empty")
    return best, scores
