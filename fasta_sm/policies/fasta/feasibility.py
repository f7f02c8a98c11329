"""Which unmeasured configs will probably fail: learnt from the failures seen so far.

Out-of-resource configs sit in a corner of the space (big tiles times many
stages). Each one costs a compile and a budget slot, and the duration model
cannot learn them because failures never enter the regression. A ridge fit
of the 0/1 failure indicator over the configs tried so far gives a failure
probability; selection multiplies each config's softmax weight by its chance
of running.
"""

from __future__ import annotations

import numpy as np

from .surrogates import fit_ridge

PROBABILITY_FLOOR = 0.02


def log_run_chance(design: np.ndarray, tried: np.ndarray, failed: np.ndarray, lam: float) -> np.ndarray:
    """log P(config runs) for every row of `design`; all zeros until a failure is seen.

    `tried` are the rows compiled so far, `failed` a 0/1 array over them. The
    probability is clipped to [PROBABILITY_FLOOR, 1] so a wrong guess only
    demotes a config, never rules it out.
    """
    if not failed.any() or failed.all() or design.shape[1] == 0:
        return np.zeros(design.shape[0])
    fit = fit_ridge("feasibility", design, tried, failed.astype(float), lam)
    p_fail = np.clip(fit.predict(design), 0.0, 1.0 - PROBABILITY_FLOOR)
    return np.log1p(-p_fail)
