"""Turn a config list into numbers a surrogate can fit.

Every numeric kwarg that varies becomes a column, and so do `num_warps`,
`num_stages` and numeric launch options: the reference read kwargs only, so it
could not tell two configs apart that differ in warps or stages. Strings and
bools are categorical flags and are skipped, as are the kwargs in
`SKIPPED_KWARGS`, which name bookkeeping values rather than performance knobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...config import Config

SKIPPED_KWARGS = frozenset({"compile_mode", "multibuffer", "remain_programs", "using_programs"})


@dataclass(frozen=True)
class FeatureSpace:
    """The feature matrix of a config list.

    `raw` holds the values as given; `unit` is each column scaled to [0, 1]
    (after log2 when every value of the column is positive: tile sizes and
    warp counts act multiplicatively); `levels` holds each column's values as
    small integer codes, for the bases and votes that treat a column as
    categorical.
    """

    names: tuple[str, ...]
    raw: np.ndarray
    unit: np.ndarray
    levels: np.ndarray

    @property
    def dims(self) -> int:
        return len(self.names)


def column_index(names: tuple[str, ...], name: str) -> int | None:
    """Where `name` sits among a space's columns; None when the space does not vary it (one value, or absent)."""
    return names.index(name) if name in names else None


def _numeric(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _columns(configs: Sequence[Config]) -> dict[str, list[float | None]]:
    columns: dict[str, list[float | None]] = {}
    n = len(configs)
    for index, config in enumerate(configs):
        named = [(f"kwargs.{k}", v) for k, v in config.kwargs.items() if k not in SKIPPED_KWARGS]
        named += [("num_warps", config.num_warps), ("num_stages", config.num_stages)]
        named += [(f"options.{k}", v) for k, v in config.options.items()]
        for name, value in named:
            number = _numeric(value)
            if number is None:
                continue
            column = columns.get(name)
            if column is None:  # built once per name: `setdefault` would build a list of n for every value
                column = columns[name] = [None] * n
            column[index] = number
    return columns


def extract_features(configs: Sequence[Config], log2: bool = True) -> FeatureSpace:
    """Columns for every numeric knob that varies across `configs`.

    A config that lacks a kwarg others have gets the column's minimum, so a
    kwarg present on a few configs still separates them from the rest.
    """
    n = len(configs)
    kept: list[str] = []
    raw_columns: list[np.ndarray] = []
    for name, values in sorted(_columns(configs).items()):
        present = [v for v in values if v is not None]
        fill = min(present)
        column = np.array([fill if v is None else v for v in values], dtype=float)
        if np.unique(column).size > 1:
            kept.append(name)
            raw_columns.append(column)
    raw = np.column_stack(raw_columns) if raw_columns else np.zeros((n, 0))
    unit = np.empty_like(raw)
    levels = np.empty(raw.shape, dtype=np.int64)
    for j in range(raw.shape[1]):
        column = raw[:, j]
        scaled = np.log2(column) if log2 and np.all(column > 0) else column
        low, high = scaled.min(), scaled.max()
        unit[:, j] = (scaled - low) / (high - low)
        levels[:, j] = np.unique(column, return_inverse=True)[1]
    return FeatureSpace(names=tuple(kept), raw=raw, unit=unit, levels=levels)
