"""When to stop refining: the model sees nothing better, or the results settled.

Both tests work on log durations relative to a fixed reference, so they mean
the same on a 3 µs pointwise kernel and a 3 ms matmul.
"""

from __future__ import annotations

import math

import numpy as np


def margin_settled(lower_bound: np.ndarray, best_log: float, margin: float, loo_rho: float, trust_rho: float) -> bool:
    """True when a trusted model bounds every unmeasured config as worse than the best.

    `lower_bound` is the optimistic (prediction minus leave-one-out error)
    log duration of each unmeasured config. The reference compared the raw
    minimum prediction to the best: an over-eager model that predicted
    below the best (even negative durations) blocked the test forever, and
    a margin of 2.0 (twice as slow) never fires on real spaces.
    """
    if lower_bound.size == 0:
        return True
    return loo_rho >= trust_rho and float(lower_bound.min()) > best_log + math.log1p(margin)


def relative_histogram(log_durations: np.ndarray, reference: float, bins: int, span: float) -> np.ndarray:
    """Shares of the near-best configs per bin of log(d / reference), on fixed edges.

    Only configs within `span` log units of the reference (the best after
    R1) count: the histogram describes the near-optimal set, so a round that
    adds nothing to it leaves it unchanged, while the bulk of slow configs
    cannot drown a change near the top. The edges never move, so
    histograms of consecutive rounds are comparable; the reference rebuilt
    its edges from each round's min and max.
    """
    edges = np.linspace(0.0, span, bins + 1)
    shifted = np.maximum(log_durations - reference, 0.0)
    # np.histogram's bins, without its generic machinery: [e_i, e_i+1), the last one closed.
    index = np.searchsorted(edges, shifted[shifted <= span], side="right") - 1
    counts = np.bincount(np.minimum(index, bins - 1), minlength=bins).astype(float)
    return counts / max(counts.sum(), 1.0)


def histogram_settled(previous: np.ndarray | None, current: np.ndarray, l1_conv: float) -> bool:
    """True when a round moved less than `l1_conv` of the probability mass."""
    if previous is None:
        return False
    return float(np.abs(current - previous).sum()) < l1_conv
