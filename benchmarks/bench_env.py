"""What every GPU benchmark script checks and cleans up: a device to run on, and its temporary folders."""

from __future__ import annotations

import contextlib
import multiprocessing.util
import os
import sys
import tempfile
from collections.abc import Iterator

INTERPRETER_HINT = "; on a CPU, run it under TRITON_INTERPRET=1 with --small (figures meaningless)"


def device_or_exit(script: str, interpreter: bool = True) -> None:
    """Stop with one line, not torch's driver traceback, where the script has nothing to run on.

    With `interpreter`, Triton's CPU interpreter (TRITON_INTERPRET=1) counts as a device.
    """
    try:
        import torch
    except ImportError:
        sys.exit(f"{script}: needs torch (pip install 'fasta-sm[triton]') and a CUDA GPU")

    from fasta_sm.triton.fork_server import interpreting

    if torch.cuda.is_available() or (interpreter and interpreting()):
        return
    sys.exit(f"{script}: needs a CUDA GPU, and torch sees none{INTERPRETER_HINT if interpreter else ''}")


@contextlib.contextmanager
def scratch(script: str) -> Iterator[str]:
    """One temporary folder for the run, removed when it ends, under which every other one is made.

    `tempfile` and TMPDIR both point into it, so the state dirs, Triton and
    Inductor caches of this process and of the processes it starts (children,
    compile workers) go there too, instead of piling up in /tmp. All but
    multiprocessing's own (a fork server's socket), made first where it
    would be anyway: multiprocessing removes it at exit, after this one is
    gone, and fails with a traceback where this one was its parent.
    """
    multiprocessing.util.get_temp_dir()
    with tempfile.TemporaryDirectory(prefix=f"{script}-", ignore_cleanup_errors=True) as root:
        before = tempfile.tempdir, os.environ.get("TMPDIR")
        tempfile.tempdir = os.environ["TMPDIR"] = root
        try:
            yield root
        finally:
            tempfile.tempdir = before[0]
            if before[1] is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = before[1]
