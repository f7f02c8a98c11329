"""FastaNPUAutotuner: torch_npu's NPUCachingAutotuner driven by the shared durable machine.

The NPU seams, all of them: timings through torch_npu's `bench` (NPU events
via its benchmarker), the winner recorded the way torch_npu's
`autotune_to_one_config` records it (`best_launcher`, `best_runtime_blocks`,
`best_candidate_config`, the autotune cache hook), `configs` kept set
(torch_npu builds its candidate plan from it), and its `autotuner()` entry
point. Kernels with runtime block arguments (one compile, several launch
candidates) are left to torch_npu: their candidates do not map 1:1 to configs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from torch_npu._inductor import config as npu_config
from torch_npu._inductor.runtime import fasta_autotune
from torch_npu._inductor.runtime.triton_heuristics import NPUCachingAutotuner

from ..driver import FastaAutotunerMixin
from . import current_settings

log = logging.getLogger("fasta_sm.npu.autotuner")

_ORIGINAL = {"cls": fasta_autotune.NPUFastAutotuner, "switch": npu_config.fasta_autotune}


class FastaNPUAutotuner(FastaAutotunerMixin, NPUCachingAutotuner):
    """Built by torch_npu's `cached_autotune` in place of its NPUFastAutotuner."""

    _fasta_keep_configs = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = current_settings()
        if settings is not None and self.runtime_block_arg_names:
            log.info("fasta_sm: kernel %s has runtime block args; left to torch_npu", self.fn.__name__)
            settings = None
        must = [i for i, c in enumerate(self.configs) if getattr(c, "from_expert", False)]
        self._fasta_setup(settings, must, "npu")

    def _fasta_bench(self, launcher: Any, *args: Any, **kwargs: Any) -> float:
        return self.bench(launcher, *args, runtime_blocks=(), **kwargs)

    def autotuner(self, *args: Any, stream: Any, benchmark_run: bool = False, **kwargs: Any) -> None:
        if self._fasta_plan is None or self._fasta_finished or self.triton_interpret:
            return super().autotuner(*args, stream=stream, benchmark_run=benchmark_run, **kwargs)
        if not self.launchers:
            self.precompile()
        self.autotune_to_one_config(*args, **kwargs)
        return None

    def autotune_to_one_config(self, *args: Any, **kwargs: Any) -> None:
        if self._fasta_plan is None or self._fasta_finished:
            return super().autotune_to_one_config(*args, **kwargs)
        started = time.time_ns()
        timings = self.benchmark_all_configs(*args, **kwargs)
        winner = min(timings, key=timings.get)
        self.best_launcher, self.best_runtime_blocks, self.best_candidate_config = winner, (), winner.config
        self.launchers = [winner]
        self.autotune_time_taken_ns = self.precompile_time_taken_ns + time.time_ns() - started
        if self.save_cache_hook:
            self.save_cache_hook(winner.config, self.autotune_time_taken_ns)
        return None


def install() -> None:
    """Put FastaNPUAutotuner where torch_npu's cached_autotune picks its FastA autotuner, and switch that on."""
    fasta_autotune.NPUFastAutotuner = FastaNPUAutotuner
    npu_config.fasta_autotune = True


def uninstall() -> None:
    fasta_autotune.NPUFastAutotuner = _ORIGINAL["cls"]
    npu_config.fasta_autotune = _ORIGINAL["switch"]
