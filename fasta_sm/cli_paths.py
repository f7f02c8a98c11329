"""The path type of every command's path options, shared by `fasta-sm` and `fasta-sm record`."""

from __future__ import annotations

from typing import Any

import click


class NamedPath(click.Path):
    """A path option that refuses an empty name, which pathlib reads as the working directory."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value:
            self.fail("is empty (an unset shell variable?): name a path", param, ctx)
        return super().convert(value, param, ctx)
