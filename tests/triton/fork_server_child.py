"""Starts the workers' fork server, forks a child that lives on, and exits at once: prints the server's pid and the
child's, for a test that the server ends with this process and not with the child."""

from __future__ import annotations

import os
import time

from fasta_sm.triton.fork_server import fork_server_pid, start_fork_server

if __name__ == "__main__":
    assert start_fork_server(), "the fork server did not start"
    deadline = time.monotonic() + 60
    while fork_server_pid() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    child = os.fork()
    if child == 0:  # a data loader's worker, say: forked by the program, outliving it
        time.sleep(30)
        os._exit(0)
    print(fork_server_pid(), child, flush=True)
    os._exit(0)
