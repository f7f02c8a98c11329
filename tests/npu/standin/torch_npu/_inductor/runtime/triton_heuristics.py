"""NPUCachingAutotuner's flow, timed from a replay table named by $STANDIN_TABLE."""

import os
from types import SimpleNamespace

from fasta_sm.backends.replay import load_table
from fasta_sm.driver import to_fasta_config

from .. import config as npu_config

CALLS = {"compile": 0, "bench": 0}
SAVED: list = []
"""Configs torch_npu's autotune cache was asked to save."""


SPLIT_KWARGS = ("split_axis", "split_blocks")
"""Set as tuples on every config by torch_npu's `_triton_config_npu_index_legacy`; the table names tile sizes only."""


def row(table, cfg):
    """`cfg`'s row of the replay table, whatever split kwargs it carries."""
    kwargs = {name: value for name, value in cfg.kwargs.items() if name not in SPLIT_KWARGS}
    return table.index_of(to_fasta_config(SimpleNamespace(kwargs=kwargs, num_warps=cfg.num_warps,
                                                          num_stages=cfg.num_stages)))


def save_to_cache(config, time_taken_ns):
    SAVED.append(config)


class Launcher:
    def __init__(self, config):
        self.config = config

    def __call__(self, *args, **kwargs):
        return ("launched", dict(self.config.kwargs))


class CompileResult:
    def __init__(self, config):
        self.config = config

    def make_launcher(self):
        return Launcher(self.config)


class NPUCachingAutotuner:
    def __init__(self, fn, triton_meta, configs, save_cache_hook, mutated_arg_names, optimize_mem, heuristic_type,
                 size_hints=None, inductor_meta=None, custom_kernel=False, filename=None,
                 reset_to_zero_arg_names=None):
        self.fn = fn
        self.triton_meta = triton_meta
        self.configs = configs
        self.save_cache_hook = save_cache_hook
        self.inductor_meta = inductor_meta or {}
        self.filename = filename
        self.runtime_block_arg_names = tuple(self.inductor_meta.get("runtime_block_arg_names", ()))
        self.launchers = []
        self.compile_results = None
        self.best_launcher = None
        self.best_runtime_blocks = ()
        self.best_candidate_config = None
        self.precompile_time_taken_ns = 0
        self.triton_interpret = False
        self.kernel_hash = "standin"
        self.device_props = SimpleNamespace(type="npu", cc="Ascend910B3", multi_processor_count=48)
        self.table = load_table(os.environ["STANDIN_TABLE"])

    def _precompile_config(self, cfg):
        CALLS["compile"] += 1
        error = self.table.errors[row(self.table, cfg)]
        if error:
            raise RuntimeError(error)
        return CompileResult(cfg)

    def precompile(self, warm_cache_only=False, reload_kernel=None, static_triton_bundle_key=None):
        if not self.compile_results:
            self.compile_results = []
            for cfg in self.configs:
                try:
                    self.compile_results.append(self._precompile_config(cfg))
                except RuntimeError:
                    pass
        if not warm_cache_only and len(self.launchers) != len(self.compile_results):
            self.launchers = [result.make_launcher() for result in self.compile_results]

    def _dynamic_scale_rblock(self):
        pass

    def bench(self, launcher, *args, with_profiler=False, runtime_blocks=None, **kwargs):
        CALLS["bench"] += 1
        return self.table.mean_us[row(self.table, launcher.config)] / 1000.0

    def benchmark_all_configs(self, *args, **kwargs):
        return {launcher: self.bench(launcher, *args, **kwargs) for launcher in self.launchers}

    def autotune_to_one_config(self, *args, **kwargs):
        timings = self.benchmark_all_configs(*args, **kwargs)
        self.best_launcher = min(timings, key=timings.get)
        self.launchers = [self.best_launcher]

    def autotuner(self, *args, stream, benchmark_run=False, **kwargs):
        if self.best_launcher is not None:
            return
        if not self.launchers:
            self.precompile()
        self.autotune_to_one_config(*args, **kwargs)

    def run(self, *args, stream, benchmark_run=False, **kwargs):
        self.autotuner(*args, stream=stream, benchmark_run=benchmark_run, **kwargs)
        return (self.best_launcher or self.launchers[0])(*args, stream=stream)


def cached_autotune(size_hints, configs, triton_meta, heuristic_type, filename=None, inductor_meta=None,
                    custom_kernel=False):
    """Its FastA branch, the slot imported at call time under the switch; with the switch off, its last branch
    (NPUCachingAutotuner, without the cost-model prefilter)."""

    def decorator(fn):
        if npu_config.fasta_autotune:
            from .fasta_autotune import NPUFastAutotuner as autotuner_cls
        else:
            autotuner_cls = NPUCachingAutotuner
        return autotuner_cls(
            fn,
            triton_meta=triton_meta,
            inductor_meta=inductor_meta,
            configs=configs,
            save_cache_hook=save_to_cache,
            mutated_arg_names=(),
            reset_to_zero_arg_names=None,
            optimize_mem=True,
            heuristic_type=heuristic_type,
            size_hints=size_hints,
            custom_kernel=custom_kernel,
            filename=filename,
        )

    return decorator
