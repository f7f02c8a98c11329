"""A wrapper that always measures given configs in R1: the integrations' own defaults."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..config import Config
from ..errors import FastaError
from ..protocols import ChecksRound, Decision, Observations, RuledOut, RulesOut, TakesPrior, as_index
from . import make_policy, register, with_environment


@register("must-measure", listed=False)
class MustMeasure:
    """Wraps a policy so that given configs (Inductor's own) are always in R1.

    This is what makes the winner never slower than Inductor's own pick under
    the same timing. The inner policy plans and refines as usual; it sees the
    extra R1 timings as ordinary observations.
    """

    name = "must-measure"

    def __init__(
        self, configs: Sequence[Config], inner: str, must: Sequence[int], params: Mapping[str, Any] | None = None
    ):
        indices = [as_index(i) for i in must]
        if None in indices:  # int() would read 1.7 as 1, a config nobody named
            odd = next(given for given, index in zip(must, indices) if index is None)
            raise FastaError(f"must-measure: index {odd!r:.60} is not a whole number")
        bad = [i for i in indices if not 0 <= i < len(configs)]
        if bad:
            raise FastaError(f"must-measure: index {bad[0]} outside 0..{len(configs) - 1}")
        self.must = sorted(indices)
        self.inner = make_policy(inner, configs, params)

    @classmethod
    def with_environment(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """`params` with the inner policy's knobs from the environment filled in (unchanged when none is set)."""
        inner = params.get("inner")
        given = dict(params.get("params") or {})
        merged = with_environment(inner, given) if isinstance(inner, str) else given
        return dict(params) if merged == given else {**params, "params": merged}

    def plan(self, rng: np.random.Generator) -> Decision:
        decision = self.inner.plan(rng)
        extra = [i for i in self.must if i not in set(decision.batch)]
        batch = sorted({int(i) for i in decision.batch} | set(self.must))
        named = ", ".join(f"#{i}" for i in self.must)
        reason = f"{decision.reason}; default configs {named} always measured ({len(extra)} added to the sample)"
        return Decision(batch=batch, reason=reason, retime=decision.retime, predicted_us=decision.predicted_us)

    def refine(self, observed: Observations, rng: np.random.Generator) -> Decision:
        return self.inner.refine(observed, rng)

    @property
    def takes_prior(self) -> bool:
        return isinstance(self.inner, TakesPrior) and self.inner.takes_prior

    def use_prior(self, indices: Sequence[int]) -> None:
        """Hand the inner policy earlier tunes' fast configs, less those R1 measures anyway: their places in its
        sample go to configs it would not measure."""
        if self.takes_prior:
            measured = set(self.must)
            self.inner.use_prior([i for i in indices if i not in measured])

    def ruled_out(self, observed: Observations) -> dict[int, tuple[RuledOut, ...]]:
        return self.inner.ruled_out(observed) if isinstance(self.inner, RulesOut) else {}

    def check_round(self, batch: Sequence[int]) -> None:
        if isinstance(self.inner, ChecksRound):  # R1's batch holds the inner plan and the configs added to it
            self.inner.check_round(batch)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)
