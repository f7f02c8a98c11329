"""Which configs the policy will ask for next, guessed before the batch in flight is timed.

A backend that compiles ahead is only as good as its guesses. The surrogate's
ranking of untried configs names under half of the next batch (on the
recorded tables, 47 % of it is among the nine ranked first): the next refine
sees timings not taken yet, draws from a softmax, and polishes around
whichever config ends up best. Asking copies of the policy what they would
pick if the batch came out as predicted, and, one scenario per config, if
that config came out best, names 63 % of it in as many guesses. The first
guided batch is guessed the same way while R1 is timed, from its timings so
far: with 4 of R1's configs left to time, 43 % of that batch is among the
first nine guesses (`benchmarks/lookahead_hits.py`, 10 seeds). The copies
get copies of the RNG, so the tune's own decisions are untouched: a tune
that looks ahead picks exactly what one that does not would.
"""

from __future__ import annotations

import copy
import logging
import math

import numpy as np

from .protocols import Observations, Policy
from .state import TuneState

log = logging.getLogger("fasta_sm.lookahead")

NEW_BEST = 0.97
"""A scenario's config comes out this share of the best measured so far."""
NEW_BEST_SCENARIOS = 8
"""At most this many configs of the batch get a scenario of their own (each costs one refine)."""


def likely_next(state: TuneState, policy: Policy, rng: np.random.Generator) -> list[int]:
    """Untried configs the next refine is likely to pick, likeliest first.

    The scenario "the batch times as expected" comes first, then one per
    config of the batch not timed yet (the first `NEW_BEST_SCENARIOS`) in
    which that config becomes the best. Expected is the policy's prediction
    in a guided round; in R1, which has no model yet, it is the median of
    the R1 timings taken so far, so the first guided batch can be guessed
    while R1 is still being timed. Empty when there is nothing to expect
    from (no prediction, nothing timed), when a prediction for the batch is
    not finite, or when a copy of the policy raises (a guess must never fail
    the tune). A pick outside the config list is dropped: the machine would
    index the list with it, and lose the whole offer, certain work included.
    """
    base = _expected_observations(state)
    if base is None or state.best_us is None:
        return []
    scenarios = [base]
    for index in state.untimed()[:NEW_BEST_SCENARIOS]:
        durations = base.duration_us.copy()
        durations[index] = NEW_BEST * state.best_us
        scenarios.append(
            Observations(durations, base.samples.copy(), base.compile_s.copy(), base.spent_s, base.failures)
        )
    tried = set(state.compiled) | set(state.failed) | set(state.pending)
    picks: list[int] = []
    for observed in scenarios:
        try:
            decision = copy.deepcopy(policy).refine(observed, copy.deepcopy(rng))
        except Exception as exc:  # noqa: BLE001  guesses are a hint; the real refine reports errors
            log.debug("kernel %s: no lookahead: %s: %s", state.kernel, type(exc).__name__, exc)
            return []
        if decision.retime:
            continue
        inside = [i for i in map(int, decision.batch) if 0 <= i < state.n_configs]  # a copy's slip is no offer's end
        picks += [i for i in inside if i not in tried and i not in picks]
    return picks


def _expected_observations(state: TuneState) -> Observations | None:
    """What the tune will have observed once the rest of the pending batch is timed as expected."""
    observed = state.observed()
    durations, samples, compile_s = observed.duration_us, observed.samples, observed.compile_s
    timed = set(state.round_done)
    if state.predicted_us:
        expected = np.asarray(state.predicted_us, dtype=float)
    elif state.phase == "R1" and timed & set(state.durations):
        typical = float(np.median([state.mean_us(i) for i in timed if i in state.durations]))
        expected = np.full(state.n_configs, typical)
    else:
        return None
    known = compile_s[np.isfinite(compile_s)]
    compile_each = float(known.mean()) if known.size else 0.0
    timings = int(samples.sum()) - state.timings_given()  # those the tune paid for
    timing_each = state.cost.benchmark_s / timings if timings > 0 else 0.0
    extra_s = 0.0
    for index in state.pending:
        if index in state.failed or index in timed:
            continue
        if not math.isfinite(expected[index]):
            return None
        durations[index] = expected[index]
        samples[index] += 1
        if math.isnan(compile_s[index]):
            compile_s[index] = compile_each
            extra_s += compile_each
        extra_s += timing_each
    return Observations(
        duration_us=durations,
        samples=samples,
        compile_s=compile_s,
        spent_s=observed.spent_s + extra_s,
        failures=observed.failures,
    )
