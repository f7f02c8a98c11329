"""A kernel with its config space and inputs: what the recorder and benchmarks run.

A spec is named on the command line as `module:function`; the function returns
a `KernelSpec`, so any importable kernel can be recorded without editing
fasta-sm.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import Config, check_config_list
from ..errors import ConfigError


@dataclass
class KernelSpec:
    """One kernel, one problem shape, one config space.

    `make_args(device)` returns the positional arguments of a launch;
    `grid(meta)` the launch grid from the bound arguments plus the config's
    kwargs (Triton's convention); `reference(args)` the expected contents of
    `args[output]` after a launch, so every config's result can be checked:
    ‖out − ref‖ / ‖ref‖ must not exceed `tolerance`.
    """

    name: str
    fn: Any
    configs: list[Config]
    make_args: Callable[[str], tuple]
    grid: Callable[[Mapping[str, Any]], tuple]
    shape: dict[str, Any]
    reference: Callable[[tuple], Any] | None = None
    output: int = -1
    kwargs: dict[str, Any] = field(default_factory=dict)
    reset_to_zero: Sequence[str] = ()
    restore_value: Sequence[str] = ()
    tolerance: float = 1e-2


def load_spec(spec: str, **params: Any) -> KernelSpec:
    """Resolve `module:function` and call the function with `params`."""
    factory = resolve_spec(spec, **params)
    try:
        result = factory(**params)
    except ConfigError as exc:  # the spec's own check of its parameters: say which spec was called with them
        raise ConfigError(f"spec {spec!r} called with {params!r}: {exc}") from None
    if not isinstance(result, KernelSpec):
        raise ConfigError(f"spec {spec!r} returned {type(result).__name__} {result!r:.80}, not a KernelSpec")
    check_config_list(result.name, result.configs)  # a table may hold each config once
    return result


def resolve_spec(spec: str, **params: Any) -> Callable[..., Any]:
    """The function `module:function` names, checked to take `params`, not yet called (it may allocate)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"spec {spec!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"spec {spec!r}: cannot import {module_name!r}: {exc}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"spec {spec!r}: {module_name} has no function {attr!r}")
    try:  # only the call's own fit: a TypeError inside the spec function keeps its traceback
        inspect.signature(factory).bind(**params)
    except TypeError as exc:
        raise ConfigError(f"spec {spec!r} called with {params!r}: {exc}") from None
    except ValueError:  # a callable without a signature (a builtin): let the call say what is wrong
        pass
    return factory
