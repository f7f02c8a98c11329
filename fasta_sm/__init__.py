"""fasta-sm: durable, sample-efficient autotuning for Triton kernels.

Each kernel's tune is a state machine (R1 → R2_k → DONE) checkpointed to a
msgpack state file after every step, so a crash loses nothing and a finished
tune is reused at once.
"""

__version__ = "0.1.0"

from .config import Config  # noqa: E402
from .errors import FastaError  # noqa: E402

__all__ = ["Config", "FastaError", "__version__"]


def __getattr__(name: str):
    """`fasta_sm.autotune` is imported on first use: `import fasta_sm` must not import torch or Triton."""
    if name == "autotune":
        try:
            import triton  # noqa: F401
        except ImportError as exc:
            from .errors import MissingDependency

            raise MissingDependency(f"fasta_sm.autotune needs Triton ({exc}): pip install 'fasta-sm[triton]'") from None
        from .triton.autotune import autotune

        return autotune
    raise AttributeError(f"module 'fasta_sm' has no attribute {name!r}")


def __dir__() -> list[str]:
    """`autotune` among the names, though loaded on first use: tab completion and `dir()` show it."""
    return sorted([*globals(), "autotune"])
