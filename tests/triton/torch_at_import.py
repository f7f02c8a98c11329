"""A module that uses torch when imported, as many kernel modules do (a dtype table, a device)."""

from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32}


class _NoCompile:
    def warmup(self, *args, **kwargs) -> None:
        """Compiles nothing: importing this module is the point."""


noop = _NoCompile()
