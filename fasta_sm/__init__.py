"""fasta-sm: durable, sample-efficient autotuning for Triton kernels.

Each kernel's tune is a state machine (R1 → R2_k → DONE) checkpointed to a
msgpack state file after every step, so a crash loses nothing and a finished
tune is reused at once.
"""

__version__ = "0.1.0"

from .config import Config  # noqa: E402
from .errors import FastaError  # noqa: E402

__all__ = ["Config", "FastaError", "__version__"]
