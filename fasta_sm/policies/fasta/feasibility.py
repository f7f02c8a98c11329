"""Which unmeasured configs will probably fail: learnt from the failures seen so far.

Out-of-resource configs sit in a corner of the space (big tiles times many
stages). Each one costs a compile and a budget slot, and the duration model
cannot learn them because failures never enter the regression: worse, the
duration model extrapolates "bigger tiles are faster" straight into the
corner where they stop compiling. Each config gets a failure probability p,
and selection multiplies its softmax weight by a power of its chance to
run. Two rules make p certain: resource dominance (larger than a failure
in every resource column), and the shared-memory bound, which takes how
far a failure overshot from Triton's own error message, the one place a
backend states it (read by `fasta_sm.failures`, so no wording reaches
this module). A third treats a register spill like a failure: spill
dominance (larger than a large tile that ran several times slower than
the best), since such a config runs, but slowly, after the slowest compile
of its space; and a fourth, load dominance, reads a far slower one as a
spill of every tile at least as large with at least its tile per warp,
whatever its other kwargs. A ridge fit of the 0/1 failure indicator can give the other
configs a p in between (`failure_chance`, the `failure_fit` knob): it
ranks failures well but demotes the fast configs at the limit's edge, so
it is off by default.
"""

from __future__ import annotations

import numpy as np

from .features import column_index
from .surrogates import solve_ridge

PROBABILITY_FLOOR = 1e-3


def failure_chance(design: np.ndarray, tried: np.ndarray, failed: np.ndarray, lam: float) -> np.ndarray:
    """P(config fails) for every row of `design`, in [0, 1]; all zeros until a failure is seen.

    `tried` are the rows compiled so far, `failed` a 0/1 array over them.
    """
    if not failed.any() or design.shape[1] == 0:
        return np.zeros(design.shape[0])
    if failed.all():
        return np.ones(design.shape[0])
    return np.clip(solve_ridge(design, tried, failed.astype(float), lam).predict(design), 0.0, 1.0)


def run_penalty(p_fail: np.ndarray, tau: float, weight: float) -> np.ndarray:
    """Score added so that a config's softmax weight is multiplied by P(runs) ** weight.

    P(runs) is floored at PROBABILITY_FLOOR: a wrong guess demotes a config,
    it never rules it out.
    """
    return -tau * weight * np.log(np.maximum(1.0 - p_fail, PROBABILITY_FLOOR))


def resource_pressure(names: tuple[str, ...], levels: np.ndarray) -> np.ndarray | None:
    """The level codes of the columns a config's resource needs grow with, signed so that larger means more.

    Kwargs (tile sizes, BLOCK_K and GROUP_M alike) and stages raise shared memory and registers per thread;
    more warps spread a tile's registers thinner, so warps count negatively.
    None when the space has no kwarg or stage column.
    """
    growing = [j for j, name in enumerate(names) if name.startswith("kwargs.") or name == "num_stages"]
    if not growing:
        return None
    columns = [levels[:, j] for j in growing] + [-levels[:, j] for j, name in enumerate(names) if name == "num_warps"]
    stacked = np.stack(columns, axis=1)
    # int16 keeps the dominance tables small; a column of 32,768 values or more would wrap around in it.
    return stacked.astype(np.int16 if stacked.size and np.abs(stacked).max() <= np.iinfo(np.int16).max else np.int64)


def register_pressure(names: tuple[str, ...], levels: np.ndarray) -> np.ndarray | None:
    """`resource_pressure` without the stage column: what registers per thread grow with.

    Registers per thread grow with the tile kwargs (the accumulator, and
    the operand fragments with `BLOCK_K`) and fall with the warps; the
    pipeline's stages hold their buffers in shared memory. So a register
    spill implies one at fewer stages as well as at more: on the recorded
    GELU and fp16 matmuls every stage count of a spilled tile spills.
    None as `resource_pressure` is.
    """
    keep = [j for j, name in enumerate(names) if name != "num_stages"]
    return resource_pressure(tuple(names[j] for j in keep), levels[:, keep])


def resource_culprits(pressure: np.ndarray, durations: np.ndarray) -> np.ndarray:
    """Resource dominance: per config, a failed config whose pressure it has at least in every column (-1 for
    none), which rules it out.

    `pressure` is `resource_pressure`. A failure that a config which ran
    dominates is not a resource failure (it broke for another reason) and
    implies nothing.
    """
    failed = np.flatnonzero(np.isinf(durations))
    if failed.size:
        failed = failed[~_dominated(pressure[failed], pressure[np.isfinite(durations)])]
    return _culprits(-pressure, -pressure[failed], failed)


def spill_culprits(
    pressure: np.ndarray, area: np.ndarray, load: np.ndarray, durations: np.ndarray, spill: float
) -> np.ndarray:
    """Spill dominance: per config, a spill whose pressure it has at least in every column (-1 for none), which
    rules it out.

    A config that ran `spill` times slower than the best or more, with a
    tile `area` and a tile per warp (`load`, the area over the warps) at
    least the best's, is read as a register spill (as the spill twins read
    it): it holds more registers per thread than the best does. A config at
    least as large in every column of `pressure` (every kwarg, with no more
    warps; and the stages, unless `pressure` is `register_pressure`) holds
    at least as many and spills too. On the recorded GELU matmul such
    configs run 5 to 27 times slower than the best and take up to 25 times
    the median compile, so each one a tune picks costs more than a good
    config does. A slow config with less tile per warp than the best implies
    nothing: too little work per program, or too many warps for its tile,
    is slow for other reasons. `pressure` is `resource_pressure`.
    """
    spilled = _spills(area, load, durations, spill)
    return _culprits(-pressure, -pressure[spilled], spilled)


def load_culprits(area: np.ndarray, load: np.ndarray, durations: np.ndarray, ratio: float) -> np.ndarray:
    """Load dominance: per config, a far spill whose tile area and tile per warp it has at least (-1 for none),
    which rules it out.

    A far spill is a config that ran `ratio` times slower than the best or
    more, with a tile `area` and a tile per warp (`load`) at least the
    best's. Registers per thread follow the tile per warp, so a larger tile
    at no less tile per warp holds at least as many, whatever its warps,
    stages or other kwargs (`BLOCK_K`): on the recorded square matmuls every
    tile of 8,192 elements per warp or more runs 3.6 to 27 times slower than
    the best, the 4-warp 256 x 128 and 256 x 256 tiles and the 8-warp
    256 x 256 one beside the 4-warp 128 x 256 that `spill_dominance` reaches
    from it. `spill_dominance` needs every kwarg at least the spill's and no
    more warps, so each of those is found by its own slow compile. A far
    ratio keeps the rule off the attention kernels, whose slow 1-stage
    configs pass for spills against a mediocre best early in a tune.
    """
    spilled = _spills(area, load, durations, ratio)
    tiles = -np.column_stack([area, load])
    return _culprits(tiles, tiles[spilled], spilled)


def _spills(area: np.ndarray, load: np.ndarray, durations: np.ndarray, ratio: float) -> np.ndarray:
    """The configs that ran `ratio` times slower than the best or more with at least its tile area and tile per
    warp (none for a `ratio` of 0, which is off): slow for holding more registers per thread than it does."""
    ran = np.flatnonzero(np.isfinite(durations))
    if ratio <= 0 or ran.size == 0:
        return ran[:0]
    best = ran[np.argmin(durations[ran])]
    larger = (area[ran] >= area[best]) & (load[ran] >= load[best])
    return ran[(durations[ran] >= ratio * durations[best]) & larger]


def _dominated(rows: np.ndarray, by: np.ndarray) -> np.ndarray:
    """Whether each row is at most some row of `by` in every column."""
    return _dominance(rows, by).any(axis=0)


def _culprits(rows: np.ndarray, by: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """Per row, the first of `sources` (the configs of the rows of `by`) whose row it is at most in every
    column; -1 for none."""
    culprits = np.full(rows.shape[0], -1, dtype=np.int64)
    if sources.size:
        within = _dominance(rows, by)
        hit = within.any(axis=0)
        culprits[hit] = sources[within[:, hit].argmax(axis=0)]
    return culprits


def _dominance(rows: np.ndarray, by: np.ndarray) -> np.ndarray:
    """The table (by, rows) of whether each row is at most each row of `by` in every column.

    The costly call compares every config against the few failures, so the
    table is laid out (by, rows): numpy's inner loop runs along the long side.
    """
    within = np.ones((by.shape[0], rows.shape[0]), dtype=bool)
    for j in range(rows.shape[1]):
        within &= rows[:, j] <= by[:, j, None]
    return within


def shared_memory_columns(names: tuple[str, ...]) -> tuple[np.ndarray, int | None]:
    """Which feature columns the overshoot bound treats as sizes (kwargs, warps), and the stage column's index."""
    sizes = np.array([name.startswith("kwargs.") or name == "num_warps" for name in names], dtype=bool)
    return sizes, column_index(names, "num_stages")


def overshoot_culprits(
    raw: np.ndarray, sizes: np.ndarray, stages: int | None, durations: np.ndarray, overshoot: np.ndarray
) -> np.ndarray:
    """The shared-memory bound: per config, an out-of-shared-memory failure whose overshoot bounds the config's
    shared memory above the limit (-1 for none; the first where several do), which rules it out.

    Shared memory is a sum of buffers, each at most proportional to every
    tile size (and to the warps), the pipelined ones held num_stages − 1
    times. So a config whose sizes are each at least a share of a failed
    config's, and its stages minus one a share of that one's, needs at
    least the product of those shares of the failure's memory; past the
    limit, it fails too. A config that failed at 2.3× the limit thus rules
    out its tile at half the BLOCK_K, where plain dominance only rules out
    larger ones. Columns that are neither sizes nor stages must match. A
    failure whose bound would rule out a config that ran does not follow
    the form and is ignored.

    `raw` is the feature space's raw values, `sizes` and `stages` come from
    `shared_memory_columns`, `overshoot` from `fasta_sm.failures.shared_memory_overshoot`.
    """
    ran = np.isfinite(durations)
    others = ~sizes
    if stages is not None:
        others[stages] = False
    culprits = np.full(raw.shape[0], -1, dtype=np.int64)
    for failed in np.flatnonzero(overshoot > 1.0):
        reference = raw[failed]
        share = np.prod(_share(raw[:, sizes], reference[sizes]), axis=1)
        if stages is not None:
            share = share * _share(raw[:, stages] - 1.0, reference[stages] - 1.0)
        share = np.where((raw[:, others] == reference[others]).all(axis=1), share, 0.0)
        ruled_out = overshoot[failed] * share > 1.0
        if not (ruled_out & ran).any():
            culprits = np.where(ruled_out & (culprits < 0), failed, culprits)
    return culprits


def _share(values: np.ndarray, reference: np.ndarray | float) -> np.ndarray:
    """min(1, value / reference), elementwise; 0 where the reference is not positive and the value is below it."""
    reference = np.broadcast_to(np.asarray(reference, dtype=float), values.shape)
    ratio = np.divide(values, reference, out=np.zeros(values.shape), where=reference > 0)
    return np.where(values >= reference, 1.0, np.clip(ratio, 0.0, 1.0))
