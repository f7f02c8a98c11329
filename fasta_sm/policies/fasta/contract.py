"""What the policy accepts from the engine, checked before any decision."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

from ...errors import PolicyError
from ...protocols import Observations, as_index


class InvalidObservations(PolicyError, ValueError):
    """Observations the policy cannot decide on: each message names the value."""


def check_observations(observed: Observations, n: int, last_batch: Sequence[int]) -> np.ndarray:
    """The durations as a float array, after rejecting what cannot be a timing.

    NaN means "never measured" in `Observations`, so a config the policy
    asked for in its last batch that is still NaN was dropped somewhere: a
    failure must come back as +inf, not vanish.
    """
    durations = np.asarray(observed.duration_us, dtype=float)
    for name, array in (
        ("duration_us", durations),
        ("samples", np.asarray(observed.samples)),
        ("compile_s", np.asarray(observed.compile_s)),
    ):
        if array.shape != (n,):
            raise InvalidObservations(
                f"fasta: observed.{name} has shape {array.shape}, expected ({n},): one entry per config"
            )
    bad = np.flatnonzero(durations <= 0)
    if bad.size:
        i = int(bad[0])
        raise InvalidObservations(
            f"fasta: observed.duration_us[{i}] = {float(durations[i])!r} is not a positive duration "
            "(timings are microseconds > 0; +inf marks a failed config)"
        )
    samples = np.asarray(observed.samples)
    untimed = np.flatnonzero(np.isfinite(durations) & ~(samples >= 1))
    if untimed.size:
        i = int(untimed[0])
        raise InvalidObservations(
            f"fasta: observed.samples[{i}] = {samples[i].item()!r}, but config #{i} has a mean duration: "
            "a measured config was timed at least once"
        )
    dropped = [i for i in last_batch if np.isnan(durations[i])]
    if dropped:
        raise InvalidObservations(
            f"fasta: observed.duration_us[{dropped[0]}] = nan, but config #{dropped[0]} was in the last batch; "
            "a config that failed must be reported as +inf"
        )
    if not isinstance(observed.spent_s, numbers.Real) or not np.isfinite(observed.spent_s) or observed.spent_s < 0:
        raise InvalidObservations(f"fasta: observed.spent_s = {observed.spent_s!r} must be a finite number ≥ 0")
    for index, message in observed.failures.items():
        position = as_index(index)  # not isinstance(int): True is an int, and durations[True] is an array
        if position is None or not (0 <= position < n and np.isinf(durations[position])):
            raise InvalidObservations(
                f"fasta: observed.failures names config {index!r}, which is not a failed config of 0..{n - 1} "
                "(a failed config's duration is +inf)"
            )
        if not isinstance(message, str):
            raise InvalidObservations(
                f"fasta: observed.failures[{index}] = {message!r} is not a message (a str; '' when there is none)"
            )
    return durations
