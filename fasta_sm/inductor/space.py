"""The tile generator: a config space worth tuning for Inductor's pointwise and reduction kernels.

Inductor's own lists are tiny (1-6 configs), so a sample-efficient tuner has
nothing to gain there. This spans the block sizes the kernel already takes
(never adding a kwarg the kernel lacks), warps and stages, within bounds that
keep every config legal for Inductor's codegen and the device:

- a block of axis a is a power of two, 1 when a's size hint is 1, at most
  `TRITON_MAX_BLOCK` and at most the size hint rounded up to a power of two;
  Y and Z blocks keep their grid dimension within 65,535;
- `min_xblock` / `min_rblock` from the kernel's metadata are floors;
- a persistent reduction's R blocks cover the whole reduction;
- the tile (product of blocks, the reduction included for a persistent
  reduction) lies in [`MIN_TILE`, `max_tile`]: below is idle lanes, above is
  register spills; `max_tile` is `MAX_TILE[kind]`, or larger when one of
  Inductor's own configs is larger;
- num_warps is a power of two, at most 16 and `max_threads_per_block /
  warp_size`, with no more threads than tile elements (one warp at least);
- num_stages is 1 where nothing loops (pointwise, persistent), 1-2 for looped
  reductions.

Inductor's own configs come first and are always kept; when the space is
larger than `max_configs`, a fixed-seed sample of the generated ones is kept,
so a worker and the parent (and the next run) build the same list.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..config import Config

KINDS = ("pointwise", "reduction", "persistent_reduction")
AXIS_OF_BLOCK = {"XBLOCK": "x", "YBLOCK": "y", "ZBLOCK": "z", "R0_BLOCK": "r0_", "R1_BLOCK": "r1_"}
MAX_BLOCK = {"XBLOCK": 4096, "YBLOCK": 1024, "ZBLOCK": 1024, "R0_BLOCK": 4096, "R1_BLOCK": 2048}
"""Inductor's TRITON_MAX_BLOCK (CUDA; R without the multi-kernel factor)."""
MAX_GRID_YZ = 65535
MIN_TILE = 128
MAX_TILE = {"pointwise": 4096, "reduction": 8192, "persistent_reduction": 8192}
WARPS = (1, 2, 4, 8, 16)
STAGES = {"pointwise": (1,), "reduction": (1, 2), "persistent_reduction": (1,)}


@dataclass(frozen=True)
class DeviceLimits:
    warp_size: int = 32
    max_threads_per_block: int = 1024


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _pow2_range(lo: int, hi: int) -> list[int]:
    out, value = [], 1
    while value <= hi:
        if value >= lo:
            out.append(value)
        value *= 2
    return out


def block_choices(kind: str, block: str, size_hints: Mapping[str, int], floors: Mapping[str, int]) -> list[int]:
    """Legal values of one block kwarg (see the module docstring)."""
    axis = AXIS_OF_BLOCK[block]
    size = int(size_hints.get(axis, 1))
    if size <= 1:
        return [1]
    hi = min(MAX_BLOCK[block], next_pow2(size))
    if kind == "persistent_reduction" and block.startswith("R"):
        return [next_pow2(size)]
    lo = next_pow2(floors.get(block, 1))
    if block in ("YBLOCK", "ZBLOCK"):
        lo = max(lo, next_pow2(-(-size // MAX_GRID_YZ)))
    return _pow2_range(lo, hi) or [hi]


def tile_numel(kind: str, kwargs: Mapping[str, int], size_hints: Mapping[str, int]) -> int:
    numel = 1
    for block, axis in AXIS_OF_BLOCK.items():
        if block in kwargs:
            numel *= int(kwargs[block])
        elif kind == "persistent_reduction" and axis.startswith("r") and axis in size_hints:
            numel *= next_pow2(int(size_hints[axis]))
    return numel


def is_legal(
    kind: str,
    config: Config,
    size_hints: Mapping[str, int],
    limits: DeviceLimits,
    floors: Mapping[str, int],
    max_tile: int,
) -> bool:
    """Whether a generated config keeps every bound of the module docstring."""
    for block in AXIS_OF_BLOCK:
        if block in config.kwargs and config.kwargs[block] not in block_choices(kind, block, size_hints, floors):
            return False
    numel = tile_numel(kind, config.kwargs, size_hints)
    full = 1
    for block in AXIS_OF_BLOCK:
        if block in config.kwargs:
            full *= block_choices(kind, block, size_hints, floors)[-1]
    if not min(MIN_TILE, full) <= numel <= max_tile:
        return False
    max_warps = min(WARPS[-1], limits.max_threads_per_block // limits.warp_size)
    if config.num_warps not in WARPS or config.num_warps > max_warps:
        return False
    if config.num_warps > 1 and config.num_warps * limits.warp_size > numel:
        return False
    return config.num_stages in STAGES[kind]


def generate_space(
    kind: str,
    size_hints: Mapping[str, int],
    defaults: Sequence[Config],
    *,
    limits: DeviceLimits = DeviceLimits(),
    floors: Mapping[str, int] | None = None,
    max_configs: int = 64,
) -> list[Config]:
    """Inductor's `defaults` first, then generated configs up to `max_configs` in all (the defaults are kept even
    when they alone are more).

    Returns the defaults alone when they disagree on anything but blocks,
    warps and stages (a kernel variant this generator does not understand).
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; expected one of {', '.join(KINDS)}")
    floors = dict(floors or {})
    defaults = list(defaults)
    if not defaults:
        return []
    blocks = [b for b in AXIS_OF_BLOCK if all(b in d.kwargs for d in defaults)]
    fixed = [{k: v for k, v in d.kwargs.items() if k not in blocks} for d in defaults]
    options = [dict(d.options) for d in defaults]
    if any(f != fixed[0] for f in fixed) or any(o != options[0] for o in options):
        return defaults
    max_tile = max([MAX_TILE[kind]] + [tile_numel(kind, d.kwargs, size_hints) for d in defaults])
    stages = sorted(set(STAGES[kind]))
    seen = {d.identity for d in defaults}
    generated = []
    for values in itertools.product(*(block_choices(kind, b, size_hints, floors) for b in blocks)):
        kwargs = {**fixed[0], **dict(zip(blocks, values))}
        for warps, stage in itertools.product(WARPS, stages):
            config = Config(kwargs=kwargs, num_warps=warps, num_stages=stage, options=options[0])
            if config.identity in seen or not is_legal(kind, config, size_hints, limits, floors, max_tile):
                continue
            seen.add(config.identity)
            generated.append(config)
    room = max(0, max_configs - len(defaults))
    if len(generated) > room:
        seed = hashlib.sha256(repr((kind, sorted(size_hints.items()), [d.identity for d in defaults])).encode())
        rng = np.random.default_rng(int.from_bytes(seed.digest()[:8], "little"))
        keep = np.sort(rng.choice(len(generated), size=room, replace=False))
        generated = [generated[i] for i in keep]
    return defaults + generated
