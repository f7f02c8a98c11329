"""Reading a file that may be anything under its name: what a user points fasta-sm at is not always a file."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def read_regular(path: str | Path, limit: int = -1, most: int | None = None) -> bytes:
    """A file's bytes (its first `limit` ones, where given); anything but a regular file under that name is an
    OSError, never read: a named pipe would block its reader until something writes to it. So is a file of more
    than `most` bytes, where given: read whole, it could take all the memory there is. Opened in binary mode
    (Windows' O_BINARY: without it, its C runtime reads CR LF as LF and stops at a 0x1A byte)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if most is not None and found.st_size > most:
            raise OSError(errno.EFBIG, f"{found.st_size} bytes, larger than any state file ({most} at most)", str(path))
        return handle.read(limit)
