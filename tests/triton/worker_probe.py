"""Objects a compile worker can import and "compile" (call `warmup` on) to report on itself.

A worker compiles a job by importing its module and calling `warmup` on the
named object; these stand in for kernels.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


class _Sleeper:
    """Touches `started` (a path), then sleeps: a long guess whose start can be waited for."""

    def warmup(self, *args, started: str = "", seconds: float = 0.0, **kwargs) -> None:
        Path(started).touch()
        time.sleep(seconds)


class _EnvReporter:
    """Fails with the value of the environment variable `name`, which the pool reports as the error."""

    def warmup(self, *args, name: str = "", **kwargs) -> None:
        raise RuntimeError(f"{name}={os.environ.get(name)}")


slow = _Sleeper()
env_probe = _EnvReporter()


class _TorchReporter:
    """Fails with what `torch` is in the worker's modules: absent, the deferred stand-in, or loaded."""

    def warmup(self, *args, **kwargs) -> None:
        import sys

        raise RuntimeError(f"torch is {type(sys.modules.get('torch')).__name__}")


torch_probe = _TorchReporter()


class _KeyReporter:
    """Fails with the cache-key prefix the worker's Triton answers with."""

    def warmup(self, *args, **kwargs) -> None:
        import triton.runtime.cache

        raise RuntimeError(f"key={triton.runtime.cache.triton_key()}")


key_probe = _KeyReporter()


class _MainReporter:
    """Fails with the file of the worker's `__main__`: None unless the tuning process's script ran there again."""

    def warmup(self, *args, **kwargs) -> None:
        import sys

        raise RuntimeError(f"__main__ file={getattr(sys.modules['__main__'], '__file__', None)}")


main_probe = _MainReporter()


class _CacheReporter:
    """Fails with the Triton cache the worker would write a compiled kernel to."""

    def warmup(self, *args, **kwargs) -> None:
        from fasta_sm.triton.worker import triton_cache_dir

        raise RuntimeError(f"cache={triton_cache_dir()}")


cache_probe = _CacheReporter()


class _PreloadReporter:
    """Fails with whether the worker came from fasta-sm's fork server (its preload imported) and its `__main__` file."""

    def warmup(self, *args, **kwargs) -> None:
        import sys

        preloaded = "fasta_sm.triton.worker_preload" in sys.modules
        raise RuntimeError(f"preload={preloaded} main={getattr(sys.modules['__main__'], '__file__', None)}")


preload_probe = _PreloadReporter()
