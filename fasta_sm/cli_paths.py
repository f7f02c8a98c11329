"""What every command of `fasta-sm` and `fasta-sm record` shares: its path type, and its usage errors shown whole."""

from __future__ import annotations

from typing import Any

import click


class NamedPath(click.Path):
    """A path option that refuses an empty name, which pathlib reads as the working directory, and, for a file,
    `-`, which means standard output to a user and would name a file `-` in the working directory."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value:
            self.fail("is empty (an unset shell variable?): name a path", param, ctx)
        if value == "-" and not self.dir_okay and not self.allow_dash:
            self.fail("'-' is not standard output here: name a file (./- for a file named -)", param, ctx)
        return super().convert(value, param, ctx)


class _UsageInContext:
    """Usage errors printed whole: click's parser raises some (an option missing its value: `--seed` last on the
    line) with no context, and an error without one prints its `Error: ` line alone; the context is given here."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)  # type: ignore[misc]
        except click.UsageError as exc:
            if exc.ctx is None:
                exc.ctx = ctx
            raise


class UsageCommand(_UsageInContext, click.Command):
    """A command whose every usage error prints the usage before its `Error: ` line."""


class UsageGroup(_UsageInContext, click.Group):
    """A group whose usage errors, and its commands', print the usage before their `Error: ` line."""

    command_class = UsageCommand
