"""Which configs to measure: the stratified R1 sample and the softmax batch picks."""

from __future__ import annotations

import numpy as np


def stratified_sample(
    levels: np.ndarray, size: int, rng: np.random.Generator, covered: np.ndarray | None = None
) -> list[int]:
    """R1: cover every value of the most varied column first, then the next.

    One config per value, column by column in decreasing order of distinct
    values, so the dimension with the most structure gets the best coverage;
    what is left of `size` is drawn uniformly. Values are visited in a random
    order so a budget smaller than a column's value count is not biased
    towards small tiles (the reference walked them in sorted order).
    `covered` holds the levels of configs R1 measures already (earlier
    tunes' winners): the values they have are not sampled again, so the
    sample spreads over the rest instead of crowding where they are.
    """
    n, dims = levels.shape
    size = min(size, n)
    chosen: list[int] = []
    taken = np.zeros(n, dtype=bool)
    order = sorted(range(dims), key=lambda j: (-int(levels[:, j].max()), j))
    for j in order:
        held = set() if covered is None else {int(value) for value in covered[:, j]}
        for value in rng.permutation(int(levels[:, j].max()) + 1):
            if len(chosen) >= size:
                return sorted(chosen)
            if value in held:
                continue
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


def best_then_softmax(
    scores: np.ndarray, tau: float, count: int, best: int, rng: np.random.Generator
) -> np.ndarray:
    """`count` positions: the `best` lowest scores outright, then the rest drawn by `softmax_pick` from the others.

    The draw explores; with the batches of two that small spaces get, it can
    pass over the model's first choice round after round until the budget is
    spent (docs/algorithm.md, Batch selection). Ties go to the earlier position.
    A count or best below zero is none, as in `softmax_pick`: as a slice end it would count from the end.
    """
    count = max(0, min(count, scores.size))
    best = max(0, min(best, count))
    top = np.argsort(scores, kind="stable")[:best]
    rest = np.delete(np.arange(scores.size), top)
    return np.concatenate([top, rest[softmax_pick(scores[rest], tau, count - best, rng)]]).astype(np.int64)


def marginal_scores(levels: np.ndarray, rows: np.ndarray, y: np.ndarray) -> np.ndarray:
    """An additive vote: the overall mean plus each column's effect at each config's level.

    A column's effect at a level is the mean measured value there minus the
    overall mean; a level never measured has no effect. The vote needs no
    fit, so it still ranks sensibly when a basis with interactions is
    underdetermined, and it is on the same scale as `y`.
    """
    overall = float(y.mean())
    # Every column's levels get their own range of codes, so one bincount sums all columns.
    widths = levels.max(axis=0) + 1
    codes = levels + (np.cumsum(widths) - widths)
    measured = codes[rows]
    sums = np.bincount(measured.ravel(), weights=np.repeat(y, levels.shape[1]), minlength=widths.sum())
    counts = np.bincount(measured.ravel(), minlength=widths.sum())
    effects = np.where(counts > 0, sums / np.maximum(counts, 1) - overall, 0.0)
    total = np.full(levels.shape[0], overall)
    for j in range(levels.shape[1]):
        total += effects[codes[:, j]]
    return total


def tile_cells(space, columns, cell_max: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Cell id per config over the joint values of the tile `columns`, and each config's tile area.

    None when none of the columns is in the space, or the space has one
    cell or more than `cell_max`.
    """
    wanted = [c if c in space.names else f"kwargs.{c}" for c in columns]
    present = [space.names.index(c) for c in wanted if c in space.names]
    tiles = [space.names.index(c) for c in wanted if c in space.names and c.startswith("kwargs.")]
    if not present or cell_max <= 0:
        return None, None
    cells = np.unique(space.levels[:, present], axis=0, return_inverse=True)[1].reshape(-1)
    count = int(cells.max()) + 1
    if count < 2 or count > cell_max:
        return None, None
    area = np.prod(space.raw[:, tiles], axis=1) if tiles else np.ones(space.raw.shape[0])
    return cells.astype(np.int64), area


def unexplored_cell_picks(
    cells: np.ndarray,
    area: np.ndarray,
    durations: np.ndarray,
    candidates: np.ndarray,
    scores: np.ndarray,
    p_run: np.ndarray,
    count: int,
    min_run: float,
) -> np.ndarray:
    """One candidate per unexplored tile cell at least as large as the best's, best-scored cells first.

    A cell is unexplored when none of its configs has run. Only cells whose
    tile area is at least the current best's qualify (the fast cell of a
    GPU space sits at the large-tile edge, next to the spill and
    out-of-resource corners no smooth model extrapolates to), and only
    those whose best-scored candidate runs with probability `min_run`.
    Within a cell the candidate with the lowest score is taken.
    """
    if count <= 0 or candidates.size == 0:
        return np.zeros(0, dtype=np.int64)
    _, explored, best = _ran_explored_best(cells, durations)
    groups = []
    for cell in np.flatnonzero(~explored):
        inside = candidates[(cells[candidates] == cell) & (p_run[candidates] >= min_run)]
        if inside.size and area[inside[0]] >= area[best]:
            groups.append(inside)
    return _best_of_each(groups, scores, count)


def _ran_explored_best(cells: np.ndarray, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The configs that ran, the cells they explored (a mask over cell ids) and the fastest of them."""
    ran = np.flatnonzero(np.isfinite(durations))
    explored = np.zeros(int(cells.max()) + 1, dtype=bool)
    explored[cells[ran]] = True
    return ran, explored, int(ran[np.argmin(durations[ran])])


def _at_deepest_stages(levels: np.ndarray, inside: np.ndarray, stages: int | None) -> np.ndarray:
    """`inside` less all but its deepest stage count (column `stages` of `levels`); whole without that column."""
    if stages is None or inside.size == 0:
        return inside
    return inside[levels[inside, stages] == levels[inside, stages].max()]


def _best_of_each(groups: list[np.ndarray], scores: np.ndarray, count: int) -> np.ndarray:
    """The lowest-scored config of each group; those picks best-scored first, at most `count`."""
    chosen = sorted((float(scores[pick]), pick) for pick in (int(g[np.argmin(scores[g])]) for g in groups))
    return np.array([i for _, i in chosen[:count]], dtype=np.int64)


def cell_retry_picks(
    cells: np.ndarray,
    area: np.ndarray,
    free: np.ndarray,
    durations: np.ndarray,
    candidates: np.ndarray,
    scores: np.ndarray,
    p_run: np.ndarray,
    count: int,
    min_run: float,
) -> np.ndarray:
    """A second chance for explored tile cells: each one at the other columns' values that did best at its tile area.

    `free` holds the level codes of the columns outside the cell (stages,
    BLOCK_K, ...). A cell sampled once may have been sampled at the wrong
    ones (a 4-warp tile that spills, 1 or 2 stages where the tile needs 3).
    The reference of a cell is the fastest measured config of the same tile
    area in another cell when that one beat the cell's own best, else the
    best overall; the retry is the cell's untried config with the
    reference's `free` values.
    Only cells that have run, other than the best's, whose tile area is at
    least the best's and whose retry runs with probability `min_run`
    qualify; the `count` lowest-scored retries are returned.
    """
    if count <= 0 or candidates.size == 0:
        return np.zeros(0, dtype=np.int64)
    ran = np.flatnonzero(np.isfinite(durations))
    best = int(ran[np.argmin(durations[ran])])
    eligible = candidates[
        (cells[candidates] != cells[best]) & (area[candidates] >= area[best]) & (p_run[candidates] >= min_run)
    ]
    chosen: list[int] = []
    for cell in np.intersect1d(cells[ran], cells[eligible]):
        inside = eligible[cells[eligible] == cell]
        peers = ran[(area[ran] == area[inside[0]]) & (cells[ran] != cell)]
        own = ran[cells[ran] == cell]
        reference = best
        if peers.size and durations[peers].min() < durations[own].min():
            reference = int(peers[np.argmin(durations[peers])])
        chosen += inside[np.all(free[inside] == free[reference], axis=1)].tolist()
    picks = np.array(chosen, dtype=np.int64)
    return picks[np.argsort(scores[picks], kind="stable")[:count]]


def spill_twin_picks(
    levels: np.ndarray,
    warps: int,
    cells: np.ndarray,
    area: np.ndarray,
    durations: np.ndarray,
    candidates: np.ndarray,
    scores: np.ndarray,
    p_run: np.ndarray,
    count: int,
    min_run: float,
    spill: float,
    stages: int | None = None,
) -> np.ndarray:
    """Unexplored cells whose tile spilled at fewer warps: one candidate each, best-scored cells first.

    A config at least `spill` times slower than the best is taken as a
    register spill; the same tile with more warps (column `warps` of
    `levels`) holds fewer registers per thread and is often the fastest
    cell of the space (attention 256 x 64: +290 % at 4 warps, the best at 8).
    A smooth model reads the spill as "this tile is slow" and never goes
    there, so the evidence is taken to be about warps only. Qualifying
    cells: unexplored, tile area at least the best's, holding a config
    that differs from a spilled one only by more warps; within a cell the
    lowest-scored candidate that runs with probability `min_run` is taken,
    among those at the most stages (column `stages` of `levels`, when given):
    the model ranks the twin's stages by the spilled and smaller tiles, and
    on the recorded attention kernels every 8-warp cell is fastest at the
    deepest pipeline that fits (256 x 64: +20 % at 2 stages, the best at 3).
    """
    if count <= 0 or candidates.size == 0 or spill <= 0:
        return np.zeros(0, dtype=np.int64)
    ran, explored, best = _ran_explored_best(cells, durations)
    spilled = ran[durations[ran] >= spill * durations[best]]
    unexplored_large = ~explored[cells[candidates]] & (area[candidates] >= area[best])
    eligible = candidates[unexplored_large & (p_run[candidates] >= min_run)]
    if spilled.size == 0 or eligible.size == 0:
        return np.zeros(0, dtype=np.int64)
    others = np.delete(levels, warps, axis=1)
    same = np.all(others[eligible][:, None, :] == others[spilled][None, :, :], axis=2)
    more = levels[eligible, warps][:, None] > levels[spilled, warps][None, :]
    groups = []
    for cell in np.unique(cells[eligible[np.any(same & more, axis=1)]]):
        groups.append(_at_deepest_stages(levels, eligible[cells[eligible] == cell], stages))
    return _best_of_each(groups, scores, count)


def transposed_tile(raw: np.ndarray, m: int, n: int, center: int, candidates: np.ndarray) -> np.ndarray:
    """The candidates equal to `center` but for its tile's rows and columns swapped (columns `m` and `n` of `raw`).

    A transposed tile has the same area, registers and shared memory as
    its original, so it is as likely to run and often about as fast, but it
    moves two columns at once, and a smooth model ranks it by the smaller
    and larger tiles in between. On the recorded mm_fp16_4096 the best
    config found (256 x 128) is 1.5 % from the fastest (128 x 256, same
    BLOCK_K, warps and stages) in the runs that miss.
    """
    mine = raw[center]
    if mine[m] == mine[n]:
        return np.zeros(0, dtype=np.int64)
    swapped = mine.copy()
    swapped[[m, n]] = mine[[n, m]]
    return candidates[np.all(raw[candidates] == swapped, axis=1)]


def scaled_up_tiles(
    levels: np.ndarray, center: int, candidates: np.ndarray, m: int, n: int, warps: int, stages: int | None
) -> np.ndarray:
    """The candidates with `center`'s tile one level larger in one dimension and one level more warps.

    In the usual power-of-two spaces a level up is a doubling, and doubling
    a tile's side and its warps keeps the work and registers per
    thread, so the larger tile runs about as well as the center and may be
    faster, yet it is three columns away once stages differ, and a smooth
    model ranks it by the slower tiles in between. On the recorded
    attention_fwd_bf16_d128 most held-out misses stop at 128 x 64 with 4
    warps (+3.0 %), and the fastest configs are 256 x 64 with 8 warps at 3
    and 4 stages. Columns `m`, `n` and `warps` of `levels` are the tile and
    the warps; every other column but `stages` must equal the center's, and
    with `stages` given only the deepest stages among the candidates of each
    direction are kept (as for the spill twins).
    """
    moved = levels[candidates] - levels[center]
    fixed = [j for j in range(levels.shape[1]) if j not in (m, n, warps, stages)]
    same = np.all(moved[:, fixed] == 0, axis=1) & (moved[:, warps] == 1)
    picks = []
    for dm, dn in ((1, 0), (0, 1)):
        picks.append(_at_deepest_stages(levels, candidates[same & (moved[:, m] == dm) & (moved[:, n] == dn)], stages))
    return np.concatenate(picks)


def one_step_neighbours(levels: np.ndarray, centers: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """The candidates one level away from any of `centers` in exactly one column (coordinate-descent moves).

    Steps are summed column by column over a (centers, candidates) table, so
    numpy's inner loop runs along the many candidates.
    """
    around, moves = levels[centers].T, levels[candidates].T
    steps = np.zeros((centers.size, candidates.size), dtype=levels.dtype)
    for j in range(levels.shape[1]):
        steps += np.abs(moves[j] - around[j, :, None])
    return candidates[np.any(steps == 1, axis=0)]
