"""FastaNPUAutotuner: torch_npu's NPUCachingAutotuner driven by the shared durable machine.

The NPU seams, all of them: timings through torch_npu's `bench` (NPU events
via its benchmarker), the winner recorded the way torch_npu's
`autotune_to_one_config` records it (`best_launcher`, `best_runtime_blocks`,
`best_candidate_config`, the autotune cache hook), `configs` kept set
(torch_npu builds its candidate plan from it), and its `autotuner()` entry
point. Kernels fasta-sm does not tune (runtime block arguments: one compile,
several launch candidates, not 1:1 with configs; or fasta-sm switched off in
this process) get torch_npu's own NPUFastAutotuner, built in our place; a
reduction under deterministic algorithms gets its NPUCachingAutotuner over
the expert configs, which launches the first that compiles, timing none.
"""

from __future__ import annotations

import copyreg
import functools
import inspect
import logging
import time
from typing import Any

from torch_npu._inductor import config as npu_config
from torch_npu._inductor.runtime import fasta_autotune
from torch_npu._inductor.runtime.triton_heuristics import NPUCachingAutotuner

from ..driver import FastaAutotunerMixin
from . import NPUUnavailable, codegen, current_settings, take_pending_install, turned_off

log = logging.getLogger("fasta_sm.npu.autotuner")

_ORIGINAL: dict[str, Any] = {"cls": getattr(fasta_autotune, "NPUFastAutotuner", None)}


class FastaNPUAutotuner(FastaAutotunerMixin, NPUCachingAutotuner):
    """Built by torch_npu's `cached_autotune` in place of its NPUFastAutotuner."""

    _fasta_keep_configs = True
    _fasta_core_names = ("cores", "cores")
    _fasta_base_name = "torch_npu"
    _fasta_settings: dict[str, Any] | None = None
    """The settings this kernel tunes with, read once by `__new__`."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        settings = None
        if args or kwargs:  # built by cached_autotune (unpickling passes nothing, and calls no __init__)
            meta = kwargs.get("inductor_meta") or {}
            settings = current_settings()
            if _kept_deterministic(meta, kwargs):
                log.debug("fasta_sm: kernel %s left to torch_npu, untimed: deterministic", meta.get("kernel_name", "?"))
                return NPUCachingAutotuner(*args, **{**kwargs, "configs": _expert_configs(kwargs.get("configs"))})
            if settings is None or meta.get("runtime_block_arg_names"):
                log.debug("fasta_sm: kernel %s left to torch_npu's FastA", meta.get("kernel_name", "?"))
                return _ORIGINAL["cls"](*args, **kwargs)
        tuner = super().__new__(cls)
        tuner._fasta_settings = settings
        return tuner

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled in the parent. A kernel that a compile worker built as torch_npu's own NPUFastAutotuner
        (fasta-sm never installed there) names that class by its slot, which here holds this one: it stays
        torch_npu's, rather than becoming this class with none of its tune and none of torch_npu's search."""
        if "_fasta_plan" not in state and _ORIGINAL["cls"] is not None:
            _warn_built_without_fasta_sm()
            self.__class__ = _ORIGINAL["cls"]
        restore = getattr(NPUCachingAutotuner, "__setstate__", None)  # torch's CachingAutotuner's: lock, plugins
        if restore is None:
            self.__dict__.update(state)
        else:
            restore(self, state)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        must = [i for i, c in enumerate(self.configs) if getattr(c, "from_expert", False)]
        self._fasta_setup(self._fasta_settings, must, "npu")
        if self._fasta_plan is None and must:  # not tuned after all: the expert configs, as torch_npu's own does
            self.configs = [self._fasta_space[i] for i in must]

    def _fasta_turned_off(self) -> bool:
        return turned_off()

    def _fasta_generated(self, source: str) -> str:
        """Without the hook's import: a kernel keeps its tune whether or not its source was written with it."""
        return codegen.without_hook(source)

    def _fasta_cores(self) -> int:
        """The vector cores torch_npu generates tiles and launches for: the device's, or fewer under
        `NPU_DEVICE_LIMIT`, which gives another config list and other timings, so another tune."""
        return int(getattr(npu_config, "num_vector_core", None) or self.device_props.multi_processor_count)

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


@functools.cache
def _warn_built_without_fasta_sm() -> None:
    """Once per process: every kernel of such a worker pool is built alike."""
    log.warning(
        "fasta_sm.npu: kernels were built in compile workers where fasta-sm was not installed (the pool started "
        "before enable(), or the kernel's source was generated before it, without fasta-sm's hook); torch_npu "
        "tunes them with its own FastA"
    )


def _kept_deterministic(meta: dict, kwargs: dict) -> bool:
    """A reduction under deterministic algorithms: torch_npu's NPUCachingAutotuner times none of its configs (it
    launches the first that compiles), so that the numerics do not depend on a timing; tuning it would undo that,
    and so would torch_npu's NPUFastAutotuner, which times them. torch_npu reads only this flag (Inductor's
    `force_filter_reduction_configs` has no NPU counterpart)."""
    from torch._inductor.runtime.hints import HeuristicType

    reductions = (HeuristicType.REDUCTION, HeuristicType.PERSISTENT_REDUCTION)
    return bool(meta.get("are_deterministic_algorithms_enabled")) and kwargs.get("heuristic_type") in reductions


def _expert_configs(configs: Any) -> list:
    """The configs torch_npu's own heuristics proposed (`from_expert`), first as they came, or all if none is: the
    list torch_npu's NPUCachingAutotuner would have, FastA's generated tiles left out."""
    configs = list(configs or ())
    return [c for c in configs if getattr(c, "from_expert", False)] or configs


def _pickled_as_torch_npus(kernel: Any) -> tuple:
    """How a kernel built as torch_npu's own NPUFastAutotuner pickles while this class holds its slot (a compile
    worker pickles every kernel back to its parent): by its class's name, which now finds this class, pickle refuses
    it; by `_torch_npus` it stays torch_npu's, its state as pickle would take it."""
    _, _, *state = kernel.__reduce_ex__(2)
    return (_torch_npus, (), *state)


def _torch_npus() -> Any:
    """An empty NPUFastAutotuner of torch_npu's, for pickle to fill."""
    return _ORIGINAL["cls"].__new__(_ORIGINAL["cls"])


def install(switch_before: bool) -> None:
    """Put FastaNPUAutotuner where torch_npu's cached_autotune picks its FastA autotuner, switch that on, and have
    the kernels generated from now on import the hook (`codegen`), so that compile workers build it too.

    `switch_before` is torch_npu's switch before fasta-sm touched it (the
    environment's FASTAUTOTUNE), which `uninstall` puts back. A torch_npu
    without one of the seams this class drives is refused, naming it: a
    missing one would otherwise fail every config, and be recorded so.
    """
    missing = missing_seams()
    if missing:
        raise NPUUnavailable(
            f"this torch_npu ({getattr(npu_config, '__file__', '?')}) lacks what fasta-sm drives: "
            f"{', '.join(missing)}; torch_npu tunes its own kernels"
        )
    if fasta_autotune.NPUFastAutotuner is not FastaNPUAutotuner:
        _ORIGINAL["switch"] = switch_before
    fasta_autotune.NPUFastAutotuner = FastaNPUAutotuner
    copyreg.pickle(_ORIGINAL["cls"], _pickled_as_torch_npus)
    npu_config.fasta_autotune = True
    codegen.patch()


def missing_seams() -> list[str]:
    """The parts of torch_npu's FastA path this class relies on that this torch_npu does not have."""
    missing = [name for owner, name in (
        (fasta_autotune, "NPUFastAutotuner"),
        (npu_config, "fasta_autotune"),
        (NPUCachingAutotuner, "autotuner"),
        (NPUCachingAutotuner, "autotune_to_one_config"),
    ) if not hasattr(owner, name)]
    bench = getattr(NPUCachingAutotuner, "bench", None)
    try:
        takes_blocks = bench is not None and "runtime_blocks" in inspect.signature(bench).parameters
    except (TypeError, ValueError):
        takes_blocks = False
    if not takes_blocks:
        missing.append("NPUCachingAutotuner.bench(..., runtime_blocks=)")
    return missing


def uninstall() -> None:
    codegen.unpatch()
    if fasta_autotune.NPUFastAutotuner is FastaNPUAutotuner:
        fasta_autotune.NPUFastAutotuner = _ORIGINAL["cls"]
        copyreg.dispatch_table.pop(_ORIGINAL["cls"], None)
        npu_config.fasta_autotune = _ORIGINAL.pop("switch", False)


_deferred = take_pending_install()
if _deferred is not None:  # FASTA_SM_NPU=1 and this module was the first to import torch_npu's slot
    install(_deferred)
