"""The process the crash and concurrency tests start (and kill).

Run as a script (`python crash_child.py tune ...`) for a fresh interpreter, or
call `tune_child` / `write_loop_child` in a forked process. Either way it is an
ordinary user of the public API: `tune()` with a replay backend wrapped by
engine_harness.LoggingBackend, which fsyncs every timing it hands out to an
append-only log before the engine sees it. Nothing in fasta_sm is patched
except, with `slow_writes`, this process's own `os.fsync` / `os.replace`
(random sleeps that widen the write path so kills land mid-write).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_harness import LoggingBackend, slow_down_state_writes  # noqa: E402

KEY = "mm_synth:crash"


def tune_child(table_path: str, state_dir: str, log_path: str, policy: str, seed: int,
               params: dict | None = None, chunk_size: int = 4, delay_s: float = 0.0,
               slow_writes_s: float = 0.0, result_path: str | None = None, tag: str = "",
               key: str = KEY) -> None:
    from fasta_sm.backends.replay import ReplayBackend, load_table
    from fasta_sm.store import StateStore
    from fasta_sm.tuner import tune

    if slow_writes_s:
        slow_down_state_writes(slow_writes_s)
    table = load_table(table_path)
    backend = LoggingBackend(ReplayBackend(table, noise=True, seed=seed), log_path, tag=tag, delay_s=delay_s)
    result = tune(key, table.kernel, table.configs, backend, policy=policy, policy_params=params or {},
                  seed=seed, store=StateStore(state_dir, lock_timeout_s=120), chunk_size=chunk_size)
    if result_path:
        Path(result_path).write_text(json.dumps({
            "pid": os.getpid(), "best": result.best_index, "best_us": result.best_us, "reused": result.reused,
        }))


def write_loop_child(state_dir: str, n_configs: int, progress_path: str, ready=None,
                     slow_writes_s: float = 0.0) -> None:
    """Write ever-newer states of one key as fast as possible, forever.

    `seed` counts up from the seed of the file found at start; after each
    completed write the count goes to `progress_path` so the killer knows the
    newest state that must survive.
    """
    import numpy as np

    from fasta_sm.config import Config
    from fasta_sm.state import RoundRecord, TuneState, encode_rng, pack_state
    from fasta_sm.store import StateStore

    if slow_writes_s:
        slow_down_state_writes(slow_writes_s)
    store = StateStore(state_dir)
    configs = [Config({"BLOCK": i}, num_warps=4) for i in range(n_configs)]
    state = TuneState(key=KEY, kernel="loop", configs=configs, policy="exhaustive",
                      durations={i: [100.0 + i] for i in range(n_configs)},
                      compiled={i: 0.5 for i in range(n_configs)}, best=0, best_us=100.0,
                      phase="R1", step="refine", pending=list(range(n_configs)), round_done=list(range(n_configs)),
                      rounds=[RoundRecord(phase="R1", round=0, batch=list(range(n_configs)), reason="all")],
                      rng_state=encode_rng(np.random.default_rng(0)))
    try:  # carry on from the newest state that survived the last kill
        state.seed = store.read(store.file_for(KEY)).seed
    except FileNotFoundError:
        pass
    fd = os.open(progress_path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.pwrite(fd, f"{state.seed:012d}".encode(), 0)
    if ready is not None:
        ready.set()  # set-up done: from here on the process only writes
    while True:
        state.seed += 1
        store.write(KEY, pack_state(state), kernel="loop")
        os.pwrite(fd, f"{state.seed:012d}".encode(), 0)


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    import fasta_sm.backends.replay  # noqa: F401  (imports done before the kill clock starts)
    import fasta_sm.tuner  # noqa: F401
    from fasta_sm.policies import policy_names

    policy_names()  # loads every policy module

    print("ready", flush=True)
    sys.stdin.readline()  # wait for "go": imports are done, the kill clock starts now
    tune_child(**args)
