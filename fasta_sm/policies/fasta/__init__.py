"""The FASTA dynamic-filter policy, registered as "fasta"."""

from .params import ENV_VARS, FastaParams
from .policy import FastaPolicy

__all__ = ["ENV_VARS", "FastaParams", "FastaPolicy"]
