"""The codegen patch: kernel source that imports the hook and carries fasta-sm's settings.

`TritonKernel.codegen_kernel` returns a kernel's whole source text. The
patch adds the hook's import after Inductor's `triton_heuristics` import and a
`fasta_sm` entry to the decorator's `inductor_meta`, for pointwise and
reduction kernels only. Settings travel in the source (not in environment
variables) because the worker pool may have been started before `enable()`.
Source it does not recognise is returned unchanged: the kernel is then built
exactly as Inductor builds it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..driver import hook_import

META_KEY = "fasta_sm"
"""The inductor_meta entry that carries the settings."""
IMPORT_LINE = "from torch._inductor.runtime import triton_helpers, triton_heuristics"
HOOK = hook_import("fasta_sm.inductor.hook", "Inductor")
BARE_HOOK = "import fasta_sm.inductor.hook  # noqa: F401  fasta-sm autotuner, also in compile workers"
"""The hook's import as fasta-sm wrote it before 2026-12-05, outside a `try`: Inductor's caches still hold kernels
written so, and their tunes are keyed without it."""
HEURISTIC = re.compile(r"@triton_heuristics\.(pointwise|reduction|persistent_reduction)\(")
META_OPEN = "inductor_meta={"
TRIPLE_QUOTE = "'''"
"""What ends the string literal Inductor's output code holds a kernel's source in."""


def rewrite_source(source: str, settings: dict[str, Any]) -> str:
    """`source` with the hook import and `settings` in its inductor_meta, or unchanged."""
    match = HEURISTIC.search(source)
    if match is None or IMPORT_LINE not in source or HOOK in source:
        return source
    start = source.find(META_OPEN, match.end())
    if start < 0:
        return source
    cut = start + len(META_OPEN)
    source = f"{source[:cut]}{_entry(settings)}{source[cut:]}"
    return source.replace(IMPORT_LINE, f"{IMPORT_LINE}\n{HOOK}", 1)


def without_settings(source: str, settings: dict[str, Any]) -> str:
    """`source` as Inductor wrote it, before `rewrite_source` added `settings` (read back from it) and the hook
    (either way it was written)."""
    source = source.replace(_entry(settings), "", 1)
    for hook in (HOOK, BARE_HOOK):
        source = source.replace(f"{IMPORT_LINE}\n{hook}", IMPORT_LINE, 1)
    return source


def source_safe(settings: dict[str, Any]) -> None:
    """Refuse, naming it, a setting whose text holds a backslash or three single quotes: Inductor embeds a
    kernel's source in a triple-quoted string literal of its output code, which would read the escape a second
    time (a state dir `tunes\\new` would become `tunes`, a newline and `ew`) and end at the quotes (the output
    code would not parse, and torch.compile fail)."""
    for name, value in settings.items():
        text = repr(value)
        if "\\" in text:
            raise ValueError(f"{name}={value!r} cannot travel in kernel source: its text needs a backslash escape")
        if TRIPLE_QUOTE in text:
            raise ValueError(f"{name}={value!r} cannot travel in kernel source: its text holds {TRIPLE_QUOTE}")


def _entry(settings: dict[str, Any]) -> str:
    return f"{META_KEY!r}: {settings!r}, "


def patched_codegen_kernel(
    original: Callable[..., str], settings: Callable[[], dict[str, Any] | None]
) -> Callable[..., str]:
    def codegen_kernel(self: Any, *args: Any, **kwargs: Any) -> str:
        source = original(self, *args, **kwargs)
        current = settings()
        return source if current is None else rewrite_source(source, current)

    codegen_kernel.__wrapped__ = original  # type: ignore[attr-defined]
    return codegen_kernel
