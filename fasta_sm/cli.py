"""The `fasta-sm` command: tune on a replay table, list, show, draw and report tunes."""

from __future__ import annotations

import ast
import contextlib
import csv
import io
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import numpy as np
from click.core import ParameterSource
from rich.console import Console
from rich.logging import RichHandler
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from . import __version__
from .backends.replay import CACHE_HIT_S, DISTURBED_SPREAD, ReplayBackend, ReplayTable, load_table
from .cli_paths import NamedPath, UsageGroup
from .config import Config
from .data import DEFAULT_TABLE, table_names, table_path
from .env import env_value
from .errors import FastaError, PolicyError, StateDirError, StateFileError, TableError
from .explain import ConfigStory, check_index, explain_configs, picked_in, predicted_at_pick
from .files import read_regular
from .plot import PLOT_SUFFIXES
from .policies import make_policy, named_parameters, policy_names, require_listed, with_environment
from .render import age_of, format_us, kernel_labels, key_values, printable, state_to_json, tune_label
from .report import tune_costs
from .state import SEED_MAX, RoundRecord, TuneState
from .store import STATE_DIR_ENV, STATE_SUFFIX, StateStore, default_state_dir, is_superseded, store_file_kind
from .triton.cli import record_command

console = Console(markup=False, emoji=False)
"""No markup, no emoji codes: kernel names, errors and file names are data, and `[...]` or `:b:` in them must
print as it is."""
notes = Console(stderr=True, markup=False, emoji=False, soft_wrap=True)
"""Where a command says what it wrote, so that its standard output stays what it prints (JSON, say)."""
state_dir_option = click.option(
    "--state-dir",
    type=NamedPath(file_okay=False, path_type=Path),
    default=None,
    help="State directory (default: $FASTA_SM_STATE_DIR, else the per-user cache dir).",
)
tables_dir_option = click.option(
    "--tables",
    "tables_dir",
    type=NamedPath(file_okay=False, path_type=Path),
    default=None,
    help="Directory of replay tables (default: the shipped H200 tables).",
)


def budget_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--budget F`: a fraction in (0, 1], refused as a usage error before any table is read."""
    return click.option(
        "--budget", default=None, type=float, callback=lambda _ctx, _param, value: _fraction(value), help=help_text
    )


class _StderrHandler(logging.StreamHandler):
    """Writes to `sys.stderr` as it is when a record comes, not as it was when the handler was made (click's
    test runner, or a notebook running the command twice, swaps it)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _QuietRollback(logging.Filter):
    """Drops the engine's "state kept at the last checkpoint" warning, whose error the command's own
    `Error: ` line then says (errors print one line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from .machine import ROLLBACK  # the engine is imported by the commands that tune, not by `ls`

        return not getattr(record, ROLLBACK, False)


@contextlib.contextmanager
def _rollback_told_by_the_error() -> Iterator[None]:
    """Without -v, a handler error that ends the tune is said once, by the `Error: ` line, not also warned."""
    machine_log = logging.getLogger("fasta_sm.machine")
    if machine_log.getEffectiveLevel() <= logging.INFO:  # -v: the engine's steps, this warning among them
        yield
        return
    quiet = _QuietRollback()
    machine_log.addFilter(quiet)
    try:
        yield
    finally:
        machine_log.removeFilter(quiet)


_COMMAND_ARGS = "fasta_sm.command_args"


class _MainGroup(UsageGroup):
    """Keeps what follows the command's name, so that a check on the group's own options can still let the
    command's `--help` through (`fasta-sm --state-dir X tables --help` shows tables' help)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        ctx.meta[_COMMAND_ARGS] = list(rest)
        return name, command, rest


@click.group(cls=_MainGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fasta-sm")
@click.option("-v", "--verbose", is_flag=True, help="Log what the engine does.")
@click.option(
    "--state-dir",
    "root_state_dir",
    type=NamedPath(file_okay=False, path_type=Path),
    default=None,
    help="State directory for the command that follows, unless it names its own.",
)
@click.pass_context
def main(ctx: click.Context, verbose: bool, root_state_dir: Path | None) -> None:
    """Durable, sample-efficient autotuning for Triton kernels."""
    command = main.get_command(ctx, ctx.invoked_subcommand) if ctx.invoked_subcommand else None
    if root_state_dir is not None and command is not None and not _reads_state(command):
        _help_if_asked(ctx, command)
        readers = ", ".join(name for name in main.list_commands(ctx) if _reads_state(main.get_command(ctx, name)))
        raise click.UsageError(f"--state-dir is for the commands that read or write tunes ({readers}); "
                               f"{ctx.invoked_subcommand} takes none")
    ctx.obj = {"state_dir": root_state_dir}
    errors = Console(stderr=True, markup=False, emoji=False)
    if errors.is_terminal:
        handler: logging.Handler = RichHandler(console=errors, show_path=False, markup=False)
        layout = "%(message)s"
    else:  # one line per record into a pipe or a file, never wrapped: file names in it are what a user greps for
        handler, layout = _StderrHandler(), "%(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.WARNING, format=layout, handlers=[handler])
    if verbose:  # fasta-sm's own steps; the state machine library's callbacks stay quiet
        logging.getLogger("fasta_sm").setLevel(logging.INFO)


def _reads_state(command: click.Command | None) -> bool:
    return command is not None and any(param.name == "state_dir" for param in command.params)


def _help_if_asked(ctx: click.Context, command: click.Command) -> None:
    """Show the command's help and exit, as click does before any check, where its arguments ask for it."""
    args = ctx.meta.get(_COMMAND_ARGS, [])
    options = args[:args.index("--")] if "--" in args else args
    if any(arg in command.get_help_option_names(ctx) for arg in options):
        command.make_context(ctx.invoked_subcommand, list(args), parent=ctx)  # prints the help, exits


@main.command()
@click.option(
    "--replay",
    "table",
    metavar="TABLE",
    default=None,
    help=f"Replay table: a path, or the name of a shipped table (default: {DEFAULT_TABLE}).",
)
@click.option("--policy", default="fasta", show_default=True, callback=lambda _ctx, _param, name: _known_policy(name),
              help="Search policy.")
@click.option(
    "--seed", default=0, show_default=True, type=click.IntRange(0, SEED_MAX),
    help="Seed for the policy and the replay noise.",
)
@budget_option("Budget as a fraction of the space (policy default if unset).")
@click.option(
    "--noise/--no-noise", default=True, show_default=True, help="Replay with seeded noise matching the recorded spread."
)
@state_dir_option
def tune(table: str | None, policy: str, seed: int, budget: float | None, noise: bool, state_dir: Path | None) -> None:
    """Tune a kernel by replaying its recorded table; a second run reuses the DONE state."""
    from .tuner import tune as run_tune

    path = table_path(DEFAULT_TABLE if table is None else table)
    replay = load_table(path)
    _note_defects(path, replay)
    params = {} if budget is None else {"budget": budget}
    try:  # a policy that cannot take the budget is refused before anything is written to the state dir
        make_policy(policy, replay.configs, with_environment(policy, params))
    except PolicyError as exc:
        if budget is not None and _builds(policy, replay.configs):  # the command line's budget, a usage error
            raise click.BadParameter(f"kernel {replay.kernel!r}: {exc}", param_hint="--budget") from None
        raise PolicyError(f"kernel {replay.kernel!r}: {exc}") from None
    store = StateStore(_given_state_dir(state_dir))
    key = f"replay/{replay.kernel}/{replay.fingerprint}/{policy}/seed={seed}/budget={budget}/noise={noise}"
    n = len(replay.configs)
    with Progress(
        TextColumn("{task.description}", style="bold", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[position]}", markup=False),
        TextColumn("best {task.fields[best]}", markup=False),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,  # a pipe or a file gets the table alone
    ) as progress:
        task = progress.add_task(replay.kernel, total=n, position="", best="-")

        def on_step(state: TuneState) -> None:
            progress.update(
                task,
                completed=state.tried_count(),
                position=state.position(),
                best=format_us(state.best_us),
            )

        try:
            with _rollback_told_by_the_error():
                result = run_tune(
                    key,
                    replay.kernel,
                    replay.configs,
                    ReplayBackend(replay, noise=noise, seed=seed),
                    policy=policy,
                    policy_params=params,
                    seed=seed,
                    store=store,
                    on_step=on_step,
                )
        except KeyboardInterrupt:
            notes.print("interrupted: the tune keeps every step it finished, and the same command resumes it")
            raise
    state = result.state
    costs = tune_costs(state, replay.exhaustive_cost_s)
    best_true = replay.true_best_us
    picked_true = float(replay.mean_us[result.best_index])
    summary = Table.grid(padding=(0, 2))
    recorded_on = replay.meta.get("device", "?")
    configs = f"{n} config" if n == 1 else f"{n} configs"
    summary.add_row("kernel", f"{replay.kernel}  (replayed from a table recorded on {recorded_on}, {configs})")
    summary.add_row(
        "state",
        Text.assemble(
            str(store.file_for(key)), ("  (reused: nothing compiled or timed)" if result.reused else "", "green")
        ),
    )
    summary.add_row("winner", f"#{result.best_index} {result.best_config.label()}")
    summary.add_row("measured", f"{format_us(result.best_us)} (recorded mean {format_us(picked_true)})")
    tried = state.tried_count()
    rounds = len(state.rounds)
    span = state.rounds[0].name + (f" to {state.rounds[-1].name}" if rounds > 1 else "") if rounds else "none"
    summary.add_row(
        "configs tried",
        f"{tried}/{n} ({tried / n:.0%}): {state.measured_count()} ran, {len(state.failed)} failed; "
        f"{_timings(state.evaluations())} in {rounds} round{'s' if rounds != 1 else ''} ({span})",
    )
    summary.add_row(
        "tuning cost",
        f"{costs.spent_s:.1f} s = compile {state.cost.compile_s:.1f} s + benchmark "
        f"{state.cost.benchmark_s:.1f} s (and policy {state.cost.policy_s * 1000:.1f} ms); "
        f"{_cell(costs.spent_pct)}% of exhaustive ({_cell(costs.exhaustive_s)} s, the table's cost of every config; "
        "`report` estimates it from the tune instead)",
    )
    summary.add_row(
        "regret", f"{(picked_true - best_true) / best_true:.2%} against the table's true best {format_us(best_true)}"
    )
    summary.add_row("stopped", state.stop_reason or "-")
    _print_table(summary)


@main.command("ls")
@state_dir_option
def list_states(state_dir: Path | None) -> None:
    """One line per state file: file, kernel, policy, position, round, measured/N, best, age, lock."""
    store = _existing_store(state_dir)
    if store is None:
        return
    table = Table("file", "kernel", "policy", "position", "round", "measured/N", "best", "age", "locked", box=None)
    table.columns[0].no_wrap = True  # the name is what `show` takes: never cut it
    read: list[tuple[Path, TuneState | Exception]] = []
    for path in store.state_files():
        try:
            read.append((path, store.read_listed(path)))
        except (StateFileError, OSError) as exc:
            read.append((path, exc))
    states = [state for _, state in read if isinstance(state, TuneState)]
    label_of = {id(state): printable(label) for state, label in zip(states, kernel_labels(states))}
    for path, state in read:
        locked = {True: "yes", False: "no", None: "?"}[store.is_locked(path)]
        if not isinstance(state, TuneState):
            table.add_row(printable(path.name), Text(printable(_unreadable_cell(path, state)), style="red"), "", "",
                          "", "", "", "", locked)
            continue
        table.add_row(
            printable(path.name),
            label_of[id(state)],
            tune_label(state),
            state.status(),
            str(state.round),
            f"{state.measured_count()}/{state.n_configs}",
            format_us(state.best_us),
            age_of(state),
            locked,
        )
    if not table.row_count:
        notes.print(f"no state files in {store.path}")
    else:
        _print_table(table)
    aside = store.set_aside_files()
    if aside:
        corrupt = sum(".corrupt-" in path.name for path in aside)
        notes.print(
            f"{len(aside)} state file{'s' if len(aside) > 1 else ''} set aside in {store.path}: "
            f"{corrupt} unreadable (.corrupt-*; never read again, yours to inspect; `fasta-sm clean` removes them) and "
            f"{len(aside) - corrupt} superseded (.superseded-*; their results carry into their key's next tune "
            "after another change of settings)"
        )


@main.command()
@click.option(
    "--superseded",
    is_flag=True,
    help="Also remove superseded states (.superseded-*), whose results would carry into their key's next tune "
    "after another change of its settings.",
)
@click.option("--dry-run", is_flag=True, help="Name what would be removed; remove nothing.")
@state_dir_option
def clean(superseded: bool, dry_run: bool, state_dir: Path | None) -> None:
    """Remove the state files set aside: quarantined ones (.corrupt-*), with --superseded superseded ones too.

    Finished and unfinished tunes, and lock files, are never touched; a
    superseded state whose kernel is being tuned right now is kept.
    """
    store = _existing_store(state_dir)
    if store is None:
        return
    aside = store.set_aside_files()
    superseded_count = sum(map(is_superseded, aside))
    chosen, folders = [], []
    for path in aside:
        if not superseded and is_superseded(path):
            continue
        if store.is_directory(path):
            folders.append(path.name)  # never deleted, tree and all
        else:
            chosen.append(path)
    busy, failed = [], []
    for path in chosen:
        if dry_run:  # what clean would do, found without taking a lock (that would create lock files)
            if store.set_aside_in_use(path):
                busy.append(path.name)
            else:
                click.echo(f"would remove {path.name}")
            continue
        try:
            if store.remove_set_aside(path):
                click.echo(f"removed {path.name}")
            else:
                busy.append(path.name)
        except StateDirError as exc:
            failed.append(str(exc))
    done = len(chosen) - len(busy) - len(failed)
    if not aside:
        notes.print(f"nothing set aside in {store.path}")
    else:
        verb = "would remove" if dry_run else "removed"
        files = f"{len(aside)} state file{'s' if len(aside) != 1 else ''}"
        notes.print(f"{verb} {done} of the {files} set aside in {store.path}")
    left = superseded_count if not superseded else 0
    if left:
        notes.print(f"{left} superseded kept (--superseded removes them too)")
    if folders:
        notes.print(f"kept {len(folders)} set aside that {'is a directory' if len(folders) == 1 else 'are directories'}"
                    f" (clean removes files only; yours to inspect and delete): {', '.join(folders)}")
    if busy:
        notes.print(f"{'would keep' if dry_run else 'kept'} {len(busy)} superseded whose kernel is being tuned now: "
                    f"{', '.join(busy)}")
    if failed:
        raise click.ClickException("; ".join(failed))


def _unreadable_cell(path: Path, error: Exception) -> str:
    """Why `ls` cannot read a file, said once: the row already names the file, and some errors say unreadable."""
    why = str(error).removeprefix(f"{path}: ")
    return why if why.startswith("unreadable") else f"unreadable: {why}"


@main.command()
@click.argument("key_or_file")
@click.option("--json", "as_json", is_flag=True, help="The stable JSON form (docs/state-format.md).")
@click.option(
    "--plot",
    type=NamedPath(dir_okay=False, path_type=Path),
    default=None,
    help="Draw measured vs predicted durations per round to a PNG or SVG.",
)
@click.option(
    "--top",
    default=20,
    show_default=True,
    type=click.IntRange(min=1),
    help="Measured configs to list (all with --json).",
)
@click.option(
    "--config",
    "configs",
    multiple=True,
    type=int,
    metavar="INDEX",
    help="Only this config's part in the tune (repeatable): when it was measured, or why it never was "
    "(its final prediction, and the rule that ruled it out, if one did).",
)
@state_dir_option
def show(
    key_or_file: str, as_json: bool, plot: Path | None, top: int, configs: tuple[int, ...], state_dir: Path | None
) -> None:
    """One state in full: position, rounds, measured configs by speed, failures, why it stopped."""
    if plot is not None and plot.suffix.lower() not in PLOT_SUFFIXES:
        raise click.BadParameter(f"{plot}: name a file ending in .png or .svg", param_hint="--plot")
    _check_directory_of("--plot", plot)
    given = Path(key_or_file).expanduser()
    directory = _state_dir_path(state_dir)
    in_store = not given.is_file() and directory.is_dir()
    path = StateStore(directory, lock_timeout_s=0).resolve(key_or_file) if in_store else given
    if in_store and not os.path.lexists(path):  # a file name as `ls` prints it, a control character escaped
        path = _listed_as_printed(StateStore(directory, lock_timeout_s=0), key_or_file) or path
    with_suffix = Path(key_or_file + STATE_SUFFIX).expanduser()
    if "/" in key_or_file and not os.path.lexists(path) and with_suffix.is_file():  # a path typed without `.fsm`
        path = with_suffix
    try:
        state = StateStore.read_listed(path)
    except StateFileError as exc:  # there, as `ls` lists it, but unreadable: said as `ls` says it
        hint = " (it is JSON: a state's rendering, as `show --json` writes; show reads the .fsm state file)"
        raise click.ClickException(str(exc) + (hint if _is_json_object(path) else "")) from None
    except FileNotFoundError:
        if key_or_file.endswith(".fsm") or ("/" in key_or_file and given.parent.is_dir()):
            if given.is_dir():
                raise click.ClickException(f"{key_or_file!r} is a directory, not a state file") from None
            raise click.ClickException(f"no state file {key_or_file!r}") from None
        if not in_store:
            not_dir = " (it is not a directory)" if directory.exists() else ""
            missing = f"no state file for the key {key_or_file!r} (no state dir {directory}{not_dir})"
            raise click.ClickException(missing) from None
        path, state = _tune_of_kernel(StateStore(directory, lock_timeout_s=0), key_or_file, path)
    for index in configs:
        try:
            check_index(state, index)
        except ValueError as exc:
            raise click.ClickException(f"--config {index}: {exc}") from None
    if plot is not None:
        from .plot import plot_tune

        try:
            with _writing("--plot", plot):
                written = plot_tune(state, plot)
        except (ImportError, ValueError) as exc:
            raise click.ClickException(f"--plot {plot}: {exc}") from None
        notes.print(f"wrote {written}")
    stories = explain_configs(state, list(configs)) if configs else []
    if as_json:
        rendered = state_to_json(state)
        if configs:
            rendered["explained"] = [story.to_json() for story in stories]
        click.echo(json.dumps(rendered, indent=2, sort_keys=True))
        return
    if configs:
        _print_stories(state, path, stories)
        return
    _print_state(state, path, top)


def _print_stories(state: TuneState, path: Path, stories: list[ConfigStory]) -> None:
    """`show --config`: the tune in a line, then each config's part in it."""
    head = Table.grid(padding=(0, 2))
    head.add_row("file", printable(str(path)))
    head.add_row("kernel", f"{printable(state.kernel)}   {state.position()}   best {_best_line(state)}")
    for story in stories:
        head.add_row(f"#{story.index}", f"{story.label}  ({story.status})")
        for line in story.lines:
            head.add_row("", line)
    _print_table(head)


def _is_json_object(path: Path) -> bool:
    """Whether the file holds a JSON object: a state's rendering given where its state file was meant."""
    try:  # a larger file is cut short, so no JSON: a rendering is a fraction of that
        return isinstance(json.loads(read_regular(path, 1 << 24)), dict)
    except (OSError, ValueError, RecursionError):
        return False


def _listed_as_printed(store: StateStore, name: str) -> Path | None:
    """The state file `ls` lists as `name` (with or without `.fsm`) where its name prints escaped (a newline, an
    undecodable byte), so that the name `ls` prints finds it."""
    found = [path for path in store.state_files() if printable(path.name) in (name, name + STATE_SUFFIX)]
    return found[0] if len(found) == 1 else None


def _tune_of_kernel(store: StateStore, kernel: str, looked_for: Path) -> tuple[Path, TuneState]:
    """The one tune in `store` of the kernel named `kernel` (as `ls` lists it), for `show KERNEL`."""
    readable, unreadable = [], []
    for path in store.state_files():
        try:
            readable.append((path, StateStore.read(path)))
        except (OSError, FastaError):
            unreadable.append(path.name)
    found = [(path, state) for path, state in readable if state.kernel == kernel]
    if not found:  # as `ls` prints it: a control character in the name escaped
        found = [(path, state) for path, state in readable if printable(state.kernel) == kernel]
    if not found:  # `add_kernel` for the `module.add_kernel` a Triton tune records
        found = [(path, state) for path, state in readable if state.kernel.endswith("." + kernel)
                 or printable(state.kernel).endswith("." + kernel)]
    if len(found) == 1:
        if unreadable:
            notes.print(
                f"note: {len(unreadable)} other file{'s' if len(unreadable) > 1 else ''} in {store.path} cannot be "
                f"read and may hold another tune of {kernel!r}: {', '.join(unreadable)}"
            )
        return found[0]
    if found:
        tunes = "".join(f"\n  {path.name}  {state.kernel} {key_values(state)}" for path, state in found)
        raise click.ClickException(f"kernel {kernel!r} has {len(found)} tunes here; name one by its file:{tunes}")
    maybe = (
        f"; {len(unreadable)} file{'s' if len(unreadable) > 1 else ''} there cannot be read and may hold it: "
        + ", ".join(unreadable)
        if unreadable
        else ""
    )
    raise click.ClickException(
        f"no state file for the key or kernel {kernel!r} (looked for {looked_for}, and for a tune of that kernel "
        f"in {store.path}: `fasta-sm ls` lists them){maybe}"
    )


def _print_state(state: TuneState, path: Path, top: int) -> None:
    head = Table.grid(padding=(0, 2))
    head.add_row("file", printable(str(path)))
    head.add_row("kernel", f"{printable(state.kernel)}   key {state.key!r}")
    head.add_row("position", state.position())
    head.add_row("policy", f"{state.policy} {state.policy_params or ''}  seed {state.seed}")
    unlike, absent = _params_unlike_defaults(state)
    if unlike:
        head.add_row("", "stored params unlike today's defaults: " + ", ".join(f"{k}={v!r}" for k, v in unlike.items()))
    if absent:
        head.add_row("", "not stored (older version; the policy's own fallback applies): " + ", ".join(absent))
    head.add_row("backend", state.backend)
    head.add_row(
        "measured",
        f"{state.measured_count()}/{state.n_configs} configs, {_timings(state.evaluations())}, "
        f"{len(state.failed)} failed",
    )
    head.add_row("best", _best_line(state))
    head.add_row(
        "cost",
        f"compile {state.cost.compile_s:.2f} s, benchmark {state.cost.benchmark_s:.2f} s, "
        f"policy {state.cost.policy_s * 1000:.1f} ms",
    )
    if state.done:
        head.add_row("stopped", state.stop_reason or "-")
    elif state.no_winner:
        head.add_row("stopped", f"with no winner: none of the {len(state.failed)} configs tried ran (last error); "
                                "running it again stops the same way")
    else:
        head.add_row("stopped", "(not finished: resumes at the position above)")
        pending = set(state.pending)
        failed = pending & set(state.failed)
        timed = set(state.round_done) - failed  # a config that failed at run time is in round_done too
        waiting = state.untimed()
        uncompiled = set(state.uncompiled())
        if uncompiled:
            compiled = [i for i in waiting if i not in uncompiled]
            not_yet = [i for i in waiting if i in uncompiled]
            which = f"compiled: {_indices(compiled)}; not compiled yet: {_indices(not_yet)}"
        else:
            which = _indices(waiting)
        head.add_row(
            "pending",
            f"{len(state.pending)} config{'s' if len(state.pending) != 1 else ''} in this round "
            f"({len(timed)} timed, {len(failed)} failed); "
            f"{len(waiting)} to time: {which}",
        )
    if state.last_error:
        if state.done:  # the tune resumed and finished after it: history, not a problem now
            head.add_row("last error", Text(f"{state.last_error} (resumed since, and finished)", style="yellow"))
        elif not state.last_error.startswith(f"{state.position()}: "):  # the tune has moved on since
            head.add_row("last error", Text(f"{state.last_error} (resumed since)", style="yellow"))
        else:
            head.add_row("last error", Text(state.last_error, style="red"))
    for note in state.restarts:
        head.add_row("restarted", note)
    if state.carried_taken:
        head.add_row("carried", _carried_line(state))
    _print_table(head)

    # a round's policy time is booked after its results, choosing what follows it: the header says so
    rounds = Table("round", "batch", "why", "compile s", "bench s", "policy ms (after)", title="Rounds")
    for group in _round_groups(state.rounds):
        first, last = group[0], group[-1]
        if not first.retime:
            name, batch, why = first.name, str(len(first.batch)), first.reason
        else:
            span = first.name if len(group) == 1 else f"{first.name}–{last.name}"
            name = span + (" (re-time)" if len(group) == 1 else f" (re-time ×{len(group)})")
            batch = str(len(first.batch)) + ("" if len(group) == 1 else " each")
            why = f"{first.reason}: {_indices(sorted(first.batch))}"
        rounds.add_row(
            name,
            batch,
            why,
            f"{sum(r.compile_s for r in group):.2f}",
            f"{sum(r.benchmark_s for r in group):.2f}",
            f"{sum(r.policy_s for r in group) * 1000:.2f}",
        )
    _print_table(rounds)

    picked = picked_in(state)
    measured = Table(
        "#",
        "round",
        "config",
        "mean",
        "timings",
        "range",
        "pred @ pick",
        "final pred",
        "compile s",
        title=f"Measured, fastest first (top {min(top, state.measured_count())} of {state.measured_count()})",
    )
    at_pick = predicted_at_pick(state)
    for index in sorted(state.durations, key=lambda i: (state.mean_us(i), i))[:top]:
        final = state.predicted_us[index] if state.predicted_us else None
        measured.add_row(
            str(index),
            picked.get(index, "-"),
            state.configs[index].label(),
            format_us(state.mean_us(index)),
            str(len(state.durations[index])),
            _timing_range(state.durations[index]),
            format_us(at_pick.get(index)),
            format_us(final),
            f"{state.compiled.get(index, float('nan')):.2f}",
        )
    if state.durations:
        _print_table(measured)
    else:
        console.print(f"Measured: none ({'no config ran' if state.no_winner else 'no config timed yet'})")
    if state.failed:
        failed = Table("#", "round", "config", "error", title="Failed")
        for index in sorted(state.failed):
            failed.add_row(str(index), picked.get(index, "-"), state.configs[index].label(), state.failed[index])
        _print_table(failed)


def _timings(count: int) -> str:
    return f"{count} timing{'s' if count != 1 else ''}"


def _timing_range(durations: list[float]) -> str:
    """A re-timed config's fastest and slowest timing: its mean alone hides the noise that re-timing weighs,
    and that may have decided the winner; `-` for a config timed once."""
    if len(durations) < 2:
        return "-"
    return f"{format_us(min(durations))} – {format_us(max(durations))}"


def _best_line(state: TuneState) -> str:
    """The winner, and whether re-timing passed it by: the others re-timed came out slower, and it was not checked."""
    if state.best is None:
        return "-"
    line = f"#{state.best} {state.configs[state.best].label()}  {format_us(state.best_us)}"
    retimed = [r for r in state.rounds if r.retime]
    if retimed and not any(state.best in r.batch for r in retimed):
        timings = len(state.durations[state.best])
        others = {i for r in retimed for i in r.batch}
        if others <= set(state.failed):
            outcome = "failed"
        elif others & set(state.failed):
            outcome = "came out slower or failed"
        else:
            outcome = "came out slower"
        line += f"  ({timings} timing{'s' if timings != 1 else ''}; never re-timed: the configs re-timed {outcome})"
    return line


def _carried_line(state: TuneState) -> str:
    """Which results the tune was given by the one it superseded: they are in its tables, not in its cost."""
    timings = {i: n for i, n in state.carried_taken.items() if n and i not in state.failed}
    dropped = {i: n for i, n in state.carried_taken.items() if n and i in state.failed}  # a later timing failed
    waiting = [i for i in state.carried_taken if i in state.carried]  # its carried timings are taken when it is timed
    compiles = [i for i in state.carried_taken if i not in timings and i not in dropped and i not in waiting]
    parts = []
    if timings:
        parts.append(f"the compiles of {_indices(sorted(timings))} with {sum(timings.values())} of their timings")
    if dropped:
        parts.append(f"the compiles of {_indices(sorted(dropped))} with {sum(dropped.values())} timings, dropped "
                     "when a later timing failed")
    if waiting:
        parts.append(f"the compiles of {_indices(sorted(waiting))}, whose carried timings are taken when they are "
                     "timed")
    if compiles:
        parts.append(f"the compile outcomes alone of {_indices(sorted(compiles))}")
    return f"from a superseded tune, at no cost here: {'; '.join(parts)}"


def _round_groups(records: list[RoundRecord]) -> list[list[RoundRecord]]:
    """Rounds as `show` lists them: a run of re-time rounds that time the same configs for the same reason is one
    row (a tune may re-time its two or three contenders a dozen times), every other round a row of its own."""
    groups: list[list[RoundRecord]] = []
    for record in records:
        previous = groups[-1][-1] if groups else None
        if (previous is not None and record.retime and previous.retime and record.reason == previous.reason
                and sorted(record.batch) == sorted(previous.batch)):
            groups[-1].append(record)
        else:
            groups.append([record])
    return groups


def _indices(indices: list[int]) -> str:
    """Config numbers as `show` lists them: up to fourteen, else the first twelve and how many more; `-` for none."""
    if len(indices) <= 14:
        return ", ".join(f"#{i}" for i in indices) or "-"
    return ", ".join(f"#{i}" for i in indices[:12]) + f" … ({len(indices) - 12} more)"


def _params_unlike_defaults(state: TuneState) -> tuple[dict[str, object], list[str]]:
    """The parameters the policy stored with its state (the ones it ran with) that neither its defaults nor the
    caller's `policy_params` (shown beside the policy) would give, and today's parameters the state does not store.

    Those come from elsewhere: defaults change between versions, and in a
    state written before a tune kept the `FASTA_*` knobs among its
    `policy_params`, the environment set some.
    """
    stored = state.policy_state.get("params") if isinstance(state.policy_state, dict) else None
    if not isinstance(stored, dict):
        return {}, []
    policy, passed = state.policy, state.policy_params
    if policy == "must-measure":  # an integration's wrapper: the params are the inner policy's
        policy, passed = str(passed.get("inner", "")), passed.get("params") or {}
        if not isinstance(passed, dict):
            passed = {}
    try:
        defaults = make_policy(policy, state.configs, {}).state_dict().get("params", {})
    except FastaError:
        return {}, []
    own = [name for name in defaults if name != "expert_configs"]  # the wrapper sets those itself
    unlike = {
        name: stored[name]
        for name in own
        if name in stored and defaults[name] != stored[name] and not (name in passed and passed[name] == stored[name])
    }
    return unlike, [name for name in own if name not in stored]


def _builds(policy: str, configs: list[Config]) -> bool:
    """Whether `policy` builds over `configs` with no parameter of the command line (the environment's may fail)."""
    try:
        make_policy(policy, configs, with_environment(policy, {}))
    except PolicyError:
        return False
    return True


def _check_directory_of(option: str, path: Path | None) -> None:
    """An output file's directory must exist, and be writable, before any work is done: a typo must not cost
    a whole run."""
    if path is None:
        return
    target = path.expanduser().absolute()
    if not target.parent.is_dir():
        raise click.ClickException(f"{option} {path}: no directory {path.parent}")
    if target.exists():  # a file there, /dev/stdout say, needs only its own permission
        if not os.access(target, os.W_OK):
            raise click.ClickException(f"{option} {path}: the file is not writable")
    elif not os.access(target.parent, os.W_OK):
        raise click.ClickException(f"{option} {path}: the directory {path.parent} is not writable")
    _check_not_a_tune(option, path, target)


def _check_not_a_tune(option: str, path: Path, target: Path) -> None:
    """A usage error for an output over a tune's file, wherever it lies: a name a state dir gives its files (a
    state file, one set aside, a lock), or a file that holds a tune under another name. Writing it would destroy
    that tune, or another process's lock on one."""
    kind = store_file_kind(target.name)
    if kind is not None:
        raise click.BadParameter(f"{path}: a name fasta-sm gives {kind}; writing it could destroy a tune: "
                                 "write elsewhere", param_hint=option)
    if target.is_file():
        try:
            kernel = StateStore.read_kernel(target)  # a look at its first bytes: an output can be large
        except OSError:
            return
        if kernel is not None:
            raise click.BadParameter(f"{path} holds a tune of kernel {kernel!r}; writing it would destroy that "
                                     "tune: write elsewhere", param_hint=option)


def _given_state_dir(state_dir: Path | None) -> Path | None:
    """The command's own --state-dir, else the one given before the command (`fasta-sm --state-dir D ls`)."""
    if state_dir is not None:
        return state_dir
    return (click.get_current_context().find_root().obj or {}).get("state_dir")


def _state_dir_path(state_dir: Path | None) -> Path:
    state_dir = _given_state_dir(state_dir)
    return state_dir.expanduser() if state_dir is not None else default_state_dir()


def _existing_store(state_dir: Path | None) -> StateStore | None:
    """The store a reading command looks in: never created by looking (a typo must not make a directory).

    A default state dir that does not exist yet is a first run, not a typo:
    None, after saying so.
    """
    path = _state_dir_path(state_dir)
    if path.is_dir():
        return StateStore(path, lock_timeout_s=0)
    if _given_state_dir(state_dir) is None and env_value(STATE_DIR_ENV) is None and not path.exists():
        notes.print(f"no tunes yet: the default state dir {path} does not exist (the first tune creates it)")
        return None
    raise click.ClickException(f"no state dir {path}" + (" (it is not a directory)" if path.exists() else ""))


_PICTURES_NOT_DRAWN = frozenset((".pdf", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".eps", ".ps"))
"""Names of pictures `graph` cannot draw: mermaid text in a file so named would open as a broken picture."""


@main.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["mermaid", "png", "svg"]),
    default="mermaid",
    help="[default: mermaid, or what --out's .png or .svg names]",
)
@click.option(
    "--out",
    type=NamedPath(dir_okay=False, path_type=Path),
    default=None,
    help="Write here instead of standard output (required for png/svg).",
)
def graph(fmt: str, out: Path | None) -> None:
    """Draw the tuning machine: mermaid text always, PNG or SVG where graphviz is installed."""
    from .diagram import MissingGraphviz, draw_machine

    suffix = out.suffix.lower() if out is not None else ""
    if suffix in _PICTURES_NOT_DRAWN:
        raise click.UsageError(f"--out {out}: graph draws mermaid text, PNG or SVG, not {suffix[1:].upper()}")
    drawn = suffix.lstrip(".") if suffix in (".png", ".svg") else None
    if drawn is not None and drawn != fmt:
        if click.get_current_context().get_parameter_source("fmt") is not ParameterSource.DEFAULT:
            raise click.UsageError(f"--out {out} names a {drawn} file, but --format is {fmt}")
        fmt = drawn  # `--out machine.png` means a PNG, not mermaid text in a file named .png
    if fmt != "mermaid" and out is None:
        raise click.UsageError(f"--format {fmt} needs --out FILE")
    _check_directory_of("--out", out)
    try:
        with _writing("--out", out):
            result = draw_machine(fmt, out)
    except (ImportError, MissingGraphviz) as exc:
        raise click.ClickException(str(exc)) from None
    if out is None:
        click.echo(result)
    else:
        notes.print(f"wrote {out}")


@main.command()
@click.option(
    "--csv",
    "csv_out",
    type=NamedPath(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the table as CSV.",
)
@state_dir_option
def report(csv_out: Path | None, state_dir: Path | None) -> None:
    """Where the tuning time went, per tune and in total, against exhaustive tuning."""
    from .report import REPORT_COLUMNS, report_rows

    _check_directory_of("--csv", csv_out)
    store = _existing_store(state_dir)
    rows, unreadable = report_rows(store) if store is not None else ([], [])  # a first run: a CSV of no rows
    if rows:
        table = Table(*REPORT_COLUMNS, title=printable(f"Tuning cost in {store.path}"))
        table.columns[0].no_wrap = True  # the name is what `show` takes: never cut it
        for row in rows:
            table.add_row(*(_cell(row[c]) for c in REPORT_COLUMNS))
        _print_table(table)
    elif store is not None:
        notes.print(f"no readable state files in {store.path}")
    for why in unreadable:
        notes.print(Text(f"skipped, unreadable: {why}", style="yellow"))
    if csv_out is not None:
        # a state file's name of undecodable bytes is escaped, as standard output prints it
        with _writing("--csv", csv_out), csv_out.open("w", newline="", errors="backslashreplace") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(REPORT_COLUMNS))
            writer.writeheader()
            writer.writerows(rows)
        notes.print(f"wrote {csv_out}")


def _finite_or_null(value: object) -> object:
    """JSON has no infinity: a regret of a kernel whose runs found no config that ran is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite_or_null(item) for item in value]
    return value


def _policy_params(policy: str, items: tuple[str, ...], tables: list[tuple[Path, ReplayTable]]) -> dict[str, object]:
    """`--param NAME=VALUE` items as the policy's keyword arguments.

    VALUE is read as JSON, else as a Python literal (the spelling of the
    defaults in docs/algorithm.md), else kept as a string. The policy is
    built once on every table, so that a bad knob is a usage error before
    the first run, not a crash on the table that rejects it.
    """
    from .bench import BUDGET_IN_PARAMS

    params: dict[str, object] = {}
    for item in items:
        name, sep, text = (part.strip() for part in item.partition("="))
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--param")
        if name in params:
            raise click.BadParameter(f"{name!r} is given twice", param_hint="--param")
        if name == "budget":
            raise click.BadParameter(BUDGET_IN_PARAMS, param_hint="--param")
        params[name] = _literal(text)
    if not params:
        return params
    named = named_parameters(policy)
    knobs = [name for name in named or [] if name != "budget"]  # the budget is --budget's
    if named is not None and (unknown := [name for name in params if name not in knobs]):
        raise click.BadParameter(f"policy {policy!r} takes {', '.join(knobs) or 'no parameter'} here (its budget "
                                 f"is --budget); got {unknown[0]!r}", param_hint="--param")
    for path, table in tables:
        try:
            make_policy(policy, table.configs, params)
        except PolicyError as exc:
            raise click.BadParameter(f"{path.name}: {exc}", param_hint="--param") from None
    return params


def _literal(text: str) -> object:
    """A `--param` value: JSON (`true`, `0.4`, `["rbf"]`), else a Python literal (`True`, `'lower'`), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _fraction(value: float | None) -> float | None:
    """A budget option's value: a usage error unless it is a fraction in (0, 1], before any table is read."""
    if value is not None and not 0.0 < value <= 1.0:
        raise click.BadParameter(f"{value!r} must be a fraction in (0, 1]", param_hint="--budget")
    return value


def _known_policy(name: str, option: str = "--policy", bench: bool = False) -> str:
    """`name` if a user can run that policy (in `bench`: one bench can score); a usage error listing those they can
    otherwise."""
    try:
        require_listed(name)
    except PolicyError as exc:
        if bench:
            runs = ", ".join(n for n in policy_names() if n != "exhaustive")
            raise click.BadParameter(f"unknown policy {name!r}; bench runs: {runs}", param_hint=option) from None
        raise click.BadParameter(str(exc), param_hint=option) from None
    return name


@contextlib.contextmanager
def _writing(option: str, path: Path | None) -> Iterator[None]:
    """An error writing `path` names it and its option: a full disk's own message names neither."""
    try:
        yield
    except OSError as exc:
        raise click.ClickException(f"{option} {path}: {exc.strerror or exc}") from None


def _print_table(table: Table) -> None:
    """A table is printed as wide as its cells need, never cut: its cells (kernel names, configs, keys,
    figures) are what a user greps for, pastes or reads. One wider than the terminal runs past its edge."""
    needed = Measurement.get(console, console.options.update_width(1 << 20), table).maximum
    if console.is_terminal and needed <= console.width:
        console.print(table)
        return
    wide = Console(markup=False, emoji=False, width=max(console.width, 240, needed))
    with wide.capture() as captured:
        wide.print(table)
    click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return printable(str(value))


@main.command("bench")
@tables_dir_option
@click.option("--seeds", default=50, show_default=True, type=click.IntRange(min=1), help="Seeds per kernel and policy.")
@click.option(
    "--seed-start",
    default=0,
    show_default=True,
    type=click.IntRange(0, SEED_MAX),
    help="First seed; the defaults were chosen on seeds 0-599, so a run from 600 on checks a change on fresh ones.",
)
@click.option(
    "--policies",
    default="fasta,random,coordesc,trees",
    show_default=True,
    help="Comma-separated; the first sets the budget the others get, run by run.",
)
@budget_option("Give the first policy this fraction; the others get what it evaluated.")
@click.option(
    "--param",
    "param_items",
    multiple=True,
    metavar="NAME=VALUE",
    help="A knob of the first policy (repeatable; VALUE read as JSON, else as a Python literal, else as a string), "
    "e.g. failure_fit=true.",
)
@click.option(
    "--json",
    "json_out",
    type=NamedPath(dir_okay=False, path_type=Path),
    default=None,
    help="Write the results as JSON (format in docs/cli.md).",
)
def bench_command(
    tables_dir: Path | None,
    seeds: int,
    seed_start: int,
    policies: str,
    budget: float | None,
    param_items: tuple[str, ...],
    json_out: Path | None,
) -> None:
    """Score the policy against baselines on recorded tables, at the same evaluation budget."""
    from .bench import EXHAUSTIVE_IN_BENCH, NEEDLE_MOST, bench, leader_margins, load_tables, needle_labels
    from .data import tables_dir as shipped_tables

    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names or len(set(names)) != len(names):
        raise click.BadParameter(f"{policies!r}: name each policy once, at least one", param_hint="--policies")
    if "exhaustive" in names:
        raise click.BadParameter(EXHAUSTIVE_IN_BENCH, param_hint="--policies")
    for name in names:
        _known_policy(name, "--policies", bench=True)
    if "trees" in names and click.get_current_context().get_parameter_source("policies") is ParameterSource.DEFAULT:
        try:
            import sklearn  # noqa: F401
        except ImportError:
            names.remove("trees")
            notes.print("trees left out: it needs scikit-learn (pip install 'fasta-sm[bench]')")
    _check_directory_of("--json", json_out)
    if seed_start + seeds - 1 > SEED_MAX:
        given = click.get_current_context().get_parameter_source("seed_start") is not ParameterSource.DEFAULT
        raise click.BadParameter(f"seeds {seed_start}..{seed_start + seeds - 1} pass {SEED_MAX}, the largest seed",
                                 param_hint="--seed-start / --seeds" if given else "--seeds")
    folder = tables_dir or shipped_tables()
    loaded = load_tables(folder)  # refused before the progress display starts; each read once, here
    if json_out is not None and json_out.expanduser().resolve().parent == Path(folder).expanduser().resolve():
        raise click.BadParameter(f"{json_out} is in the tables folder, where the next bench would read it as a "
                                 "table; write it elsewhere", param_hint="--json")
    params = _policy_params(names[0], param_items, loaded)
    for path, table in loaded:
        _note_defects(path, table)
    with Progress(
        TextColumn("{task.description}", style="bold", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,  # a pipe or a file gets the table alone
    ) as progress:
        task = progress.add_task("bench", total=None)

        def advance(done: int, total: int, kernel: str, policy: str) -> None:
            progress.update(task, completed=done, total=total, description=f"{printable(kernel)} · {policy}")

        result = bench(
            loaded,
            names,
            seeds,
            budget=budget,
            progress=advance,
            seed_start=seed_start,
            params=params,
        )
    columns = ("catch2", "catch5", "median_regret_pct", "p95_regret_pct", "evals_pct", "cost_pct")
    per_kernel = Table("kernel", "policy", "N", *columns, title=f"Per kernel ({seeds} seeds each, from {seed_start})")
    for row in result["kernels"]:
        per_kernel.add_row(printable(row["kernel"]), row["policy"], str(row["N"]), *(f"{row[c]:.3f}" for c in columns))
    _print_table(per_kernel)
    overall = Table("policy", *columns, title="Overall (means over kernels; regret percentiles over all runs)")
    for policy, row in result["overall"].items():
        overall.add_row(policy, *(f"{row[c]:.3f}" for c in columns))
    _print_table(overall)
    margins = leader_margins(result, needle_labels(loaded))
    if margins:
        against = Table("kernel", f"{names[0]} catch2", "best baseline", "its catch2", f"{names[0]} is",
                        title=f"Against the best baseline (needles: ≤ {NEEDLE_MOST} configs within 5 %)")
        for row in margins:
            lead, other = row["catch2"], row["baseline_catch2"]
            # means over kernels of k/seeds: equal shares summed in another order differ in the last bit
            verdict = "tied" if math.isclose(lead, other, rel_tol=1e-9) else "higher" if lead > other else "lower"
            against.add_row(printable(row["kernel"]), f"{lead:.3f}", row["baseline"], f"{other:.3f}", verdict)
        _print_table(against)
    if json_out is not None:
        with _writing("--json", json_out):
            json_out.write_text(json.dumps(_finite_or_null(result), indent=2, allow_nan=False))
        notes.print(f"wrote {json_out}")


main.add_command(record_command)


@main.command("tables")
@click.option("--stats", is_flag=True, help="What each table holds: N, failures, best, near-best counts, noise.")
@tables_dir_option
def list_tables(stats: bool, tables_dir: Path | None) -> None:
    """The recorded replay tables shipped with fasta-sm (or in --tables DIR), with --stats what each holds."""
    if tables_dir is None and not stats:
        for name in table_names():
            click.echo(name)
        return
    from .bench import load_listed, table_paths
    from .data import tables_dir as shipped_tables

    paths = table_paths(tables_dir or shipped_tables())
    readable, unreadable = [], []
    for path in paths:
        try:
            readable.append((path, load_listed(path)))
        except TableError as exc:
            unreadable.append(str(exc))
    if not stats:
        for path, _ in readable:
            click.echo(printable(path.stem))
    elif readable:
        table = Table(
            "table", "N", "failed", "compile s (mean)", "best", "within 2 %", "within 5 %",
            "repeat spread (median / p90)",
        )
        for path, replay in readable:
            _note_defects(path, replay)
            spread = replay.repeat_spread()
            noise = f"{100 * np.median(spread):.2f} % / {100 * np.percentile(spread, 90):.1f} %" if spread.size else "-"
            table.add_row(
                printable(path.stem),
                str(len(replay.configs)),
                str(sum(error is not None for error in replay.errors)),
                f"{np.mean(replay.compile_s):.2f}",
                format_us(replay.true_best_us),
                str(replay.within(0.02)),
                str(replay.within(0.05)),
                noise,
            )
        _print_table(table)
    if unreadable:
        raise click.ClickException("; ".join(unreadable))


def _note_defects(path: Path, replay: ReplayTable) -> None:
    """Say so when a table was recorded with a known defect: compile times too short to be compiles (its cost
    figures read low), or timings of one config too far apart to be the device's noise (its speeds are off)."""
    hits = replay.cache_hits()
    if hits:
        notes.print(
            f"note: {path}: {hits} of {len(replay.configs)} compile times are under {CACHE_HIT_S} s, "
            "as loads from Triton's cache are; cost on this table reads low (docs/recording.md)"
        )
    disturbed = replay.disturbed()
    if disturbed:
        notes.print(
            f"note: {path}: {disturbed} of {len(replay.configs)} configs were timed over {1 + DISTURBED_SPREAD:g}x "
            "apart in the recording's two passes, as a disturbance on the device or a --rep-ms too short for the "
            "kernel leaves; their means are not their speed: record the table again (docs/recording.md, "
            '"Disturbed timings")'
        )


def run() -> None:
    """Entry point: fasta-sm's errors, and a file it cannot read or write, shown as one line on stderr."""
    for stream in (sys.stdout, sys.stderr):  # a path's undecodable bytes print escaped, not as a crash
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    try:
        main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (FastaError, OSError) as exc:
        click.ClickException(str(exc)).show()
        sys.exit(1)
