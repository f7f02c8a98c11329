"""TuningMachine: the one place that knows the order of a tune's steps.

States R1, R2 and DONE; triggers `compile`, `benchmark` and `refine`. Each trigger
calls its handler (backend or policy) and then checkpoints. One `transitions`
machine is shared by every tune in the process; a tune is a model added to it.

Within a round the machine compiles the batch, benchmarks what compiled, then
asks the policy to refine: a new R2 round, or DONE. Compile and benchmark work
in chunks (compiles in parallel batches, timings a few at a time) so that a
crash loses at most one chunk of work. A backend that returns from compiling
as soon as any config is done (`compile_first`) has each config timed while
the rest of its batch compiles. A backend that can compile ahead
(`prefetch`) is told the rest of a batch too large for one chunk, and which
untried configs the next round is likeliest to pick (as an R2 batch starts
compiling and again once it is compiled, and while R1's last chunks are
timed), so its idle workers compile them while this batch is compiled and
timed.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

import numpy as np
from transitions import Machine

from .config import Config
from .errors import BackendError, FastaError, PolicyError, TuneFailed, add_note, describe, notes_of
from .fork_safe import ForkSafeLock
from .lookahead import likely_next
from .protocols import LONGEST_S, LONGEST_US, Backend, ChecksRound, CompileOutcome, Decision, Policy, as_index
from .state import (
    PHASES,
    SEED_MAX,
    RoundRecord,
    TuneState,
    decode_rng,
    encode_rng,
    pack_state,
    storable_text,
    unpack_state,
)

log = logging.getLogger("fasta_sm.machine")
ROLLBACK = "fasta_sm_rollback"
"""Set on the record of the warning that a failed step was rolled back to the last checkpoint."""

DEFAULT_CHUNK = 16
DEFAULT_BENCHMARK_CHUNK = 4
PREFETCH_MAX = 64
"""At most this many guesses (the lookahead's picks, then by prediction) are offered beyond the batch's own configs."""
MAX_TIMINGS = 1000
"""The most timings one config may have: a policy that re-times without end is told, rather than run forever
with its state file growing at every round."""
R1_GUESS_UNTIMED = 8
"""While R1 is timed, the first guided batch is guessed once at most this many of R1's configs are left to time."""

STATES = list(PHASES)
TRANSITIONS = [
    {
        "trigger": "compile",
        "source": ["R1", "R2"],
        "dest": None,
        "conditions": "at_compile",
        "before": "_compile_chunk",
        "after": "_checkpoint",
    },
    {
        "trigger": "benchmark",
        "source": ["R1", "R2"],
        "dest": None,
        "conditions": "at_benchmark",
        "before": "_benchmark_chunk",
        "after": "_checkpoint",
    },
    {
        "trigger": "refine",
        "source": ["R1", "R2"],
        "dest": "DONE",
        "prepare": "_ask_policy",
        "conditions": ["at_refine", "policy_stopped"],
        "before": "_finish",
        "after": "_checkpoint",
    },
    {
        "trigger": "refine",
        "source": ["R1", "R2"],
        "dest": "R2",
        "conditions": "at_refine",
        "before": "_next_round",
        "after": "_checkpoint",
    },
]

_machine: Machine | None = None
_machine_lock = ForkSafeLock()


def shared_machine() -> Machine:
    """The process-wide machine; tunes join it with `add_model` (a few KB each)."""
    global _machine
    with _machine_lock:
        if _machine is None:
            _machine = Machine(
                model=None,
                states=STATES,
                transitions=TRANSITIONS,
                initial="R1",
                auto_transitions=False,
                model_attribute="machine_state",
            )
        return _machine


Checkpoint = Callable[[TuneState, bytes], None]


class Tune:
    """One kernel's tune: a TuneState driven through the shared machine.

    `checkpoint` receives the state and its packed bytes after every step (the
    tuner writes them to the store); a handler that raises restores the state
    of the last checkpoint, records the error there, and re-raises.
    """

    def __init__(
        self,
        state: TuneState,
        backend: Backend,
        policy: Policy,
        checkpoint: Checkpoint | None = None,
        chunk_size: int = DEFAULT_CHUNK,
        benchmark_chunk: int = DEFAULT_BENCHMARK_CHUNK,
    ) -> None:
        for name, value in (("chunk_size", chunk_size), ("benchmark_chunk", benchmark_chunk)):
            if value < 1:
                raise ValueError(f"{name}={value!r} must be at least 1")
        self.backend = backend
        self.policy = policy
        self.chunk_size = chunk_size
        self.benchmark_chunk = benchmark_chunk
        self._on_checkpoint = checkpoint
        self._decision: Decision | None = None
        self._lookahead: tuple[tuple[int, int], list[int]] = ((-1, 0), [])
        self._last_blob = pack_state(state)
        self._closed = False
        self._adopt(state)
        shared_machine().add_model(self, initial=state.phase)

    def _adopt(self, state: TuneState) -> None:
        """Make `state` current: the policy's memory and the RNG continue from it."""
        self.state = state
        if state.policy_state or state.rounds:  # a state that has opened a round holds what its policy wrote
            self.policy.load_state_dict(state.policy_state)
            if state.rounds and not state.done and isinstance(self.policy, ChecksRound):
                self.policy.check_round(state.rounds[-1].batch)
        self._rng = decode_rng(state.rng_state) if state.rng_state else np.random.default_rng(state.seed)

    @classmethod
    def start(
        cls,
        key: str,
        kernel: str,
        configs: Sequence[Config],
        backend: Backend,
        policy: Policy,
        *,
        policy_params: dict | None = None,
        seed: int = 0,
        checkpoint: Checkpoint | None = None,
        chunk_size: int = DEFAULT_CHUNK,
        benchmark_chunk: int = DEFAULT_BENCHMARK_CHUNK,
        restarts: Sequence[str] = (),
        carried: dict[int, dict] | None = None,
    ) -> Tune:
        """A new tune at R1 with its planned batch, checkpointed once.

        `restarts` says why an earlier state for this key was set aside, if one
        was; `carried` holds that state's results for configs still in the list
        (index → compile_s, durations_us, error), reused instead of measured.
        A state that would not read back (a bool for a seed, a backend that
        describes itself as None) is refused before its first checkpoint: a
        file the next process set aside would never be reused.
        """
        seed = check_seed(kernel, seed)
        state = TuneState(
            key=key,
            kernel=kernel,
            configs=list(configs),
            policy=policy.name,
            policy_params=dict(policy_params or {}),
            seed=int(seed),
            backend=backend.describe(),
            restarts=[storable_text(note) for note in restarts],
            carried=dict(carried or {}),
        )
        tune = cls(state, backend, policy, checkpoint, chunk_size, benchmark_chunk)
        try:
            started = time.perf_counter()
            decision = policy.plan(tune._rng)
            _check_batch_kind(kernel, policy.name, decision.batch)
            if len(decision.batch) == 0:
                raise PolicyError(f"kernel {kernel!r}: policy {policy.name!r} planned an empty R1 batch")
            planned_s = time.perf_counter() - started
            state.cost.policy_s += planned_s
            tune._open_round(decision, "R1", 0, planned_s)
            _check_reads_back(state)
            tune._checkpoint()
        except BaseException as exc:
            tune.close()  # a tune that never started must not stay in the shared machine
            if isinstance(exc, Exception) and not isinstance(exc, FastaError):  # as `advance` notes a refine's
                add_note(exc, f"fasta-sm: kernel {kernel!r} at R1 plan")
            raise
        return tune

    def close(self) -> None:
        """Leave the shared machine (it keeps a reference to every model), and stop the backend's guesses.

        A backend that compiles ahead (`cancel_prefetch`) would otherwise go
        on compiling its list of guesses, which no round of this tune will
        ask for, beside whatever the process compiles next. A second call
        does nothing: a caller's `finally` that closes a tune closed already
        must not raise over the error it is handling.
        """
        if self._closed:
            return
        self._closed = True
        shared_machine().remove_model(self)
        cancel = getattr(self.backend, "cancel_prefetch", None)
        if cancel is None:
            return
        try:
            cancel()
        except Exception as exc:  # noqa: BLE001  a hint that fails to stop must not hide the tune's result
            log.warning("kernel %s: cancelling prefetch failed: %s: %s", self.state.kernel, type(exc).__name__, exc)

    def drive(self, until: Callable[[TuneState], bool] | None = None) -> TuneState:
        """Run from wherever the state stands to DONE, or until `until(state)` holds.

        `until` lets an integration split a tune between processes, e.g. a
        compile worker that stops once R1 is compiled.
        """
        while not self.state.done and not (until is not None and until(self.state)):
            self.advance()
        return self.state

    def advance(self) -> None:
        """Fire the trigger the state says is next; roll back on error.

        A DONE tune has no next trigger: it is refused before the rollback,
        which would record the refusal in a finished tune's file.
        """
        if self.state.done:
            raise TuneFailed(f"kernel {self.state.kernel!r}: the tune is DONE; it has no step to take")
        step, where = self.state.step, self.state.position()
        try:
            fired = getattr(self, step)()
        except Exception as exc:
            self._rollback(exc)
            if not isinstance(exc, FastaError):  # fasta-sm's own errors name the kernel already
                add_note(exc, f"fasta-sm: kernel {self.state.kernel!r} at {where}")
            raise
        except BaseException:  # an interrupt writes nothing, as a kill would; a drive() after it starts from the file
            self._restore()
            raise
        if not fired:
            raise TuneFailed(f"kernel {self.state.kernel!r}: trigger {step!r} did not fire at {self.state.position()}")

    # conditions

    def at_compile(self) -> bool:
        return self.state.step == "compile"

    def at_benchmark(self) -> bool:
        return self.state.step == "benchmark"

    def at_refine(self) -> bool:
        return self.state.step == "refine"

    def policy_stopped(self) -> bool:
        return self._decision is not None and len(self._decision.batch) == 0

    # handlers

    def _compile_chunk(self) -> None:
        state = self.state
        for index in [i for i in state.uncompiled() if i in state.carried]:
            self._reuse_compile(index)
        todo = state.uncompiled()
        chunk = todo[: self.chunk_size]
        if chunk:
            self._prefetch(reserve=len(chunk), rest=todo[len(chunk) :])
            outcomes = self._compile([state.configs[i] for i in chunk])
            spent = 0.0
            for position, outcome in sorted(outcomes.items()):
                index = chunk[position]
                seconds = _check_seconds(state.kernel, "compile seconds", outcome.seconds)
                spent += seconds
                if outcome.error is None:
                    state.compiled[index] = seconds
                else:
                    state.failed[index] = storable_text(outcome.error)
                    log.info("kernel %s: config #%d failed to compile: %s", state.kernel, index, outcome.error)
            state.cost.compile_s += spent
            state.rounds[-1].compile_s += spent
        uncompiled = state.uncompiled()
        if not uncompiled or (self._compiles_on and state.ready_to_time()):
            state.step = "benchmark"
        if not uncompiled:
            self._prefetch(reserve=0, rest=[])

    @property
    def _compiles_on(self) -> bool:
        """Whether the backend returns from compiling before the whole chunk is done (`compile_first`)."""
        return callable(getattr(self.backend, "compile_first", None))

    def _compile(self, configs: list[Config]) -> dict[int, CompileOutcome]:
        """Outcomes by position in `configs`: all of them, or with `compile_first` those done first.

        A backend whose `compile_first(configs)` returns as soon as any config
        is compiled (the others compiling on) lets the machine time that one
        while the rest compile: the round then waits on its slowest compile,
        not on that plus every timing.
        """
        if not self._compiles_on:
            listed = self.backend.compile(configs)
            if len(listed) != len(configs):
                raise BackendError(
                    f"kernel {self.state.kernel!r}: backend compiled {len(listed)} outcomes for {len(configs)} configs"
                )
            return dict(enumerate(listed))
        outcomes = dict(self.backend.compile_first(configs))
        positions = [as_index(p) for p in outcomes]  # True is no position, though it equals 1; a numpy int is one
        if not outcomes or not all(p is not None and 0 <= p < len(configs) for p in positions):
            raise BackendError(
                f"kernel {self.state.kernel!r}: compile_first returned positions {list(outcomes)!r:.120} "
                f"for {len(configs)} configs (at least one, each below {len(configs)})"
            )
        return dict(zip(positions, outcomes.values()))

    def _prefetch(self, reserve: int, rest: list[int]) -> None:
        """Offer a backend that compiles ahead the configs it will be asked for, then those likeliest to come next.

        First `rest`, the batch's configs beyond the chunk about to compile:
        certain work, which keeps workers busy across the chunk boundary
        instead of idle while the chunk's slowest compile ends. Then guesses
        (`_guesses`): in a guided round, as its batch starts compiling and once
        it is compiled; in R1, while its last chunks are timed.

        `reserve` is how many compiles the backend is about to be asked for,
        so that guesses leave room for them. A hint only: the tune records
        nothing of it but the lookahead's seconds (policy time), and a backend
        that fails to take it costs the tune nothing but a log line.
        """
        state = self.state
        prefetch = getattr(self.backend, "prefetch", None)
        if prefetch is None or state.retime:
            return
        order = list(rest)
        if state.predicted_us or (state.phase == "R1" and state.step == "benchmark"):
            order += self._guesses()
        if not order:
            return
        try:
            prefetch([state.configs[i] for i in order[: len(rest) + PREFETCH_MAX]], reserve=reserve, certain=len(rest))
        except Exception as exc:  # noqa: BLE001  a hint that fails must not fail the tune
            log.warning("kernel %s: prefetch failed: %s: %s", state.kernel, type(exc).__name__, exc)

    def _guesses(self) -> list[int]:
        """Untried configs, likeliest next first: the lookahead's picks, then by prediction.

        The lookahead runs once per guided round, and in R1 once per chunk
        of timings (it has only those timings to go on).
        """
        state = self.state
        moment = (state.round, len(state.round_done) if state.phase == "R1" else 0)
        if self._lookahead[0] != moment:
            started = time.perf_counter()
            try:
                likely = likely_next(state, self.policy, self._rng)
            except Exception as exc:  # noqa: BLE001  a guess must never fail the tune
                log.warning("kernel %s: lookahead failed: %s: %s", state.kernel, type(exc).__name__, exc)
                likely = []
            self._lookahead = (moment, likely)
            elapsed = time.perf_counter() - started
            state.cost.policy_s += elapsed
            state.rounds[-1].policy_s += elapsed
        likely = self._lookahead[1]
        if not state.predicted_us:
            return list(likely)
        predicted = np.asarray(state.predicted_us, dtype=float)
        tried = set(state.compiled) | set(state.failed) | set(state.pending)
        return likely + [
            int(i)
            for i in np.argsort(predicted, kind="stable")
            if int(i) not in tried and math.isfinite(predicted[i]) and int(i) not in likely
        ]

    def _benchmark_chunk(self) -> None:
        state = self.state
        timed_before = len(state.round_done)
        todo = state.ready_to_time()
        for index in [i for i in todo if state.carried.get(i, {}).get("durations_us")]:
            carried = state.carried.pop(index)["durations_us"]
            state.durations[index] = [_check_duration(state.kernel, state.configs[index], x) for x in carried]
            state.carried_taken[index] = len(carried)
            state.round_done.append(index)
        if len(state.round_done) > timed_before:
            self._update_best()
        finished = set(state.round_done)  # a set: list membership made each step O(N²)
        todo = [i for i in todo if i not in finished]
        chunk = todo[: self.benchmark_chunk]
        if chunk:
            repeat = [len(state.durations.get(i, ())) for i in chunk]
            outcome = self.backend.benchmark([state.configs[i] for i in chunk], repeat=repeat)
            if isinstance(outcome.durations_us, (Mapping, Set, str, bytes)):  # list() would take keys, or any order
                raise BackendError(
                    f"kernel {state.kernel!r}: backend returned durations as {type(outcome.durations_us).__name__} "
                    f"{outcome.durations_us!r:.60}, not a sequence in the order of its {len(chunk)} configs"
                )
            durations = list(outcome.durations_us)
            if len(durations) != len(chunk):
                raise BackendError(
                    f"kernel {state.kernel!r}: backend returned {len(durations)} durations for {len(chunk)} configs"
                )
            spent = _check_seconds(state.kernel, "benchmark seconds", outcome.seconds)
            values = [_check_duration(state.kernel, state.configs[i], value) for i, value in zip(chunk, durations)]
            for position, (index, value) in enumerate(zip(chunk, values)):  # all checked: nothing half-recorded
                if math.isinf(value):
                    state.failed[index] = storable_text(outcome.errors.get(position) or "failed at run time")
                    state.durations.pop(index, None)
                else:
                    state.durations.setdefault(index, []).append(value)
                state.round_done.append(index)
            state.cost.benchmark_s += spent
            state.rounds[-1].benchmark_s += spent
            self._update_best()
        uncompiled = state.uncompiled()
        if len(todo) <= len(chunk):
            state.step = "compile" if uncompiled else "refine"
        elif state.phase == "R1" and len(todo) - len(chunk) + len(uncompiled) <= R1_GUESS_UNTIMED:
            self._prefetch(reserve=0, rest=uncompiled)

    def _reuse_compile(self, index: int) -> None:
        """Take a compile outcome carried over from the tune this one superseded: no new compile."""
        state = self.state
        carried = state.carried[index]
        state.carried_taken[index] = 0
        if carried.get("error") is not None:
            state.failed[index] = str(carried["error"])
            del state.carried[index]
        else:
            state.compiled[index] = float(carried.get("compile_s") or 0.0)
            if not carried.get("durations_us"):
                del state.carried[index]

    def _ask_policy(self) -> None:
        """Ask the policy once per refine; the transitions' conditions read its answer."""
        state = self.state
        if state.step != "refine" or self._decision is not None:
            return
        started = time.perf_counter()
        self._decision = self.policy.refine(state.observed(), self._rng)
        _check_batch_kind(state.kernel, state.policy, self._decision.batch)
        elapsed = time.perf_counter() - started
        state.cost.policy_s += elapsed
        state.rounds[-1].policy_s += elapsed
        state.rounds[-1].finished = time.time()

    def _next_round(self) -> None:
        assert self._decision is not None
        self._open_round(self._decision, "R2", self.state.round + 1)

    def _finish(self) -> None:
        state, decision = self.state, self._decision
        assert decision is not None
        if state.best is None:
            untried = state.n_configs - len(state.failed)
            rest = f"{untried} never tried (a larger budget would try them), " if untried else ""
            raise TuneFailed(
                f"kernel {state.kernel!r}: no config ran: {len(state.failed)} of {state.n_configs} failed, "
                f"{rest}and the policy stopped ({decision.reason}); "
                f"first error: {next(iter(state.failed.values()), 'none')}"
            )
        _check_reason(state, decision)
        _check_prediction(state, decision)
        self._keep_decision(decision)
        state.phase, state.step, state.pending, state.round_done = "DONE", "done", [], []
        state.stop_reason = decision.reason
        log.info(
            "kernel %s: done, winner #%d (%.4g µs) of %d measured: %s",
            state.kernel, state.best, state.best_us, len(state.durations), decision.reason,
        )

    def _open_round(self, decision: Decision, phase: str, round_: int, policy_s: float = 0.0) -> None:
        state = self.state
        batch = self._check_batch(decision)
        self._keep_decision(decision)
        predicted = decision.predicted_us
        state.rounds.append(
            RoundRecord(
                phase=phase,
                round=round_,
                batch=batch,
                reason=decision.reason,
                retime=bool(decision.retime),
                predicted_us=[] if predicted is None else [float(predicted[i]) for i in batch],
                started=time.time(),
                policy_s=policy_s,
            )
        )
        state.phase, state.round, state.step = phase, round_, "compile"
        state.pending, state.retime, state.round_done = batch, bool(decision.retime), []

    def _keep_decision(self, decision: Decision) -> None:
        self.state.policy_state = self.policy.state_dict()
        self.state.rng_state = encode_rng(self._rng)
        if decision.predicted_us is not None:
            self.state.predicted_us = [float(x) for x in np.asarray(decision.predicted_us, dtype=float)]

    def _check_batch(self, decision: Decision) -> list[int]:
        state = self.state
        name = f"kernel {state.kernel!r}: policy {state.policy!r}"
        _check_reason(state, decision)
        if not isinstance(decision.retime, (bool, np.bool_)):
            raise PolicyError(f"{name} gave retime={decision.retime!r}; expected True or False")
        batch = [as_index(i) for i in decision.batch]
        if None in batch:  # int() would take 2.7 for #2 and True for #1
            raise PolicyError(f"{name} proposed {decision.batch[batch.index(None)]!r}, not a config index")
        if len(set(batch)) != len(batch):
            raise PolicyError(f"{name} proposed a config twice in one batch: {batch}")
        for index in batch:
            if not 0 <= index < state.n_configs:
                raise PolicyError(f"{name} proposed config #{index}, outside 0..{state.n_configs - 1}")
            if index in state.failed:
                raise PolicyError(f"{name} proposed config #{index}, which failed: {state.failed[index]}")
            if decision.retime and index not in state.durations:
                raise PolicyError(f"{name} asked to re-time config #{index}, which was never measured")
            if decision.retime and len(state.durations[index]) >= MAX_TIMINGS:
                raise PolicyError(f"{name} asked to re-time config #{index}, which has {len(state.durations[index])} "
                                  f"timings already, the most a config may have ({MAX_TIMINGS}): a policy must stop")
            if not decision.retime and index in state.durations:
                raise PolicyError(f"{name} proposed config #{index} again without asking to re-time it")
        _check_prediction(state, decision)
        return batch

    def _update_best(self) -> None:
        state = self.state
        if not state.durations:
            state.best, state.best_us = None, None
            return
        best = min(state.durations, key=lambda i: (state.mean_us(i), i))
        state.best, state.best_us = best, state.mean_us(best)

    def _checkpoint(self) -> None:
        self._decision = None
        self.state.updated = time.time()
        try:
            blob = pack_state(self.state)
        except (TypeError, ValueError, OverflowError) as exc:  # what a backend or policy handed back
            raise TuneFailed(
                f"kernel {self.state.kernel!r}: the state at {self.state.position()} cannot be written: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if self._on_checkpoint is not None:  # what a backend or policy handed back must not make the file unreadable
            _check_reads_back(self.state, blob, TuneFailed)
            self._on_checkpoint(self.state, blob)
        self._last_blob = blob

    def _restore(self) -> TuneState:
        """Memory back to the last checkpoint: a step cut short may have moved the policy or its RNG on."""
        restored = unpack_state(self._last_blob, source=f"checkpoint of {self.state.kernel!r}")
        self._adopt(restored)
        shared_machine().set_state(restored.phase, model=self)
        self._decision = None
        return restored

    def _rollback(self, exc: BaseException) -> None:
        """Back to the last checkpoint, with the error recorded there too."""
        restored = self._restore()
        restored.last_error = storable_text(
            "; ".join([f"{restored.position()}: {describe(exc)}", *notes_of(exc)])
        )
        log.warning("kernel %s: %s; state kept at the last checkpoint", restored.kernel, restored.last_error,
                    extra={ROLLBACK: True})
        self._checkpoint()


def check_seed(kernel: str, seed: int) -> int:
    """The seed as an int; True is no seed, though it equals 1 and would find seed 1's tune."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral) or not 0 <= seed <= SEED_MAX:
        raise ValueError(f"kernel {kernel!r}: seed={seed!r} must be an integer in [0, 2**64)")
    return int(seed)


def _check_reads_back(state: TuneState, blob: bytes | None = None, error: type[Exception] = ValueError) -> None:
    """Refuse a state its reader would reject: the next process would set the file aside, never reuse it."""
    try:
        unpack_state(pack_state(state) if blob is None else blob, source=f"the state of {state.kernel!r}")
    except Exception as exc:  # noqa: BLE001  msgpack's own errors too: an argument it cannot carry
        raise error(
            f"kernel {state.kernel!r}: its state at {state.position()} would not read back, so it is not written: "
            f"{type(exc).__name__}: {exc}"
        ) from None


def _check_batch_kind(kernel: str, policy: str, batch: Any) -> None:
    """A batch is a sequence of indices (a list, tuple, range or 1-d array): a generator has no length, and a set,
    a map or text would be read as other configs, or as none."""
    ordered = isinstance(batch, Sequence) and not isinstance(batch, (str, bytes))
    if not (ordered or (isinstance(batch, np.ndarray) and batch.ndim == 1)):
        raise PolicyError(
            f"kernel {kernel!r}: policy {policy!r} gave a batch that is not a sequence of config indices: "
            f"{type(batch).__name__} {batch!r:.60}"
        )


def _check_reason(state: TuneState, decision: Decision) -> None:
    """A reason is stored and shown: anything but text would make the state file unreadable."""
    if not isinstance(decision.reason, str):
        raise PolicyError(
            f"kernel {state.kernel!r}: policy {state.policy!r} gave reason {decision.reason!r}; expected a string"
        )


def _check_prediction(state: TuneState, decision: Decision) -> None:
    """One prediction per config, on a stop as on a round: the state keeps it against the config list."""
    if decision.predicted_us is not None and len(decision.predicted_us) != state.n_configs:
        raise PolicyError(
            f"kernel {state.kernel!r}: policy {state.policy!r} predicted {len(decision.predicted_us)} durations "
            f"for {state.n_configs} configs"
        )


def _check_seconds(kernel: str, what: str, value: float) -> float:
    number = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if number and isinstance(value, np.generic):  # np.float16 would cast the bound to its type: inf, and a warning
        value = value.item()
    if not number or not 0 <= value <= LONGEST_S or not math.isfinite(value):  # range first: an int past any
        raise BackendError(  # float (10**400) overflows math.isfinite
            f"kernel {kernel!r}: backend reported {what} {value!r:.60}; expected a number from 0 to {LONGEST_S:g}"
        )
    return float(value)


def _check_duration(kernel: str, config: Config, value: float) -> float:
    given = value
    try:
        if isinstance(value, (bool, np.bool_, str, bytes)):  # float() would take True as 1 µs, "12" as 12 µs
            raise TypeError
        with np.errstate(over="ignore"):
            value = float(value)
    except OverflowError:  # an int past any float (10**400)
        raise BackendError(
            f"kernel {kernel!r}: duration {given!r:.60} µs for {config.label()} is invalid (past any float)"
        ) from None
    except (TypeError, ValueError):
        raise BackendError(f"kernel {kernel!r}: duration {value!r} for {config.label()} is not a number") from None
    if math.isinf(value) and not given == value:  # a finite timing past a float (np.longdouble 1e4000): no failure
        value = math.copysign(LONGEST_US * 10, value)  # refused below as what it is, a timing past the bound
    if math.isnan(value) or value <= 0:  # a kernel takes time: zero is a timer that saw nothing
        raise BackendError(
            f"kernel {kernel!r}: duration {value!r} µs for {config.label()} is invalid (NaN, zero or negative)"
        )
    if LONGEST_US < value < math.inf:  # inf is the protocol's "failed at run time"
        raise BackendError(
            f"kernel {kernel!r}: duration {given!r:.60} µs for {config.label()} is invalid (over {LONGEST_US:g} µs)"
        )
    return value
