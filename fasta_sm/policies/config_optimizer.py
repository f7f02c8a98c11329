"""Prune a generated config list before the filter sees it (off by default).

Generators emit many configs that are either hopeless (a tile looped over too
many times, a tile too small to feed the hardware) or near-copies of each
other. Dropping them up front shrinks N, and so the filter's budget, without
touching the configs an expert wrote by hand: those always survive.

A config's tile is read from its kwargs: `<axis>BLOCK` with an optional
`<axis>BLOCK_SUB` (NPU style: the sub-block is looped `ceil(BLOCK / SUB)`
times, the "circle number"), or plain `BLOCK_<axis>` on GPUs, where the whole
block is the tile and the circle number is 1. No other kwarg is a tile extent,
one that merely contains BLOCK (`NUM_BLOCKS`) included.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence

from ..config import Config
from ..protocols import as_index

log = logging.getLogger("fasta_sm.policies.config_optimizer")

MAX_CIRCLE_NUM = 4
MIN_TILE_NUMEL = 32
MAX_CONFIGS = 50


def _numeric(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _tile_axis(key: str) -> tuple[str, str] | None:
    """("sub", axis) for `<axis>BLOCK_SUB`, ("block", axis) for `<axis>BLOCK` or `BLOCK_<axis>`, else None:
    a kwarg that merely contains BLOCK (`NUM_BLOCKS`, `USE_BLOCK_PTR`) is no tile extent."""
    if key.endswith("BLOCK_SUB"):
        return "sub", key[: -len("BLOCK_SUB")]
    if key.endswith("BLOCK") or key.startswith("BLOCK_"):
        return "block", key.replace("BLOCK", "", 1)
    return None


def _blocks_and_subs(config: Config) -> tuple[dict[str, float], dict[str, float]]:
    blocks: dict[str, float] = {}
    subs: dict[str, float] = {}
    for key, value in config.kwargs.items():
        number, part = _numeric(value), _tile_axis(key)
        if number is None or part is None:
            continue
        kind, axis = part
        (subs if kind == "sub" else blocks)[axis] = number
    return blocks, subs


def circle_num(config: Config) -> int:
    """How many times the kernel loops over its sub-tiles: the product over axes of ceil(BLOCK / SUB)."""
    blocks, subs = _blocks_and_subs(config)
    loops = 1
    for axis, block in blocks.items():
        sub = subs.get(axis)
        if sub is not None and sub > 0:
            loops *= math.ceil(block / sub)
    return loops


def _tile(config: Config) -> dict[str, float]:
    """The tile's extent per axis: the axis's sub-block where it has one, else its block."""
    blocks, subs = _blocks_and_subs(config)
    return {**blocks, **subs}


def _too_small(config: Config, least: int) -> bool:
    """Whether the config's tile holds fewer than `least` elements; a config whose kwargs name no tile has
    none to judge (its tile is not 1 element), so it is never too small."""
    return bool(_tile(config)) and tile_numel(config) < least


def tile_numel(config: Config) -> int:
    """Elements in one tile: the product over axes of the sub-block, or of the block where there is none."""
    numel = 1
    for part in _tile(config).values():
        if part > 0:
            numel *= int(part)
    return numel


def _shape_key(config: Config) -> tuple:
    """Two configs with the same loop count and tile shape behave alike: keep one.

    Every kwarg the tile and loop count do not read is part of the key (`USE_BLOCK_PTR`, a non-numeric
    `BLOCK_<axis>`): it changes the kernel, not the tile.
    """
    tile = _tile(config)
    others = sorted((k, v) for k, v in config.kwargs.items() if _tile_axis(k) is None or _numeric(v) is None)
    options = tuple(sorted(config.options.items()))  # maxnreg, num_ctas: a different kernel, not a twin
    return (circle_num(config), tuple(sorted(tile.items())), tuple(others), config.num_warps, config.num_stages,
            options)


def _spread(configs: list[Config], cap: int) -> list[Config]:
    """At most `cap` configs, evenly spaced along tile size so small, medium and large all stay."""
    if len(configs) <= cap:
        return configs
    ordered = sorted(configs, key=tile_numel)
    if cap == 1:
        return [ordered[0]]
    picks = sorted({round(i * (len(ordered) - 1) / (cap - 1)) for i in range(cap)})
    return [ordered[i] for i in picks]


def optimize_configs(
    configs: Sequence[Config],
    expert: Iterable[Config] = (),
    max_circle_num: int = MAX_CIRCLE_NUM,
    min_tile_numel: int = MIN_TILE_NUMEL,
    max_configs: int = MAX_CONFIGS,
) -> list[Config]:
    """The configs worth tuning, in their original order.

    Configs equal to one in `expert` are kept unconditionally. The others
    must loop at most `max_circle_num` times and hold at least
    `min_tile_numel` elements per tile (a config naming no tile passes
    that test); among those, one per tile shape is
    kept and at most `max_configs` (0: no cap; a negative one is refused
    rather than read as no cap) spread over tile sizes.
    When nothing would remain, the list is returned unchanged: pruning
    must never leave a kernel without a config.
    """
    cap = as_index(max_configs)  # a numpy integer too, as before the check; not True, nor 2.5
    if cap is None or cap < 0:
        raise ValueError(f"config optimizer: max_configs={max_configs!r} must be a whole number ≥ 0 (0: no cap)")
    configs = list(configs)
    if not configs:
        return []
    expert_ids = {c.identity for c in expert}
    kept_expert = [c for c in configs if c.identity in expert_ids]
    generated = [c for c in configs if c.identity not in expert_ids]
    passing = [c for c in generated if circle_num(c) <= max_circle_num and not _too_small(c, min_tile_numel)]
    unique: dict[tuple, Config] = {}
    for config in passing:
        unique.setdefault(_shape_key(config), config)
    sampled = list(unique.values())
    if cap > 0:
        sampled = _spread(sampled, cap)
    keep = {c.identity for c in kept_expert} | {c.identity for c in sampled}
    if not keep:
        log.warning("config optimizer: every config would be pruned; keeping all %d", len(configs))
        return configs
    result = [c for c in configs if c.identity in keep]
    log.info(
        "config optimizer: %d -> %d configs (%d expert kept; %d pass the filters, %d distinct)",
        len(configs),
        len(result),
        len(kept_expert),
        len(passing),
        len(unique),
    )
    return result
