"""torch's `torch.backends` entry points, which run at the end of every `import torch`.

Kept light: with a switch off, `import torch` imports fasta-sm's switch reader
and nothing else (the engine, its policies and their dependencies cost tens
of ms, in every process that imports torch, compile workers included).
"""

from __future__ import annotations

from .env import INDUCTOR_SWITCH, NPU_SWITCH, switch_or_off


def inductor() -> None:
    """With FASTA_SM_INDUCTOR=1, `fasta_sm.inductor.autoload`."""
    if switch_or_off(INDUCTOR_SWITCH):
        from .inductor import autoload

        autoload()


def npu() -> None:
    """With FASTA_SM_NPU=1, `fasta_sm.npu.autoload`."""
    if switch_or_off(NPU_SWITCH):
        from .npu import autoload

        autoload()
