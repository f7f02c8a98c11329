"""Crash anywhere: tunes SIGKILLed at random points resume and end as if never interrupted.

How the kills are made. Each attempt starts a child process that runs
`tune()` on the synthetic replay table (noise on) with a small chunk size, so a
tune is ~25 checkpoints; the child's backend sleeps a little at random and
fsyncs every timing it hands out to an append-only log; the child's own
`os.fsync` / `os.replace` sleep at random, so a kill often lands inside
StateStore.write (temp file written, not yet renamed). The parent reads the
state file continuously while the child runs, then SIGKILLs it after a random
delay and restarts it, until a child finishes (the delay is uniform in a
60 ms window; after a kill that left no progress the window widens by half, so
a step slower than the window, such as a policy's refine, still completes).
Most children are forked from the test process (a fork costs milliseconds, so
hundreds of kills fit in the time budget); a few are fresh interpreters (`python crash_child.py`), to show
nothing depends on memory inherited from the parent. A separate test kills a
process that does nothing but write large state files in a tight loop.

After every kill: the state file (if any) must decode; it must hold every
duration the previous surviving checkpoint held (as a prefix of each config's
timings). After every restart: no timing the surviving checkpoint recorded is
taken again (the log proves it). At the end: the tune is DONE with exactly the
durations, rounds and winner of an uninterrupted run with the same seed.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import crash_child
import pytest
from crash_child import KEY
from engine_harness import read_log

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.errors import StateFileError
from fasta_sm.store import StateStore
from fasta_sm.tuner import tune

FORK = multiprocessing.get_context("fork")
HERE = Path(__file__).resolve().parent

KILLS_PER_POLICY = 100
MAX_SEEDS = 40
CHUNK = 4
BACKEND_DELAY_S = 0.003
SLOW_WRITES_S = 0.004
MAX_KILL_DELAY_S = 0.06

POLICY_PARAMS = {"exhaustive": {}, "random": {"budget": 0.5}, "fasta": {}}
POLICIES = ["exhaustive", "random", "fasta"]


@dataclass
class Run:
    """What one killed-and-restarted tune went through."""

    kills: int = 0
    mid_write: int = 0
    reads: int = 0
    attempts: int = 0
    problems: list[str] = field(default_factory=list)


def reference(table_path: Path, tmp: Path, policy: str, seed: int):
    """The same tune, uninterrupted, in-process, in its own state dir."""
    table = load_table(table_path)
    return tune(KEY, table.kernel, table.configs, ReplayBackend(table, noise=True, seed=seed), policy=policy,
                policy_params=POLICY_PARAMS[policy], seed=seed, store=StateStore(tmp / f"ref-{policy}-{seed}"),
                chunk_size=CHUNK).state


def read_state(store: StateStore, run: Run, where: str):
    """The state file as any reader sees it right now: absent, or a valid state."""
    path = store.file_for(KEY)
    try:
        state = store.read(path)
    except FileNotFoundError:
        return None
    except StateFileError as exc:
        run.problems.append(f"{where}: unreadable state file: {exc}")
        return None
    run.reads += 1
    return state


def check_kept(before, after, run: Run, where: str) -> None:
    """Every timing `before` holds is still in `after`, as a prefix of that config's timings."""
    if before is None:
        return
    if after is None:
        run.problems.append(f"{where}: state file vanished")
        return
    for index, samples in before.durations.items():
        now = after.durations.get(index, [])
        if now[: len(samples)] != samples:
            run.problems.append(f"{where}: config #{index} had {samples}, now {now}")
    if set(before.failed) - set(after.failed):
        run.problems.append(f"{where}: failures lost: {sorted(set(before.failed) - set(after.failed))}")


def check_not_measured_again(survivor, log_entries: list[dict], run: Run, where: str) -> None:
    """No (config, repeat) the surviving checkpoint recorded appears in the log after it."""
    if survivor is None:
        return
    for entry in log_entries:
        held = survivor.durations.get(entry["index"], [])
        if entry["k"] < len(held):
            run.problems.append(f"{where}: config #{entry['index']} timing #{entry['k']} measured again")


def progress(state) -> tuple:
    if state is None:
        return ()
    return (state.position(), len(state.rounds), len(state.compiled), len(state.failed), state.evaluations())


def start_forked(args: dict):
    process = FORK.Process(target=crash_child.tune_child, kwargs=args, daemon=True)
    process.start()
    return process


def kill_and_restart(table_path: Path, tmp: Path, policy: str, seed: int, rng: random.Random,
                     fresh_interpreter: bool = False, max_delay_s: float = MAX_KILL_DELAY_S) -> tuple[Run, object]:
    state_dir, log_path = tmp / f"states-{policy}-{seed}", tmp / f"bench-{policy}-{seed}.log"
    store = StateStore(state_dir)
    args = dict(table_path=str(table_path), state_dir=str(state_dir), log_path=str(log_path), policy=policy,
                seed=seed, params=POLICY_PARAMS[policy], chunk_size=CHUNK, delay_s=BACKEND_DELAY_S,
                slow_writes_s=SLOW_WRITES_S)
    run = Run()
    survivor = None  # the last completed checkpoint, as the last kill left it
    window = max_delay_s
    while True:
        run.attempts += 1
        where = f"{policy} seed {seed} attempt {run.attempts}"
        logged_before = len(read_log(log_path))
        if fresh_interpreter:
            child = subprocess.Popen([sys.executable, str(HERE / "crash_child.py"), json.dumps(args)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert child.stdout.readline().strip() == "ready"
            child.stdin.write("go\n")
            child.stdin.flush()
            alive = lambda child=child: child.poll() is None  # noqa: E731
            pid = child.pid
        else:
            child = start_forked(args)
            alive = child.is_alive
            pid = child.pid
        deadline = time.monotonic() + rng.uniform(0, window)
        seen = survivor
        while alive() and time.monotonic() < deadline:
            now = read_state(store, run, where + " (concurrent read)")
            check_kept(seen, now, run, where + " (concurrent read)")
            seen = now or seen
        if alive():
            os.kill(pid, signal.SIGKILL)
            run.kills += 1
        if fresh_interpreter:
            child.wait(timeout=60)
            code = child.returncode
        else:
            child.join(timeout=60)
            code = child.exitcode
        if code == 0:
            break
        if code != -signal.SIGKILL:
            pytest.fail(f"{where}: child exited with {code}")
        run.mid_write += any(state_dir.glob("*.tmp"))
        after = read_state(store, run, where)
        check_kept(survivor, after, run, where)
        check_not_measured_again(survivor, read_log(log_path)[logged_before:], run, where)
        # a step longer than the kill window (a slow policy refine) would never finish: widen it
        window = max_delay_s if progress(survivor) != progress(after) else window * 1.5
        survivor = after or survivor
        if run.problems:
            return run, None
        if run.kills > 400:
            pytest.fail(f"{where}: no progress after {run.kills} kills")
    final = store.read(store.file_for(KEY))
    check_kept(survivor, final, run, f"{policy} seed {seed} final")
    check_not_measured_again(survivor, read_log(log_path)[logged_before:], run, f"{policy} seed {seed} final")
    quarantined = sorted(p.name for p in state_dir.glob("*.corrupt-*"))
    if quarantined:
        run.problems.append(f"{policy} seed {seed}: state files had to be quarantined: {quarantined}")
    return run, final


def assert_same_as_uninterrupted(final, ref, where: str) -> None:
    assert final.done, where
    assert final.best == ref.best and final.best_us == ref.best_us, where
    assert final.durations == ref.durations, where
    assert final.failed == ref.failed, where
    assert [r.batch for r in final.rounds] == [r.batch for r in ref.rounds], where
    assert final.stop_reason == ref.stop_reason, where
    assert final.policy_state == ref.policy_state, where


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_tunes_killed_at_random_points_finish_as_if_never_interrupted(policy, table_path, tmp_path):
    totals = Run()
    seed = 0
    while totals.kills < KILLS_PER_POLICY:
        assert seed < MAX_SEEDS, f"only {totals.kills} kills in {MAX_SEEDS} seeds"
        ref = reference(table_path, tmp_path, policy, seed)
        run, final = kill_and_restart(table_path, tmp_path, policy, seed, random.Random(seed))
        assert not run.problems, run.problems[:10]
        assert_same_as_uninterrupted(final, ref, f"{policy} seed {seed}")
        totals.kills += run.kills
        totals.mid_write += run.mid_write
        totals.reads += run.reads
        seed += 1
    print(f"\n{policy}: {totals.kills} kills over {seed} seeds, {totals.mid_write} mid-write, "
          f"{totals.reads} state reads, all valid")
    # the harness really does land kills inside the write path
    assert totals.mid_write >= totals.kills // 20


@pytest.mark.slow
def test_tunes_killed_in_fresh_interpreters_finish_as_if_never_interrupted(table_path, tmp_path):
    """Not forked: each attempt is `python crash_child.py`, killed after its imports."""
    kills, seed = 0, 100
    while kills < 10:
        assert seed < 110, f"only {kills} kills in 10 seeds"
        ref = reference(table_path, tmp_path, "exhaustive", seed)
        run, final = kill_and_restart(table_path, tmp_path, "exhaustive", seed, random.Random(seed),
                                      fresh_interpreter=True, max_delay_s=0.15)
        assert not run.problems, run.problems[:10]
        assert_same_as_uninterrupted(final, ref, f"fresh seed {seed}")
        kills += run.kills
        seed += 1
    print(f"\nfresh interpreters: {kills} kills over {seed - 100} seeds")


@pytest.mark.slow
def test_a_process_killed_while_writing_state_files_never_leaves_an_unreadable_one(tmp_path):
    """Large states (2,000 configs) written back to back: many kills land mid-write.

    The writer's fsync and rename sleep up to 4 ms at random (as in the tune
    children), which keeps a temp file on disk for much of the loop. Each
    kill comes at a random time after the writer's first write of that run.
    """
    state_dir, progress = tmp_path / "loop", tmp_path / "progress"
    store = StateStore(state_dir)
    rng = random.Random(5)
    kills = mid_write = 0
    newest = 0
    for _ in range(60):
        ready = FORK.Event()
        process = FORK.Process(target=crash_child.write_loop_child,
                               args=(str(state_dir), 2000, str(progress), ready, 0.004), daemon=True)
        process.start()
        assert ready.wait(timeout=30)
        started = int(progress.read_bytes() or b"0")
        deadline = time.monotonic() + 30
        while int(progress.read_bytes() or b"0") == started and time.monotonic() < deadline:
            time.sleep(0.001)  # on a loaded machine the writer may not run for a while: kill it mid-loop
        assert int(progress.read_bytes() or b"0") > started, "the writer completed no write in 30 s"
        time.sleep(rng.uniform(0.0, 0.03))
        os.kill(process.pid, signal.SIGKILL)
        process.join(timeout=30)
        assert process.exitcode == -signal.SIGKILL
        kills += 1
        mid_write += any(state_dir.glob("*.tmp"))
        if not store.file_for(KEY).exists():
            continue
        state = store.read(store.file_for(KEY))  # raises if torn
        completed = int(progress.read_bytes() or b"0")
        # the file holds the last completed write, or the one after it (renamed, progress not yet noted)
        assert state.seed in (completed, completed + 1), (state.seed, completed)
        assert state.seed >= newest  # never goes back
        newest = state.seed
        store.discard_temp_files(KEY)
    print(f"\nwrite loop: {kills} kills, {mid_write} mid-write, newest write {newest}")
    assert kills == 60 and mid_write >= 12, (kills, mid_write)
