"""Drive a policy over a replay table the way the engine does, recording every decision."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from fasta_sm.backends.replay import ReplayBackend, ReplayTable
from fasta_sm.protocols import Decision, Observations


@dataclass
class Trace:
    """What a policy asked for, in order, and what the tune ended with."""

    decisions: list[Decision] = field(default_factory=list)
    durations: np.ndarray | None = None

    @property
    def batches(self) -> list[list[int]]:
        return [[int(i) for i in d.batch] for d in self.decisions if len(d.batch)]

    @property
    def tried(self) -> int:
        return int(np.sum(~np.isnan(self.durations)))

    def pick(self) -> int:
        finite = np.flatnonzero(np.isfinite(self.durations))
        return int(finite[np.argmin(self.durations[finite])])


class Simulator:
    """The engine's bookkeeping, in memory: compile once, time (again on re-time), average."""

    def __init__(self, table: ReplayTable, seed: int = 0) -> None:
        self.table = table
        self.backend = ReplayBackend(table, noise=True, seed=seed)
        n = len(table.configs)
        self.durations = np.full(n, np.nan)
        self.sums = np.zeros(n)
        self.samples = np.zeros(n, dtype=np.int64)
        self.compile_s = np.full(n, np.nan)
        self.spent = 0.0

    def measure(self, decision: Decision) -> None:
        for index in decision.batch:
            tried = not math.isnan(self.durations[index])
            assert tried == bool(decision.retime), f"config #{index}: retime={decision.retime} but tried={tried}"
            if not tried:
                self.spent += float(self.table.compile_s[index])
                if self.table.errors[index] is not None:
                    self.durations[index] = math.inf
                    continue
                self.compile_s[index] = self.table.compile_s[index]
            self.sums[index] += self.backend.timing(index, int(self.samples[index]))
            self.samples[index] += 1
            self.durations[index] = self.sums[index] / self.samples[index]
            self.spent += 0.125

    def observed(self) -> Observations:
        failures = {int(i): self.table.errors[i] or "" for i in np.flatnonzero(np.isinf(self.durations))}
        return Observations(
            duration_us=self.durations.copy(),
            samples=self.samples.copy(),
            compile_s=self.compile_s.copy(),
            spent_s=self.spent,
            failures=failures,
        )


def drive(policy: Any, table: ReplayTable, seed: int = 0, rng: np.random.Generator | None = None) -> Trace:
    """Plan, then refine until the policy stops; every proposal is checked against the protocol."""
    rng = rng if rng is not None else np.random.default_rng(seed)
    sim = Simulator(table, seed)
    trace = Trace()
    decision = policy.plan(rng)
    while len(decision.batch):
        assert len(set(decision.batch)) == len(decision.batch), "a config twice in one batch"
        trace.decisions.append(decision)
        sim.measure(decision)
        decision = policy.refine(sim.observed(), rng)
        assert len(trace.decisions) < 1000, "the policy never stops"
    trace.decisions.append(decision)
    trace.durations = sim.durations
    return trace


def decide_and_resume(
    policy: Any, configs: list, observed: Observations, rng: np.random.Generator
) -> tuple[Decision, Decision, Any]:
    """The policy's next decision, and that of a new policy over `configs` restored from its state.

    The state goes through msgpack and the new policy gets an RNG in the same
    state, as a resumed tune does. Returns both decisions and the new policy.
    """
    blob = msgpack.packb(policy.state_dict(), use_bin_type=True)
    rng_state = rng.bit_generator.state
    expected = policy.refine(observed, rng)
    resumed = type(policy)(configs)
    resumed.load_state_dict(msgpack.unpackb(blob, raw=False))
    rng_again = np.random.default_rng()
    rng_again.bit_generator.state = rng_state
    return expected, resumed.refine(observed, rng_again), resumed


def resumed_from_before(knob: str, configs: list) -> Any:
    """A FastaPolicy resumed from a state written before `knob` existed (its stored params lack it)."""
    from fasta_sm.policies.fasta.policy import FastaPolicy

    state = FastaPolicy(configs).state_dict()
    del state["params"][knob]
    resumed = FastaPolicy(configs)
    resumed.load_state_dict(state)
    return resumed


def proposed_over_a_spill(table: ReplayTable, params: dict, seed: int, pressure: np.ndarray) -> list[int]:
    """Configs a FastaPolicy tune of `table` proposed under at least the `pressure` of a spill it had measured.

    A spill, as spill dominance reads one: a config that ran 3x the best so far or slower with at least the
    best's tile area (BLOCK_M x BLOCK_N) and tile per warp.
    """
    from fasta_sm.policies.fasta.features import extract_features
    from fasta_sm.policies.fasta.policy import FastaPolicy

    policy = FastaPolicy(table.configs, **params)
    space = extract_features(table.configs)
    area = space.raw[:, space.names.index("kwargs.BLOCK_M")] * space.raw[:, space.names.index("kwargs.BLOCK_N")]
    load = area / space.raw[:, space.names.index("num_warps")]
    rng = np.random.default_rng(seed)
    sim = Simulator(table, seed)
    found = []
    decision = policy.plan(rng)
    while len(decision.batch):
        if not decision.retime:
            ran = np.flatnonzero(np.isfinite(sim.durations))
            if ran.size:
                best = ran[np.argmin(sim.durations[ran])]
                larger = (area[ran] >= area[best]) & (load[ran] >= load[best])
                slow = ran[(sim.durations[ran] >= 3.0 * sim.durations[best]) & larger]
                found += [i for i in decision.batch if any(np.all(pressure[i] >= pressure[s]) for s in slow)]
        sim.measure(decision)
        decision = policy.refine(sim.observed(), rng)
    return found
