"""Runs one half of a tune in a fresh process, as a compile worker (or a killed parent) would.

usage: python handoff_child.py TABLE STATE_DIR worker|parent [KILL_AFTER_BENCHMARKS]
Prints the state's position and the configs the parent should launch first, as JSON.
"""

import json
import os
import sys

from fasta_sm.backends.replay import ReplayBackend, load_table
from fasta_sm.driver import (
    DriverSettings,
    TunePlan,
    parent_phase,
    wanted_after_worker,
    worker_phase,
)


def make_plan(table, state_dir: str) -> TunePlan:
    return TunePlan(key="handoff/toy", kernel="toy", configs=list(table.configs), must=[0, 5],
                    settings=DriverSettings(state_dir=state_dir, chunk_size=4))


class KillingBackend(ReplayBackend):
    """Dies like a killed process (no cleanup) after `left` benchmark calls."""

    def __init__(self, table, left: int):
        super().__init__(table)
        self.left = left

    def benchmark(self, configs, repeat=None):
        if self.left <= 0:
            os._exit(9)
        self.left -= 1
        return super().benchmark(configs, repeat)


if __name__ == "__main__":
    table_path, state_dir, half = sys.argv[1:4]
    table = load_table(table_path)
    plan = make_plan(table, state_dir)
    if half == "worker":
        state = worker_phase(plan, ReplayBackend(table))
    else:
        state = parent_phase(plan, KillingBackend(table, int(sys.argv[4])))
    print(json.dumps({"position": state.position(), "wanted": wanted_after_worker(state),
                      "compiled": sorted(state.compiled), "pending": state.pending}))
