"""Synthetic config spaces that behave like GPU ones, as replay tables.

Each builder returns a dict in the replay-table format, so tests run the
same code path as the bench. Recorded noise is two repeats per config with a
relative spread drawn between `noise / 2` and `noise`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fasta_sm.backends.replay import ReplayTable, table_from_dict

SYNTHETIC = {"shape": {}, "device": "synthetic", "torch": "-", "triton": "-"}
"""The format's descriptive fields, for a table no device recorded."""


def _rows(
    grid: list[dict[str, Any]],
    duration: Callable[[int, dict[str, Any]], float | None],
    noise: float,
    rng: np.random.Generator,
) -> list[dict[str, Any]]:
    rows = []
    for index, point in enumerate(grid):
        kwargs = {k: v for k, v in point.items() if k not in ("num_warps", "num_stages")}
        value = duration(index, point)
        tile = math.prod(v for k, v in kwargs.items() if k.startswith("BLOCK"))
        compile_s = float(0.8 + 0.3 * math.log2(tile) + 0.2 * point.get("num_stages", 3) + rng.uniform(0, 0.3))
        row = {"kwargs": kwargs, "num_warps": point.get("num_warps", 4), "num_stages": point.get("num_stages", 3),
               "compile_s": compile_s}
        if value is None:
            row.update(duration_us=[], error="OutOfResources: shared memory")
        else:
            spread = rng.uniform(noise / 2, noise)
            row.update(duration_us=[float(value * (1 + spread * rng.standard_normal())) for _ in range(2)], error=None)
        rows.append(row)
    return rows


def matmul(
    seed: int, m: int = 4096, n: int = 4096, k: int = 4096, noise: float = 0.02, size: int | None = None
) -> dict:
    """A tile space with a roofline-ish cost, register and shared-memory limits."""
    rng = np.random.default_rng(seed)
    grid = [
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g, "num_warps": w, "num_stages": s}
        for bm, bn, bk, g, w, s in itertools.product(
            [16, 32, 64, 128, 256], [16, 32, 64, 128, 256], [16, 32, 64, 128], [1, 8], [2, 4, 8], [2, 3, 4, 5]
        )
    ]
    if size is not None:
        grid = [grid[i] for i in sorted(rng.choice(len(grid), size=size, replace=False))]
    quirk = rng.uniform(0.9, 1.1, size=(5, 5))

    def duration(_: int, p: dict[str, Any]) -> float | None:
        bm, bn, bk, w, s = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], p["num_warps"], p["num_stages"]
        if (bm + bn) * bk * 2 * s > 232_448 or bm * bn / (32 * w) > 256:
            return None
        tiles = math.ceil(m / bm) * math.ceil(n / bn)
        waves = math.ceil(tiles / 132)
        flops = 2 * bm * bn * k
        utilisation = min(1.0, (bm * bn) / (64 * 64 * w / 4)) * min(1.0, bk / 32)
        compute = flops / (1e6 * utilisation * min(w, 4) / 4 + 1e-9)
        memory = (bm + bn) * k * 2 / (2e3 * (1 + 0.3 * (p["GROUP_M"] > 1)))
        latency = 1.0 + 0.6 / s + (0.25 if s >= 5 and bk >= 128 else 0.0)
        per_tile = max(compute, memory) * latency
        return float(waves * per_tile * quirk[int(math.log2(bm)) - 4, int(math.log2(bn)) - 4] / 1e3 + 5.0)

    return {"kernel": f"synthetic_matmul_{seed}", **SYNTHETIC, "configs": _rows(grid, duration, noise, rng)}


def bowl(seed: int, noise: float = 0.01, levels: int = 8) -> dict:
    """A smooth bowl over three log2 tile sizes and the warp count."""
    rng = np.random.default_rng(seed)
    centre = rng.uniform(1.5, levels - 2.5, size=3)
    grid = [
        {"BLOCK_X": 2 ** (4 + a), "BLOCK_Y": 2 ** (4 + b), "BLOCK_Z": 2 ** (4 + c), "num_warps": w}
        for a, b, c, w in itertools.product(range(levels), range(levels), range(4), [2, 4, 8])
    ]

    def duration(_: int, p: dict[str, Any]) -> float:
        x = np.array([math.log2(p["BLOCK_X"]) - 4, math.log2(p["BLOCK_Y"]) - 4, math.log2(p["BLOCK_Z"]) - 4])
        return float(100.0 * (1 + 0.05 * np.sum((x - centre) ** 2) + 0.03 * abs(math.log2(p["num_warps"]) - 2)))

    return {"kernel": f"synthetic_bowl_{seed}", **SYNTHETIC, "configs": _rows(grid, duration, noise, rng)}


def needle(seed: int, noise: float = 0.01, count: int = 200) -> dict:
    """A flat plateau with small jitter and one config 10 % faster than all others."""
    rng = np.random.default_rng(seed)
    grid = [
        {"BLOCK_X": 2 ** (4 + a), "BLOCK_Y": 2 ** (4 + b), "num_warps": w, "num_stages": s}
        for a, b, w, s in itertools.product(range(5), range(5), [2, 4, 8], [2, 3, 4])
    ][:count]
    winner = int(rng.integers(len(grid)))
    jitter = rng.uniform(0.0, 0.03, size=len(grid))

    def duration(index: int, _: dict[str, Any]) -> float:
        return 50.0 * (0.9 if index == winner else 1.0 + jitter[index])

    return {"kernel": f"synthetic_needle_{seed}", **SYNTHETIC, "configs": _rows(grid, duration, noise, rng)}


def flags(seed: int, count: int = 12) -> dict:
    """Configs that differ only in a string flag: no numeric feature at all (D = 0)."""
    rng = np.random.default_rng(seed)
    rows = [
        {"kwargs": {"MODE": f"m{i}"}, "num_warps": 4, "num_stages": 3, "compile_s": 0.5,
         "duration_us": [float(v)] * 2, "error": None}
        for i, v in enumerate(rng.uniform(10, 20, size=count))
    ]
    return {"kernel": f"synthetic_flags_{seed}", **SYNTHETIC, "configs": rows}


def as_table(data: dict) -> ReplayTable:
    return table_from_dict(data, data["kernel"])
