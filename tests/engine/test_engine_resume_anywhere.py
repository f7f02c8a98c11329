"""Resume equivalence at any interruption, for every policy and fasta's options.

test_engine_crash.py kills exhaustive, random and fasta tunes at random
moments and compares batches, durations and the winner. This file covers
what it leaves out: coordesc and trees, fasta with the config optimizer and
with its prior on and off, a backend that compiles ahead (`prefetch`,
`compile_first`: the lookahead runs), interruptions chosen step by step (after
checkpoint k, inside the k-th compile or benchmark call, as a kill or as a
handler error the machine rolls back), a resume through a fresh StateStore
object, and a comparison of the whole outcome: every timing and compile, the
rounds with their reasons, predictions and charged seconds, the RNG, the
policy's state, the carried-result record. And across the two runs no config
is compiled twice and no (config, k-th timing) is taken twice: nothing
measured before the interruption is measured again.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from engine_harness import synthetic_table, write_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.state import TuneState
from fasta_sm.store import StateStore
from fasta_sm.tuner import tune

KEY = "mm_synth:resume"
EARLIER_KEY = "mm_synth:earlier-shape"
SEED = 3
HERE = Path(__file__).resolve().parent

SETTINGS = {  # name: (policy, params, seeded with an earlier finished tune of the kernel, prior on)
    "exhaustive": ("exhaustive", {}, False, True),
    "random": ("random", {"budget": 0.5}, False, True),
    "coordesc": ("coordesc", {"budget": 0.5}, False, True),
    "trees": ("trees", {"budget": 0.5}, False, True),
    "fasta": ("fasta", {}, False, True),
    "fasta-optimizer": ("fasta", {"optimize_configs": True}, False, True),
    "fasta-prior": ("fasta", {}, True, True),
    "fasta-prior-off": ("fasta", {}, True, False),
}
HAS_SKLEARN = importlib.util.find_spec("sklearn") is not None


class Stop(BaseException):
    """A kill: not an Exception, so the machine does not roll back; the process would be gone."""


class Interrupting:
    """A replay backend that logs each config it compiles and each (config, k-th timing) it hands out, and that
    raises `error` at the start of its `at`-th call of `kind` (compile or benchmark), before doing anything."""

    def __init__(self, table, log: list, kind: str | None = None, at: int = -1, error: type = Stop) -> None:
        self.inner = ReplayBackend(table, noise=True, seed=SEED)
        self.table, self.log, self.kind, self.at, self.error = table, log, kind, at, error
        self.calls = collections.Counter()

    def describe(self) -> str:
        return self.inner.describe()

    def _enter(self, kind: str) -> None:
        self.calls[kind] += 1
        if kind == self.kind and self.calls[kind] == self.at:
            raise self.error(f"interrupted in {kind} call {self.at}")

    def compile(self, configs):
        self._enter("compile")
        self.log.extend(("compile", self.table.index_of(c)) for c in configs)
        return self.inner.compile(configs)

    def benchmark(self, configs, repeat=None):
        self._enter("benchmark")
        outcome = self.inner.benchmark(configs, repeat=repeat)
        self.log.extend(("timing", self.table.index_of(c), k) for c, k in zip(configs, repeat))
        return outcome


class CompilingAhead(Interrupting):
    """As the live Triton backend: takes guesses to compile ahead (the machine runs its lookahead for them), and
    returns from compiling a chunk with only its first half done."""

    def prefetch(self, configs, reserve=0, certain=0) -> None:
        pass

    def compile_first(self, configs):
        done = max(1, (len(configs) + 1) // 2)
        return dict(enumerate(self.compile(configs[:done])))


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return load_table(write_table(tmp_path_factory.mktemp("table") / "mm_synth.json", synthetic_table()))


@pytest.fixture(scope="module")
def earlier(table, tmp_path_factory) -> Path:
    """A state dir holding one finished tune of the kernel under another key: what the prior offers."""
    path = tmp_path_factory.mktemp("earlier")
    tune(EARLIER_KEY, table.kernel, table.configs, ReplayBackend(table, noise=True, seed=11), policy="exhaustive",
         seed=11, store=StateStore(path))
    return path


def new_store(name: str, earlier: Path, parent: Path) -> StateStore:
    path = Path(tempfile.mkdtemp(dir=parent))
    if SETTINGS[name][2]:
        for state_file in earlier.glob("*.fsm"):
            shutil.copy2(state_file, path / state_file.name)
    return StateStore(path)


def run(table, name: str, store: StateStore, backend, on_step=None) -> TuneState:
    policy, params, _, prior = SETTINGS[name]
    return tune(KEY, table.kernel, table.configs, backend, policy=policy, policy_params=params, seed=SEED,
                store=store, chunk_size=4, benchmark_chunk=3, on_step=on_step, prior=prior).state


def outcome(state: TuneState) -> dict:
    """Everything a tune decided and measured; not its wall-clock stamps or policy seconds."""
    return {
        "phase": state.phase, "best": state.best, "best_us": state.best_us, "durations": state.durations,
        "failed": state.failed, "compiled": state.compiled, "carried": state.carried,
        "carried_taken": state.carried_taken, "rng_state": state.rng_state, "policy_state": state.policy_state,
        "predicted_us": json.dumps(state.predicted_us), "stop_reason": state.stop_reason,
        "cost": (state.cost.compile_s, state.cost.benchmark_s),
        "rounds": [(r.phase, r.round, r.batch, r.reason, r.retime, json.dumps(r.predicted_us), r.compile_s,
                    r.benchmark_s) for r in state.rounds],
    }


_references: dict[tuple[str, bool], tuple[dict, int, collections.Counter]] = {}


def reference(table, name: str, ahead: bool, earlier: Path, parent: Path):
    """The uninterrupted tune's outcome, its checkpoint count and its backend calls by kind."""
    if (name, ahead) not in _references:
        steps = []
        backend = (CompilingAhead if ahead else Interrupting)(table, [])
        state = run(table, name, new_store(name, earlier, parent), backend, on_step=lambda s: steps.append(1))
        _references[name, ahead] = (outcome(state), len(steps), backend.calls)
    return _references[name, ahead]


def interrupted_then_resumed(table, name, ahead, interruptions, earlier, parent):
    """Run a tune interrupted at each of `interruptions` in turn (each run resuming the last), each point picked
    as (where, error, share of the uninterrupted tune's checkpoints or calls of that kind), then resume it through
    a fresh store object and backend (a fresh policy too: tune() makes one); return the uninterrupted outcome, the
    final state, the file's, and every run's backend log."""
    expected, checkpoints, calls = reference(table, name, ahead, earlier, parent)
    store = new_store(name, earlier, parent)
    log: list = []
    for where, error, share in interruptions:
        kind = None if where == "checkpoint" else where
        count = checkpoints if kind is None else calls[kind]
        at = 1 + min(count - 1, int(share * count))  # counted within this run: a resumed run has fewer left
        backend = (CompilingAhead if ahead else Interrupting)(table, log, kind, at, error)
        seen = [0]

        def stop_after_checkpoint(state, kind=kind, at=at, seen=seen):
            seen[0] += 1
            if kind is None and seen[0] == at:
                raise Stop(f"interrupted after checkpoint {at}")

        try:
            run(table, name, StateStore(store.path), backend, on_step=stop_after_checkpoint)
        except (Stop, RuntimeError):
            pass
    again = StateStore(store.path)
    final = run(table, name, again, (CompilingAhead if ahead else Interrupting)(table, log))
    on_disk = again.read(again.file_for(KEY))
    return expected, final, on_disk, log


@pytest.mark.parametrize("name", list(SETTINGS))
def test_the_prior_reaches_r1_only_where_it_is_on(table, name, earlier, tmp_path):
    """The settings below differ as they claim: the seeded store's earlier tune is in R1 only with the prior on."""
    if name == "trees" and not HAS_SKLEARN:
        pytest.skip("trees needs scikit-learn")
    expected, _, _ = reference(table, name, False, earlier, tmp_path)
    says_earlier = "earlier tunes" in expected["rounds"][0][3]
    assert says_earlier == (name == "fasta-prior"), expected["rounds"][0][3]


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(list(SETTINGS)), ahead=st.booleans(),
       interruptions=st.lists(st.tuples(st.sampled_from(["checkpoint", "compile", "benchmark"]),
                                        st.sampled_from([Stop, RuntimeError]), st.floats(0.0, 1.0)),
                              min_size=1, max_size=3))
def test_a_tune_interrupted_anywhere_resumes_to_the_uninterrupted_outcome_measuring_nothing_twice(
        table, earlier, tmp_path_factory, name, ahead, interruptions):
    """One to three interruptions, each in the run that resumed the one before."""
    if name == "trees" and not HAS_SKLEARN:
        return
    parent = tmp_path_factory.mktemp("runs")
    expected, final, on_disk, log = interrupted_then_resumed(table, name, ahead, interruptions, earlier, parent)
    assert outcome(final) == expected
    assert outcome(on_disk) == expected
    assert not final.restarts  # resumed from its own file, not set aside and started again
    twice = [entry for entry, n in collections.Counter(log).items() if n > 1]
    assert not twice, f"compiled or timed again after the interruption: {twice[:5]}"
    shutil.rmtree(parent)


CHILD = """
import sys, os, json
sys.path.insert(0, {here!r})
from test_engine_resume_anywhere import SETTINGS, KEY, SEED, Interrupting, run
from fasta_sm.backends.replay import load_table
from fasta_sm.store import StateStore
table = load_table({table!r})
log = []
seen = [0]
def die_after(state):
    seen[0] += 1
    with open({log!r}, "w") as handle:  # what was compiled and timed so far, as the checkpoint stands
        json.dump(log, handle)
    if seen[0] == {at}:
        os._exit(7)  # no cleanup, no finally: as a kill right after the checkpoint
state = run(table, {name!r}, StateStore({store!r}), Interrupting(table, log), on_step=die_after)
with open({log!r}, "w") as handle:
    json.dump(log, handle)
"""


@pytest.mark.parametrize("name", ["coordesc", "trees", "fasta-optimizer"])
def test_a_tune_killed_in_one_interpreter_resumes_in_another_to_the_uninterrupted_outcome(
        table, earlier, tmp_path, name):
    """Not in-process: the first interpreter dies mid-tune (os._exit after a checkpoint), a second one finishes."""
    if name == "trees" and not HAS_SKLEARN:
        pytest.skip("trees needs scikit-learn")
    expected, checkpoints, _ = reference(table, name, False, earlier, tmp_path)
    store = new_store(name, earlier, tmp_path)
    table_file = tmp_path / "mm_synth.json"
    write_table(table_file, synthetic_table())
    logs = []
    for attempt, at in enumerate((checkpoints // 2, -1)):
        log_file = tmp_path / f"log-{attempt}.json"
        script = CHILD.format(here=str(HERE), table=str(table_file), at=at, name=name, store=str(store.path),
                              log=str(log_file))
        child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert child.returncode == (7 if at > 0 else 0), child.stderr[-2000:]
        logs += [tuple(entry) for entry in json.loads(log_file.read_text())]
    final = StateStore(store.path).read(store.file_for(KEY))
    assert outcome(final) == expected
    assert not final.restarts
    twice = [entry for entry, n in collections.Counter(logs).items() if n > 1]
    assert not twice, f"compiled or timed again in the second interpreter: {twice[:5]}"


def _rewrite_forever(state_dir: str, blobs: list[bytes], ready) -> None:
    """A forked writer: the key's file replaced, as a tune's checkpoints replace it, by each blob in turn."""
    store = StateStore(state_dir)
    ready.set()
    while True:
        for blob in blobs:
            store.write(KEY, blob, kernel="mm_synth")


def test_show_and_the_prior_read_a_file_another_process_rewrites_whole_every_time(table, tmp_path):
    """`fasta-sm show --json` and the prior's reader (its quick look at the kernel, then the finished tune) of a
    state file another process keeps replacing: each read sees one of the written states, never a torn one."""
    import multiprocessing
    import os
    import signal
    import time

    from click.testing import CliRunner

    from fasta_sm.cli import main
    from fasta_sm.state import pack_state, unpack_state

    steps = []
    tune(KEY, table.kernel, table.configs, ReplayBackend(table, noise=True, seed=SEED), policy="exhaustive",
         store=StateStore(tmp_path / "made"), chunk_size=1, on_step=lambda s: steps.append(pack_state(s)))
    blobs = [steps[0], steps[len(steps) // 2], steps[-1]]  # small and unfinished, middling, whole and DONE
    states = [unpack_state(blob) for blob in blobs]
    evaluations = {state.evaluations() for state in states}
    state_dir = tmp_path / "states"
    store = StateStore(state_dir)
    store.write(KEY, blobs[0], kernel=table.kernel)
    fork = multiprocessing.get_context("fork")
    ready = fork.Event()
    writer = fork.Process(target=_rewrite_forever, args=(str(state_dir), blobs, ready), daemon=True)
    writer.start()
    try:
        assert ready.wait(timeout=30)
        path, seen, runner = store.file_for(KEY), collections.Counter(), CliRunner()
        started = time.monotonic()  # 1.5 s of reads, longer (15 s at most) until they fell among different writes
        while time.monotonic() < started + 1.5 or (len(seen) < 3 and time.monotonic() < started + 15):
            shown = runner.invoke(main, ["show", "--json", str(path)], catch_exceptions=False)
            assert shown.exit_code == 0, shown.output
            seen[json.loads(shown.output)["evaluations"]] += 1
            assert StateStore.read_kernel(path) == table.kernel
            finished = StateStore.read_finished(path)
            assert finished is None or len(finished.fastest) == states[-1].measured_count()
            seen["finished" if finished else "unfinished"] += 1
        assert set(seen) - {"finished", "unfinished"} <= evaluations
        assert len(seen) >= 3, seen  # the reads did fall among different writes
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(timeout=30)


@pytest.mark.parametrize("error", [Stop, RuntimeError], ids=["kill", "error"])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_tune_interrupted_inside_a_refine_the_stopping_one_included_resumes_to_the_uninterrupted_outcome(
        table, earlier, tmp_path, monkeypatch, name, error):
    """The policy decides (its memory and the RNG move on), then the process dies or the step raises before the
    checkpoint: at R1's refine, a middle one, and the one that stops the tune (the DONE transition)."""
    if name == "trees" and not HAS_SKLEARN:
        pytest.skip("trees needs scikit-learn")
    import fasta_sm.tuner as tuner_module

    expected, _, _ = reference(table, name, False, earlier, tmp_path)
    refines = len(expected["rounds"])  # one refine after each round: the last one stops
    real_make = tuner_module.make_policy
    for at in sorted({1, (refines + 1) // 2, refines}):
        calls = [0]

        def make_policy(policy, configs, params=None, at=at, calls=calls):
            made = real_make(policy, configs, params)
            decide = made.refine

            def refine(observed, rng):
                decision = decide(observed, rng)
                calls[0] += 1
                if calls[0] == at:
                    raise error(f"interrupted in refine {at}, after the policy decided")
                return decision

            made.refine = refine
            return made

        store = new_store(name, earlier, tmp_path)
        log: list = []
        monkeypatch.setattr(tuner_module, "make_policy", make_policy)
        with pytest.raises((Stop, RuntimeError)):
            run(table, name, store, Interrupting(table, log))
        monkeypatch.setattr(tuner_module, "make_policy", real_make)
        final = run(table, name, StateStore(store.path), Interrupting(table, log))
        assert outcome(final) == expected, f"interrupted in refine {at} of {refines}"
        assert not final.restarts
        twice = [entry for entry, n in collections.Counter(log).items() if n > 1]
        assert not twice, f"compiled or timed again after refine {at}: {twice[:5]}"


def test_the_fasta_settings_reach_a_re_time_round(table, earlier, tmp_path):
    """So that the interruptions above fall in re-time rounds too."""
    for name in ("fasta", "fasta-optimizer", "fasta-prior", "fasta-prior-off"):
        expected, _, _ = reference(table, name, False, earlier, tmp_path)
        assert any(retime for _, _, _, _, retime, *_ in expected["rounds"]), name
