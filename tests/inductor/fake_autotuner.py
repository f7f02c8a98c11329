"""A stand-in for Inductor's CachingAutotuner with the same seams and call order, timed from a replay table.

It follows torch 2.11/2.13's flow: a worker calls `precompile(warm_cache_only=True)`
and pickles the autotuner; the parent calls `precompile(...)` (launchers), then
`run()` → `autotune_to_one_config()` → `benchmark_all_configs()` → `bench()`.
"""

from __future__ import annotations

import builtins
import threading
from dataclasses import dataclass
from types import SimpleNamespace

from fasta_sm.backends.replay import load_table
from fasta_sm.driver import DriverSettings, FastaAutotunerMixin, to_fasta_config


@dataclass
class FakeConfig:
    kwargs: dict
    num_warps: int
    num_stages: int


class FakeResult:
    def __init__(self, config):
        self.config = config

    def make_launcher(self):
        return FakeLauncher(self.config)


class FakeLauncher:
    def __init__(self, config):
        self.config = config

    def __call__(self, *args, **kwargs):
        return "launched", self.config.kwargs


CALLS = {"compile": 0, "bench": 0, "rescale": 0}


class FakeCachingAutotuner:
    def __init__(self, table_path, configs):
        self.table_path = table_path
        self.table = load_table(table_path)
        self.fn = type("Fn", (), {"fn": object(), "__name__": "toy"})()
        self.configs = configs
        self.compile_results = []
        self.launchers = []
        self.lock = threading.Lock()
        self.saved = None
        self.inductor_meta = {"kernel_name": "toy"}
        self.device_props = SimpleNamespace(type="fake", cc=0, multi_processor_count=1)

    def __getstate__(self):
        assert not self.launchers
        return {**self.__dict__, "lock": None, "fn": None, "table": None}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.lock = threading.Lock()
        self.table = load_table(self.table_path)
        self.fn = type("Fn", (), {"fn": None, "__name__": "toy"})()
        self._reload_kernel = lambda: type("K", (), {"fn": type("Fn", (), {"fn": object(), "__name__": "toy"})()})()

    def _precompile_config(self, cfg):
        assert self.fn.fn is not None, "compiling needs the live kernel function"
        CALLS["compile"] += 1
        error = self.table.errors[self.table.index_of(to_fasta_config(cfg))]
        if error:
            raise RuntimeError(error)
        return FakeResult(cfg)

    def precompile(self, warm_cache_only=False, reload_kernel=None, **kwargs):
        if reload_kernel is not None:
            self._reload_kernel = reload_kernel
        if not self.compile_results:
            self.compile_results = [self._precompile_config(c) for c in self.configs]
            self.configs = None
        if warm_cache_only:
            return
        if len(self.launchers) != len(self.compile_results):
            self.launchers = [r.make_launcher() for r in self.compile_results]
        self._dynamic_scale_rblock()

    def _dynamic_scale_rblock(self):
        CALLS["rescale"] += 1

    def bench(self, launcher, *args, **kwargs):
        CALLS["bench"] += 1
        return self.table.mean_us[self.table.index_of(to_fasta_config(launcher.config))] / 1000.0

    def benchmark_all_configs(self, *args, **kwargs):
        return {launcher: self.bench(launcher, *args, **kwargs) for launcher in self.launchers}

    def autotune_to_one_config(self, *args, **kwargs):
        timings = self.benchmark_all_configs(*args, **kwargs)
        self.launchers = [builtins.min(timings, key=timings.get)]
        self.saved = self.launchers[0].config

    def run(self, *args, stream, benchmark_run=False, **kwargs):
        if len(self.launchers) != 1:
            if not self.launchers:
                self.precompile()
            if len(self.launchers) > 1:
                self.autotune_to_one_config(*args, **kwargs)
        return self.launchers[0](*args, **kwargs)


class FastaFake(FastaAutotunerMixin, FakeCachingAutotuner):
    """The mixin over the stand-in, built the way FastaCachingAutotuner builds itself."""

    def __init__(self, table_path, state_dir, must=(0, 5), policy="fasta", prior=True):
        table = load_table(table_path)
        configs = [FakeConfig(dict(c.kwargs), c.num_warps, c.num_stages) for c in table.configs]
        super().__init__(table_path, configs)
        settings = DriverSettings(policy=policy, state_dir=str(state_dir), prior=prior)
        self._fasta_setup(settings.to_dict(), must, "fake")

    def _fasta_key(self, prefix, name):
        return f"{prefix}/{name}"
