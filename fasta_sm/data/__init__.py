"""Recorded replay tables shipped with fasta-sm (package data)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ..errors import TableError

DEFAULT_TABLE = "mm_bf16_gelu_4096"


def tables_dir() -> Path:
    return Path(str(resources.files("fasta_sm") / "data" / "tables"))


def table_names() -> list[str]:
    """The shipped tables' names; hidden files (an editor's `.#t.json` lock in an editable install) are no
    tables, as `bench.table_paths` leaves them out."""
    return sorted(p.stem for p in tables_dir().glob("*.json") if not p.name.startswith("."))


def table_path(name_or_path: str) -> Path:
    """A table by path, or by the name of a shipped table (with or without `.json`)."""
    candidate = Path(name_or_path).expanduser()
    if name_or_path.strip() and candidate.is_file():
        return candidate
    bare = candidate.suffix == ".json" and candidate.name == name_or_path  # a shipped file's name, not a path
    shipped = tables_dir() / (name_or_path if bare else f"{name_or_path}.json")
    if shipped.exists():  # a folder here named like a shipped table does not hide it
        return shipped
    if name_or_path.strip() and candidate.exists():  # a folder, say: the reader says what it is
        return candidate
    raise TableError(f"no replay table {name_or_path!r}: not a file, nor one of {', '.join(table_names()) or 'none'}")
