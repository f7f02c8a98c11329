"""Starts the shared compile pool, leaves a long guess running in it, and exits normally (the exit test).

A worker compiles a job by importing its module and calling `warmup` on the
named object: here `slow`, which only sleeps, standing in for a matmul guess.
"""

from __future__ import annotations

import time


class _Sleeper:
    def warmup(self, *args, seconds: float = 0.0, **kwargs) -> None:
        time.sleep(seconds)


slow = _Sleeper()

if __name__ == "__main__":
    from fasta_sm.triton.compile_pool import CompileJob, shared_pool

    pool = shared_pool()
    pool.start()
    guess = pool.try_submit(CompileJob("exit_child", "slow", (), {"seconds": 60.0}))
    assert guess is not None
    time.sleep(0.5)  # the guess is running
    print(time.time(), flush=True)
