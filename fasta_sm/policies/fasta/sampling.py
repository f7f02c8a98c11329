"""Which configs to measure: the stratified R1 sample and the softmax batch picks."""

from __future__ import annotations

import numpy as np


def stratified_sample(levels: np.ndarray, size: int, rng: np.random.Generator) -> list[int]:
    """R1: cover every value of the most varied column first, then the next.

    One config per value, column by column in decreasing order of distinct
    values, so the dimension with the most structure gets the best coverage;
    what is left of `size` is drawn uniformly. Values are visited in a random
    order so a budget smaller than a column's value count is not biased
    towards small tiles (the reference walked them in sorted order).
    """
    n, dims = levels.shape
    size = min(size, n)
    chosen: list[int] = []
    taken = np.zeros(n, dtype=bool)
    order = sorted(range(dims), key=lambda j: (-int(levels[:, j].max()), j))
    for j in order:
        for value in rng.permutation(int(levels[:, j].max()) + 1):
            if len(chosen) >= size:
                return sorted(chosen)
            candidates = np.flatnonzero((levels[:, j] == value) & ~taken)
            if candidates.size:
                pick = int(rng.choice(candidates))
                taken[pick] = True
                chosen.append(pick)
    rest = np.flatnonzero(~taken)
    if len(chosen) < size and rest.size:
        chosen += rng.choice(rest, size=size - len(chosen), replace=False).tolist()
    return sorted(int(i) for i in chosen)


def softmax_pick(scores: np.ndarray, tau: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """Draw `count` positions without replacement, P(i) ∝ exp(-scores[i] / tau).

    Uses the Gumbel-top-k trick in log space: adding Gumbel noise to the
    logits and keeping the k largest is exactly sequential softmax sampling
    without replacement, and no probability is ever exponentiated, so a tiny
    temperature cannot underflow every weight to zero. At the limit the draw
    degrades to the deterministic top-k, never to a uniform pick.
    """
    count = min(count, scores.size)
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    keys = -scores / tau + rng.gumbel(size=scores.size)
    if count == scores.size:
        return np.argsort(-keys, kind="stable")
    top = np.argpartition(-keys, count - 1)[:count]
    return top[np.argsort(-keys[top], kind="stable")]


def marginal_scores(levels: np.ndarray, rows: np.ndarray, y: np.ndarray) -> np.ndarray:
    """An additive vote: the overall mean plus each column's effect at each config's level.

    A column's effect at a level is the mean measured value there minus the
    overall mean; a level never measured has no effect. The vote needs no
    fit, so it still ranks sensibly when a basis with interactions is
    underdetermined, and it is on the same scale as `y`.
    """
    overall = float(y.mean())
    total = np.full(levels.shape[0], overall)
    for j in range(levels.shape[1]):
        width = int(levels[:, j].max()) + 1
        sums = np.bincount(levels[rows, j], weights=y, minlength=width)
        counts = np.bincount(levels[rows, j], minlength=width)
        effects = np.where(counts > 0, sums / np.maximum(counts, 1) - overall, 0.0)
        total += effects[levels[:, j]]
    return total
