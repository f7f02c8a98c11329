"""Which unmeasured configs will probably fail: learnt from the failures seen so far.

Out-of-resource configs sit in a corner of the space (big tiles times many
stages). Each one costs a compile and a budget slot, and the duration model
cannot learn them because failures never enter the regression: worse, the
duration model extrapolates "bigger tiles are faster" straight into the
corner where they stop compiling. A ridge fit of the 0/1 failure indicator
over the configs tried so far gives a failure probability p, and selection
multiplies each config's softmax weight by a power of its chance to run.
"""

from __future__ import annotations

import numpy as np

from .surrogates import fit_ridge

PROBABILITY_FLOOR = 1e-3


def failure_chance(design: np.ndarray, tried: np.ndarray, failed: np.ndarray, lam: float) -> np.ndarray:
    """P(config fails) for every row of `design`, in [0, 1]; all zeros until a failure is seen.

    `tried` are the rows compiled so far, `failed` a 0/1 array over them.
    """
    if not failed.any() or design.shape[1] == 0:
        return np.zeros(design.shape[0])
    if failed.all():
        return np.ones(design.shape[0])
    fit = fit_ridge("feasibility", design, tried, failed.astype(float), lam)
    return np.clip(fit.predict(design), 0.0, 1.0)


def run_penalty(p_fail: np.ndarray, tau: float, weight: float) -> np.ndarray:
    """Score added so that a config's softmax weight is multiplied by P(runs) ** weight.

    P(runs) is floored at PROBABILITY_FLOOR: a wrong guess demotes a config,
    it never rules it out.
    """
    return -tau * weight * np.log(np.maximum(1.0 - p_fail, PROBABILITY_FLOOR))


def resource_pressure(names: tuple[str, ...], raw: np.ndarray) -> np.ndarray | None:
    """The columns a config's resource needs grow with, signed so that larger means more pressure.

    Tile kwargs and stages raise shared memory and registers per thread;
    more warps spread a tile's registers thinner, so warps count negatively.
    None when the space has no kwarg or stage column.
    """
    growing = [j for j, name in enumerate(names) if name.startswith("kwargs.") or name == "num_stages"]
    if not growing:
        return None
    columns = [raw[:, j] for j in growing] + [-raw[:, j] for j, name in enumerate(names) if name == "num_warps"]
    return np.stack(columns, axis=1)


def resource_dominance(pressure: np.ndarray, durations: np.ndarray, p_fail: np.ndarray) -> np.ndarray:
    """`p_fail` with what monotone resource needs imply: 0 below a config that ran, 1 above one that failed.

    `pressure` is `resource_pressure`. A config under no more pressure than
    one that ran, in every column, fits too; one under at least as much as
    one that failed does not. A failure that a config which ran dominates is
    not a resource failure (it broke for another reason) and implies nothing.
    """
    p_fail = p_fail.copy()
    ran = np.flatnonzero(np.isfinite(durations))
    for index in ran:
        p_fail[np.all(pressure <= pressure[index], axis=1)] = 0.0
    for index in np.flatnonzero(np.isinf(durations)):
        if not np.any(np.all(pressure[ran] >= pressure[index], axis=1)):
            p_fail[np.all(pressure >= pressure[index], axis=1)] = 1.0
    return p_fail
