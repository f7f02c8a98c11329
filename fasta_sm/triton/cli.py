"""`fasta-sm record`: record replay tables from the command line.

The main CLI group imports this module at start; torch and Triton are
imported only inside the command, so `fasta-sm` itself starts without them.
"""

from __future__ import annotations

import functools
import math
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..backends.replay import DISTURBED_SPREAD, count_disturbed, timed_by_interpreter
from ..cli_paths import NamedPath, UsageCommand
from ..errors import ConfigError, MissingDependency, TableError
from ..state import storable_text
from .spec import KernelSpec, load_spec, resolve_spec


def _finite(least: float, strict: bool) -> Callable[[click.Context, click.Parameter, float | None], float | None]:
    """An option callback: a usage error unless the value is finite and above `least` (or at it, if not strict)."""

    def check(_ctx: click.Context, _param: click.Parameter, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and (value > least if strict else value >= least)):
            raise click.BadParameter(f"{value!r} must be a finite number {'>' if strict else '≥'} {least:g}")
        return value

    return check


def _parse_params(items: tuple[str, ...]) -> dict[str, object]:
    params: dict[str, object] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--param")
        if name in params:
            raise click.BadParameter(f"{name} is given twice", param_hint="--param")
        try:
            params[name] = int(value)
        except ValueError:
            params[name] = value
    return params


def _check_device(torch: Any, device: str, interpreted: bool) -> None:
    """`--device` as a usage error before any recording (the out folder not even made): a string torch takes for
    no device, cpu without Triton's interpreter, or a CUDA device this host lacks. `record` would refuse each of
    them kernel by kernel."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise click.BadParameter(f"{device}: not a device torch knows ({exc})", param_hint="--device") from None
    if parsed.type == "cpu" and not interpreted:
        raise click.BadParameter("cpu needs Triton's interpreter: run with TRITON_INTERPRET=1", param_hint="--device")
    if parsed.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise click.BadParameter(
            f"{device}: torch sees no CUDA device here; recording needs a GPU (on a CPU, TRITON_INTERPRET=1 with"
            " --device cpu records a smoke table whose timings mean nothing)",
            param_hint="--device",
        )
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise click.BadParameter(f"{device}: this host has {count} CUDA device{'s' if count != 1 else ''} "
                                 f"(cuda:0 to cuda:{count - 1})", param_hint="--device")


def _spec_path(spec: str) -> str:
    """A zoo short name (`mm_fp16`) or a `module:function` path."""
    if ":" in spec:
        return spec
    from .zoo import ZOO

    if spec not in ZOO:
        raise click.BadParameter(
            f"{spec!r} is neither 'package.module:function' nor a zoo kernel ({', '.join(sorted(ZOO))})",
            param_hint="SPECS",
        )
    return f"fasta_sm.triton.zoo:spec_{spec}"


def _check_writable(out_dir: Path) -> None:
    """Make `out_dir` and write a file there, before anything is recorded: a read-only mount found after the
    first kernel would cost its recording and every one after."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as exc:
        raise click.BadParameter(f"{out_dir}: no table can be written there ({exc.strerror or exc})",
                                 param_hint="--out") from None


def _check_file_name(kernel: str, out_dir: Path) -> None:
    """Refuse, before recording, a kernel name that cannot name its table in `out_dir`: one holding a path
    separator (its table would land in a subfolder, or outside `out_dir` by `..`), a leading dot (a hidden
    file, which a folder's listing leaves out), a NUL, or too long for the file system. The name is tried
    as `write_table` makes its temporary file (`temp_beside`), the longer of the two names."""
    from .record import temp_beside

    separators = {sep for sep in (os.sep, os.altsep, "/") if sep}
    if any(sep in kernel for sep in separators):
        raise _Unwritten(kernel, f"error: kernel name {kernel!r} holds a path separator: it cannot name a table "
                                 f"in {out_dir}; no table written")
    if kernel.startswith("."):
        raise _Unwritten(kernel, f"error: kernel name {kernel!r} would make its table a hidden file, which "
                                 "`bench --tables` and `tables` leave out; no table written")
    try:
        fd, tmp = temp_beside(out_dir / f"{kernel}.json")
    except (OSError, ValueError) as exc:  # ValueError: a NUL, or text the file system's encoding cannot hold
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise _Unwritten(kernel, f"error: kernel name {kernel!r} cannot name a table in {out_dir} ({why}); "
                                 "no table written") from None
    os.close(fd)
    os.unlink(tmp)


class _Unwritten(Exception):
    """A kernel left without a table: `record` says why, names it at the end, and goes on to the next kernel."""

    def __init__(self, kernel: str, message: str) -> None:
        super().__init__(message)
        self.kernel = kernel


def _record_one(
    name: str,
    spec_params: dict[str, object],
    out_dir: Path,
    limit: int | None,
    *,
    force: bool,
    record_spec: Callable[[KernelSpec], dict[str, Any]],
    command: str,
) -> tuple[Path, dict[str, Any]]:
    """Record the SPEC `name` and write its table; the table and where it went, or `_Unwritten` saying why not."""
    from .record import compiled_before, spread, triton_cache_dir, write_table

    try:  # its function ran only now: what it refuses leaves this kernel out, not the ones after it
        spec = load_spec(_spec_path(name), **spec_params)
    except ConfigError as exc:
        raise _Unwritten(name, f"error: {exc}; no table written") from None
    if not isinstance(spec.name, str) or not spec.name:  # no name to record under, nor to report it by
        raise _Unwritten(spec.name or name, f"error: kernel name {spec.name!r} cannot name a table: it must be "
                                            f"non-empty Unicode text (spec {name!r}); no table written")
    space = len(spec.configs)
    spec.configs = spread(spec.configs, limit)
    if len(spec.configs) < space:
        spec.name = f"{spec.name}_subset{len(spec.configs)}"  # a subset must not pass for the kernel's space
    target = out_dir / f"{spec.name}.json"
    _check_file_name(spec.name, out_dir)  # before target.exists(), which a name too long raises on
    if target.exists() and not target.is_file():  # --force replaces a table; this would fail once recorded
        raise _Unwritten(spec.name, f"error: {target} is not a file; no table can replace it")
    if target.exists() and not force:  # a recording costs GPU minutes; a smoke run must not replace it
        raise _Unwritten(spec.name, f"error: {target} exists; pass --force to replace it")
    of_space = f" (an evenly spaced subset of {space})" if len(spec.configs) < space else ""
    click.echo(f"recording {spec.name}: {len(spec.configs)} configs{of_space}")
    warm = compiled_before(spec)
    if warm:
        click.echo(
            f"warning: {spec.name}: Triton's cache {triton_cache_dir()} already holds {warm} "
            f"build{'s' if warm > 1 else ''} of its kernel; a config built before records a cache hit's "
            "compile_s, not a compile. Record it from an empty TRITON_CACHE_DIR, in a run of its own "
            "(docs/recording.md)",
            err=True,
        )
    try:
        table = record_spec(spec)
    except (ConfigError, TableError) as exc:  # refused, or recorded as nothing a table holds: the rest go on
        raise _Unwritten(spec.name, f"error: {exc}; no table written") from None
    table["command"] = command
    try:
        path = write_table(table, target, replace=force)
    except FileExistsError as exc:  # another recording of this kernel wrote its table meanwhile
        raise _Unwritten(spec.name, f"error: {exc.strerror}") from None
    except OSError as exc:  # a full disk, say: this kernel's recording is lost, not the ones after it
        raise _Unwritten(spec.name, f"error: cannot write {target}: {exc.strerror or exc}; no table written") from None
    return path, table


@click.command("record", cls=UsageCommand)
@click.argument("specs", nargs=-1, required=True)
@click.option(
    "--out", "out_dir", required=True, type=NamedPath(file_okay=False), help="Directory for <kernel>.json tables."
)
@click.option("--param", "params", multiple=True, help="NAME=VALUE passed to every spec function (e.g. M=2048).")
@click.option("--device", default="cuda", show_default=True, help="Device to record on (cuda:N for GPU N).")
@click.option(
    "--warmup-ms",
    default=5.0,
    show_default=True,
    callback=_finite(0, strict=False),
    help="do_bench warm-up per config and pass.",
)
@click.option(
    "--rep-ms",
    default=20.0,
    show_default=True,
    callback=_finite(0, strict=False),
    help="do_bench repetition time per config and pass.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Compile workers (default: FASTA_COMPILE_WORKERS, else usable cores less two, one at least).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Record only an evenly spaced subset of N configs (smoke runs), as the kernel <name>_subsetN; "
    "an N at or past the space's size records the whole space, as <name>.",
)
@click.option("--no-check", is_flag=True, help="Skip checking each config's output against the reference.")
@click.option("--force", is_flag=True, help="Replace a table already in --out (otherwise that kernel is refused).")
@click.option(
    "--deadline-s",
    type=float,
    default=None,
    callback=_finite(0, strict=True),
    help="Start no new kernel after this many seconds.",
)
def record_command(
    specs: tuple[str, ...],
    out_dir: str,
    params: tuple[str, ...],
    device: str,
    warmup_ms: float,
    rep_ms: float,
    workers: int | None,
    limit: int | None,
    no_check: bool,
    force: bool,
    deadline_s: float | None,
) -> None:
    """Exhaustively compile and time each SPEC's config space; write replay tables.

    SPEC is `package.module:function` returning a fasta_sm.triton.spec.KernelSpec,
    or the short name of a kernel of the zoo (fasta_sm.triton.zoo.ZOO).
    """
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as exc:
        raise MissingDependency(
            f"fasta-sm record needs torch and Triton ({exc}): pip install torch 'fasta-sm[triton]'"
        ) from None

    from .compile_pool import CompilePool, check_settings
    from .fork_server import interpreting
    from .record import record

    check_settings()
    _check_device(torch, device, interpreting())

    spec_params = _parse_params(params)
    for name in specs:  # each recording costs GPU minutes: a typo in the last spec must not cost the ones before
        try:
            resolve_spec(_spec_path(name), **spec_params)
        except ConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="SPECS") from None
    _check_writable(Path(out_dir))
    # fasta-sm's own arguments, from `fasta-sm` or `-m` alike; a path's undecodable bytes escaped, as a table needs
    command = storable_text(shlex.join(["fasta-sm", *sys.argv[1:]]))
    pool = CompilePool(workers)
    record_spec = functools.partial(
        record, device=device, warmup_ms=warmup_ms, rep_ms=rep_ms, check=not no_check, pool=pool, progress=click.echo
    )
    started = time.perf_counter()
    unwritten: list[str] = []
    try:
        if device != "cpu":
            pool.start()
        for name in specs:
            if deadline_s is not None and time.perf_counter() - started > deadline_s:
                click.echo(f"deadline reached: {name} not recorded", err=True)
                continue
            try:
                path, table = _record_one(
                    name, spec_params, Path(out_dir), limit, force=force, record_spec=record_spec, command=command
                )
            except _Unwritten as exc:
                click.echo(str(exc), err=True)
                unwritten.append(exc.kernel)
                continue
            timed = [row for row in table["configs"] if row["duration_us"]]
            best = min((sum(r["duration_us"]) / len(r["duration_us"]) for r in timed), default=float("nan"))
            click.echo(
                f"wrote {path}: {len(timed)} timed, best {best:.2f} us, {time.perf_counter() - started:.0f}s so far"
            )
            disturbed = count_disturbed(row["duration_us"] for row in table["configs"] if row["error"] is None)
            if disturbed and not timed_by_interpreter(table):
                click.echo(
                    f"warning: {path}: {disturbed} of {len(table['configs'])} configs were timed over "
                    f"{1 + DISTURBED_SPREAD:g}x apart in the two passes, as a disturbance on the device or a "
                    "--rep-ms too short for the kernel leaves; record it again "
                    '(docs/recording.md, "Disturbed timings")',
                    err=True,
                )
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        if unwritten:
            raise click.ClickException(f"no table for {', '.join(map(str, unwritten))} (above)")
    except KeyboardInterrupt:
        click.echo(
            "interrupted: the tables written so far are whole; record the rest from an empty TRITON_CACHE_DIR, "
            "as a rerun in this cache would load what this run compiled and record cache hits",
            err=True,
        )
        raise
    finally:
        pool.close()


if __name__ == "__main__":  # `python3 -m fasta_sm.triton.cli ...` is `fasta-sm record ...`, errors shown alike
    from ..cli import run

    if sys.argv[1:2] != ["record"]:  # the usage line it prints names `record`, so that form works too
        sys.argv[1:1] = ["record"]
    run()
