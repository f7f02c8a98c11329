"""The two seams every integration plugs into: backends measure, policies decide.

A backend knows how to compile and time configs on some device (or a replay
table); a policy knows which configs are worth measuring next. Neither knows
about files, locks or the order of steps: that is the machine's job.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .config import Config

LONGEST_US = 1e12
"""A duration past this (11.6 days) is a broken timer, not a kernel, and its means would overflow."""
LONGEST_S = 1e9
"""Compile or benchmark seconds past this (31 years) are a broken clock; their sum would overflow."""


def as_index(value: object) -> int | None:
    """A config index as Python's indexing takes it (a numpy integer, a 0-d integer array), else None.

    Not int(), which reads 2.7 as #2 and True as #1, configs nobody named. The engine checks a policy's batch
    and a backend's positions with it, must-measure its own indices: all take the same numbers.
    """
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


@dataclass(frozen=True)
class CompileOutcome:
    """One config's compile: `error` is None when it compiled."""

    error: str | None
    seconds: float


@dataclass(frozen=True)
class BenchmarkOutcome:
    """Timings of a batch: one duration (µs) per config, `inf` if it failed to run.

    `errors` maps a position in the batch to why it failed to run; `seconds` is
    the wall time the benchmark cost (charged, for replay).
    """

    durations_us: Sequence[float]
    seconds: float
    errors: dict[int, str] = field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """Compiles and times configs of one kernel."""

    def describe(self) -> str:
        """Where the timings come from, recorded in the state file."""

    def compile(self, configs: Sequence[Config]) -> list[CompileOutcome]:
        """Compile each config; one outcome per config, in order."""

    def benchmark(self, configs: Sequence[Config], repeat: Sequence[int] | None = None) -> BenchmarkOutcome:
        """Time configs that compiled; one duration per config, in order.

        `repeat[i]` is how often config i was timed before: a replay draws its
        noise from it, so a resumed tune times exactly what it would have; a
        live backend takes a fresh timing and may ignore it.
        """


@dataclass(frozen=True)
class Observations:
    """What a tune has measured, as arrays over the whole config space.

    duration_us[i] is the mean timing of config i, NaN if never measured, inf if
    it failed to compile or run; samples[i] counts its timings; compile_s[i] is
    its compile time, NaN if not compiled yet; failures[i] is why failed
    config i failed, as its backend said (absent or '' when it said nothing).
    """

    duration_us: np.ndarray
    samples: np.ndarray
    compile_s: np.ndarray
    spent_s: float
    failures: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """A policy's answer: the next batch, or an empty batch and why it stops.

    `retime` marks a batch of configs measured before, timed again on purpose
    (to guard against one lucky timing). `predicted_us` is the surrogate's
    prediction for every config, kept in the state file to explain the pick.
    """

    batch: Sequence[int]
    reason: str
    retime: bool = False
    predicted_us: np.ndarray | None = None


@runtime_checkable
class Policy(Protocol):
    """Decides what to measure. Built per tune over its config list."""

    name: str

    def plan(self, rng: np.random.Generator) -> Decision:
        """The R1 batch."""

    def refine(self, observed: Observations, rng: np.random.Generator) -> Decision:
        """The next R2 batch, or an empty batch to stop."""

    def state_dict(self) -> dict[str, Any]:
        """Everything the policy must remember across processes (msgpack types only)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""


@runtime_checkable
class ChecksRound(Protocol):
    """A policy that can tell whether the state it restored issued the round a resumed tune stands in.

    A state file edited by hand (its checksum made again) can pair a sound
    tune with a policy state from elsewhere; refused at resume, the file is
    set aside, rather than failing at every run's next refine.
    """

    def check_round(self, batch: Sequence[int]) -> None:
        """Raise PolicyError unless the restored state could have issued `batch`, the open round's configs."""


@dataclass(frozen=True)
class RuledOut:
    """Why a policy puts an untried config out of reach: its rule, the config behind it (None for none), in words."""

    rule: str
    culprit: int | None
    words: str


@runtime_checkable
class RulesOut(Protocol):
    """A policy that can say which untried configs its rules put out of reach, and why (`fasta-sm show --config`)."""

    def ruled_out(self, observed: Observations) -> dict[int, tuple[RuledOut, ...]]:
        """Per untried config out of the policy's reach on `observed`, every rule that puts it there, in the
        policy's order: the first is the main one; the rest hold it too, on the same measurements, so turning
        the first off alone would not free it."""


@runtime_checkable
class TakesPrior(Protocol):
    """A policy that can start from configs earlier tunes of the same kernel found fast.

    The tuner calls `use_prior` on a new tune's policy before it plans R1,
    with indices into the tune's config list, fastest first, where
    `takes_prior` is true (a wrapper's is its inner policy's).
    """

    takes_prior: bool

    def use_prior(self, indices: Sequence[int]) -> None:
        """Take these configs into account when planning R1."""
