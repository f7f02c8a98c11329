"""A process that tunes `kernels.accumulate_kernel` once: the other half of the kill-and-resume test.

argv: STATE_DIR LOG_FILE KILL_AFTER. Each config it times is appended to
LOG_FILE (one label a line) before it is timed; with KILL_AFTER > 0 the process
kills itself (os._exit, no cleanup) when about to time config number
KILL_AFTER + 1. A process that finishes checks the kernel's output and prints OK.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).parent))
    import kernels

    from fasta_sm.triton.backend import TritonBackend

    state_dir, log_file, kill_after = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    timed = 0
    real_time_ms = TritonBackend.time_ms

    def logged_time_ms(self, config):
        global timed
        if kill_after and timed >= kill_after:
            os._exit(9)
        timed += 1
        with log_file.open("a") as handle:
            handle.write(config.identity + "\n")
        return real_time_ms(self, config)

    TritonBackend.time_ms = logged_time_ms
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(2048, device=device)
    out = torch.zeros(2048, device=device)
    kernel = kernels.make_tuned(state_dir)
    kernel[kernels.grid](x, out, 2048, 2.0)
    torch.testing.assert_close(out, 2.0 * x)
    print("OK", next(iter(kernel.results.values())).reused)
