"""The toy replay table the CLI and engine-level tests share, in the shared replay format.

Tests import it by this name (a `from conftest import` would find whichever
test directory's conftest was loaded last).
"""

from __future__ import annotations

import json
from pathlib import Path


def write_table(path: Path, kernel: str = "toy_mm", fail_big: bool = True) -> Path:
    """A 48-config tile space with a smooth optimum, a 1% recorded spread and OOR failures."""
    rows = []
    for block_m in (16, 32, 64, 128):
        for block_n in (16, 32, 64, 128):
            for warps in (2, 4, 8):
                failed = fail_big and block_m * block_n >= 16384
                mean = 100 + 10 * abs(block_m.bit_length() - 6) + 8 * abs(block_n.bit_length() - 7) + warps
                rows.append({
                    "kwargs": {"BLOCK_M": block_m, "BLOCK_N": block_n},
                    "num_warps": warps,
                    "num_stages": 2,
                    "compile_s": 0.5 + block_m * block_n / 16384,
                    "duration_us": [] if failed else [mean * 0.995, mean * 1.005],
                    "error": "OutOfResources: shared memory" if failed else None,
                })
    table = {"kernel": kernel, "shape": {"M": 512}, "device": "test", "torch": "-", "triton": "-", "configs": rows}
    path.write_text(json.dumps(table))
    return path
