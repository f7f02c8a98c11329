"""fasta-sm inside torch.compile: one switch, no change to model code.

    import fasta_sm.inductor
    fasta_sm.inductor.enable()            # or: with fasta_sm.inductor.enabled(): ...
    model = torch.compile(model)          #     or: FASTA_SM_INDUCTOR=1 python train.py

When on, Inductor's pointwise, reduction and persistent-reduction Triton
kernels are tuned over a generated tile space (see `space`) by a durable
FASTA tune split between the compile worker and the parent (see
`fasta_sm.driver`). Importing this package does not import torch; `enable()` does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from ..driver import (
    DriverSettings,
    call_after_import,
    cancel_after_import,
    default_policy,
    integration_params,
    seed_setting,
    whole_number,
)
from ..env import INDUCTOR_SWITCH, env_value, switch_or_off
from ..env_numbers import whole_from_env
from ..errors import MissingDependency
from ..machine import DEFAULT_CHUNK
from ..policies import check_arguments
from ..policies.fasta.params import LIVE_DEFAULTS
from ..prior import prior_enabled
from ..store import StateStore, state_dir_path
from .codegen import source_safe

log = logging.getLogger("fasta_sm.inductor")

ENV_VAR = INDUCTOR_SWITCH
MAX_CONFIGS_ENV = "FASTA_SM_INDUCTOR_MAX_CONFIGS"
CODEGEN_MODULE = "torch._inductor.codegen.triton"

FASTA_DEFAULTS: dict[str, Any] = {"rounds": 1, **LIVE_DEFAULTS}
"""Defaults for the fasta policy under Inductor (a `policy_params` entry overrides each).

Inductor's spaces hold a few dozen configs and the parent compiles each R2
round itself, between the model's first runs: one guided batch, compiled in
parallel threads, waits on about one compile, where several rounds of one
config each wait on one compile apiece. Re-timing is the live kind
(`LIVE_DEFAULTS`).
"""

_saved: dict[str, Any] | None = None
_settings: DriverSettings | None = None
_turned_off = False
"""Whether this process called `disable()` after `enable()`: the hook in a cached kernel's source then
installs nothing."""


def enable(
    *,
    policy: str | None = None,
    policy_params: Mapping[str, Any] | None = None,
    max_configs: int | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    chunk_size: int = DEFAULT_CHUNK,
) -> DriverSettings:
    """Tune the kernels torch.compile generates from now on; returns the settings in force.

    `max_configs` caps each kernel's space (default 64, or $FASTA_SM_INDUCTOR_MAX_CONFIGS);
    `policy` defaults to "fasta", whose `policy_params` start from `FASTA_DEFAULTS`.
    Calling it again replaces the settings.
    """
    if max_configs is None:
        raw = env_value(MAX_CONFIGS_ENV)
        max_configs = DriverSettings.max_configs if raw is None else whole_from_env(MAX_CONFIGS_ENV, raw, 1)
    policy = default_policy() if policy is None else policy
    params = integration_params(policy, policy_params, FASTA_DEFAULTS)
    check_arguments(policy, params)
    settings = DriverSettings(
        policy=policy,
        policy_params=params,
        seed=seed_setting(seed),
        state_dir=str(state_dir_path(state_dir)),
        max_configs=whole_number("max_configs", max_configs, 1),
        chunk_size=whole_number("chunk_size", chunk_size, 1),
        prior=prior_enabled(),
    )
    source_safe(settings.to_dict())
    StateStore(settings.state_dir)  # made only once every setting is known good
    _switch_on(settings)
    log.info("fasta_sm.inductor enabled: %s", settings)
    return settings


def _switch_on(settings: DriverSettings) -> None:
    """Patch Inductor's codegen and autotuner (once) and tune with `settings` from now on."""
    global _saved, _settings, _turned_off
    # these settings are the switch from now on: a FASTA_SM_INDUCTOR=1 still waiting for the codegen, which the
    # import below loads, would otherwise enable() with the environment's settings first, inside that import
    cancel_after_import(CODEGEN_MODULE)
    try:
        from torch._inductor.codegen import triton as codegen_triton
    except ImportError as exc:
        raise MissingDependency(
            f"fasta_sm.inductor needs torch with Inductor ({exc}): pip install 'fasta-sm[inductor]'"
        ) from None

    from . import autotuner
    from .codegen import patched_codegen_kernel

    kernel_cls = codegen_triton.TritonKernel
    if _saved is None:
        _saved = {"codegen_kernel": kernel_cls.__dict__.get("codegen_kernel")}
        kernel_cls.codegen_kernel = patched_codegen_kernel(kernel_cls.codegen_kernel, current_settings)
    autotuner.install()
    _settings = settings
    _turned_off = False


def disable() -> None:
    """Put back exactly what `enable()` replaced, or the dispatcher a cached kernel's hook installed without
    it, for good in this process: a kernel loaded later that imports the hook installs nothing."""
    global _saved, _settings, _turned_off
    cancel_after_import(CODEGEN_MODULE)  # a FASTA_SM_INDUCTOR=1 still waiting for the codegen must not switch it on
    if _saved is None:
        hooked = sys.modules.get(f"{__name__}.autotuner")
        if hooked is not None:  # a cached kernel's source imported the hook, which installed the dispatcher
            hooked.uninstall()
        _turned_off = True
        return
    from torch._inductor.codegen import triton as codegen_triton

    from . import autotuner

    kernel_cls = codegen_triton.TritonKernel
    if _saved["codegen_kernel"] is None:
        del kernel_cls.codegen_kernel
    else:
        kernel_cls.codegen_kernel = _saved["codegen_kernel"]
    autotuner.uninstall()
    _saved, _settings, _turned_off = None, None, True


def turned_off() -> bool:
    """Whether `disable()` switched fasta-sm off in this process (the hook then installs nothing)."""
    return _turned_off


def is_enabled() -> bool:
    """Whether fasta-sm tunes Inductor's kernels now: after `enable()` (until `disable()`), or inside `enabled()`."""
    return _settings is not None


def current_settings() -> dict[str, Any] | None:
    """The settings written into kernel source now, or None when off."""
    return None if _settings is None else _settings.to_dict()


@contextlib.contextmanager
def enabled(**settings: Any) -> Iterator[DriverSettings]:
    """`enable(**settings)` for the block, then back to how it was (on, with the old settings, or off)."""
    global _turned_off
    before, was_turned_off, was_hooked = _settings, _turned_off, _hook_installed()
    try:
        yield enable(**settings)
    finally:
        if before is not None:  # on again with the old settings, whatever the block switched
            _switch_on(before)
        else:
            disable()
            if not was_turned_off:  # off, not disabled: a cached kernel's hook still works, as before the block
                _turned_off = False
                if was_hooked:
                    sys.modules[f"{__name__}.autotuner"].install()
                autoload()  # FASTA_SM_INDUCTOR=1 may have been waiting for Inductor's codegen: it waits again


def _hook_installed() -> bool:
    """Whether the dispatcher is installed (by `enable()`, or by a cached kernel's hook without it)."""
    hooked = sys.modules.get(f"{__name__}.autotuner")
    return hooked is not None and hooked.triton_heuristics.cached_autotune is hooked.cached_autotune


def autoload() -> None:
    """torch's `torch.backends` entry point: honours FASTA_SM_INDUCTOR=1 in any process importing torch.

    It runs at the end of `import torch`, so it only arranges for `enable()` to
    run once Inductor's codegen is imported, and imports nothing heavy itself.
    """
    if switch_or_off(ENV_VAR) and not is_enabled():
        call_after_import(CODEGEN_MODULE, _enable_from_environment)


def _enable_from_environment() -> None:
    """`enable()` as Inductor's codegen loads: a bad setting leaves fasta-sm off, never Inductor broken."""
    if is_enabled():
        return
    try:
        enable()
    except Exception as exc:  # noqa: BLE001  a bad setting (value, state dir, policy) must not break Inductor
        log.warning("%s=1 but fasta-sm stays off: %s: %s", ENV_VAR, type(exc).__name__, exc)


__all__ = ["ENV_VAR", "autoload", "current_settings", "disable", "enable", "enabled", "is_enabled"]
