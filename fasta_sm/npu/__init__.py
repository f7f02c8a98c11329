"""fasta-sm for torch_npu (Ascend): one line to switch torch_npu's FastA autotuner to the durable machine.

    import fasta_sm.npu
    fasta_sm.npu.enable()          # before the first torch.compile; or FASTA_SM_NPU=1

torch_npu's own `cached_autotune` builds `fasta_autotune.NPUFastAutotuner`
when its `fasta_autotune` config (env FASTAUTOTUNE=1) is on; `enable()` turns
that on and puts `FastaNPUAutotuner` in that slot. Compile workers are reached
the way torch_npu reaches them: through the environment (FASTAUTOTUNE,
FASTA_SM_NPU and the settings as JSON), which workers started after `enable()`
inherit, and the hook the kernels' source imports (`codegen`), which installs
the same class there: torch_npu starts its workers without the `torch.backends`
entry points. Only NPU seams live here; the tune split between worker and
parent is `fasta_sm.driver`, shared with the Inductor GPU integration.
Importing this package needs neither torch nor torch_npu.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from ..driver import (
    DriverSettings,
    call_after_import,
    cancel_after_import,
    default_policy,
    integration_params,
    params_mapping,
    seed_setting,
    whole_number,
)
from ..env import NPU_SWITCH, env_value, switch_or_off
from ..errors import FastaError
from ..machine import DEFAULT_CHUNK
from ..policies import check_arguments
from ..policies.fasta.params import LIVE_DEFAULTS
from ..prior import prior_enabled
from ..store import StateStore, state_dir_path
from . import codegen

log = logging.getLogger("fasta_sm.npu")

ENV_VAR = NPU_SWITCH
SETTINGS_ENV = "FASTA_SM_NPU_SETTINGS"
NPU_SWITCH_ENV = "FASTAUTOTUNE"
UB_BITS_ENV = "ENABLE_PRINT_UB_BITS"
"""torch_npu's FastA path needs the real UB usage. Imported with FASTAUTOTUNE=1 and this unset,
torch_npu 2.13 and 2.14 fail (their warning calls `log.warnings`), so fasta-sm sets it too."""
SLOT_MODULE = "torch_npu._inductor.runtime.fasta_autotune"
CONFIG_MODULE = "torch_npu._inductor.config"

_saved_env: dict[str, str | None] | None = None
_turned_off = False


class NPUUnavailable(FastaError, ImportError):
    """torch_npu (or the Ascend libraries it loads) cannot be imported here."""


def _import_torch_npu() -> None:
    try:
        import torch_npu  # noqa: F401
        from torch_npu._inductor.runtime import fasta_autotune, triton_heuristics  # noqa: F401
    except Exception as exc:  # importing torch_npu's Inductor backend also loads the device's backends
        raise NPUUnavailable(
            "fasta_sm.npu.enable() needs torch_npu with its Inductor backend "
            "(`pip install torch-npu==<your torch version>`) and the Ascend CANN runtime it loads "
            "(libhccl.so, libascendcl.so, ...: run CANN's set_env.sh first); "
            f"importing torch_npu failed: {type(exc).__name__}: {exc}"
        ) from exc


def enable(
    *,
    policy: str | None = None,
    policy_params: Mapping[str, Any] | None = None,
    optimize_configs: bool | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    chunk_size: int = DEFAULT_CHUNK,
) -> DriverSettings:
    """Tune torch_npu's generated kernels with fasta-sm; call before the first torch.compile.

    `optimize_configs` switches the FASTA config optimizer over NPU spaces on
    or off (it prunes by circle count and sub-block size before sampling; the
    fasta policy's knob); None leaves it to `policy_params` and
    `FASTA_CONFIG_OPTIMIZER`.
    """
    global _saved_env, _turned_off
    if optimize_configs is not None and not isinstance(optimize_configs, bool):
        raise ValueError(f"optimize_configs={optimize_configs!r} must be True, False or None")
    params = params_mapping(policy_params)
    if optimize_configs is not None:
        params["optimize_configs"] = optimize_configs
    settings = _settings(policy=policy, policy_params=params, seed=seed, state_dir=state_dir, chunk_size=chunk_size)
    wanted = {ENV_VAR: "1", SETTINGS_ENV: json.dumps(settings.to_dict()), NPU_SWITCH_ENV: "1", UB_BITS_ENV: "1"}
    before = {name: os.environ.get(name) for name in wanted}
    switch_before = _switch_now(before[NPU_SWITCH_ENV])
    os.environ.update(wanted)  # first: torch_npu sets up its FastA path when it is imported with the switch on
    try:
        _import_torch_npu()
        StateStore(settings.state_dir)  # made once torch_npu is there: an enable() that fails leaves no folder
        from .autotuner import install

        install(switch_before)
    except BaseException:
        _restore(before)
        loaded = sys.modules.get(CONFIG_MODULE)  # read while the switch was on: put its value back too
        if loaded is not None and hasattr(loaded, "fasta_autotune"):
            loaded.fasta_autotune = switch_before
        raise
    _turned_off = False
    if _saved_env is None:
        _saved_env = before
    log.info("fasta_sm.npu enabled: %s", settings)
    return settings


def _switch_now(text: str | None) -> bool:
    """torch_npu's FastA switch as it stands: its config's value once loaded, else what the environment says."""
    loaded = sys.modules.get(CONFIG_MODULE)
    return bool(loaded.fasta_autotune) if loaded is not None else text == "1"


def disable() -> None:
    """Put back torch_npu's own FastA autotuner and its switch in this process, and the environment `enable()` set.

    Under FASTA_SM_NPU=1 alone the variable is the user's and stays, so compile
    workers started later still install fasta-sm's class. A kernel that a
    worker started while it was on built as fasta-sm's is left untuned by
    fasta-sm here: this process times torch_npu's expert configs instead.
    """
    global _saved_env, _turned_off
    _turned_off = True
    cancel_after_import(SLOT_MODULE)  # a FASTA_SM_NPU=1 still waiting for torch_npu's slot must not install it
    codegen.unpatch()  # nor write the hook into the kernels generated from now on
    autotuner = sys.modules.get(f"{__name__}.autotuner")
    if autotuner is not None:
        autotuner.uninstall()
    if _saved_env is not None:
        _restore(_saved_env)
        _saved_env = None


def turned_off() -> bool:
    """Whether this process called `disable()` since it last called `enable()`."""
    return _turned_off


def _restore(values: Mapping[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _settings(
    *,
    policy: str | None = None,
    policy_params: Mapping[str, Any] | None = None,
    seed: int = 0,
    state_dir: str | os.PathLike[str] | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> DriverSettings:
    """The settings of `enable()`, and of a process switched on by FASTA_SM_NPU=1 alone; their state dir is made
    by the caller, once every setting is known good."""
    policy = default_policy() if policy is None else policy
    settings = DriverSettings(
        policy=policy,
        policy_params=integration_params(policy, policy_params, LIVE_DEFAULTS),
        seed=seed_setting(seed),
        state_dir=str(state_dir_path(state_dir)),
        chunk_size=whole_number("chunk_size", chunk_size, 1),
        prior=prior_enabled(),
    )
    check_arguments(settings.policy, settings.policy_params)
    return settings


def current_settings() -> dict[str, Any] | None:
    """The settings this process tunes with: from `enable()` here, inherited by a compile worker, or
    `enable()`'s defaults under FASTA_SM_NPU=1 alone."""
    if not switch_or_off(ENV_VAR):
        return None
    raw = env_value(SETTINGS_ENV)  # set to nothing or to blanks: unset, as every variable is read
    try:
        if raw:
            return _checked_settings(raw).to_dict()
        settings = _settings()
        StateStore(settings.state_dir)
        return settings.to_dict()
    except Exception as exc:  # noqa: BLE001  bad JSON, not a map, a bad state dir: torch_npu keeps its kernels
        _warn_unusable(f"{'$' + SETTINGS_ENV + ': ' if raw else ''}{type(exc).__name__}: {exc}")
        return None


@functools.lru_cache(maxsize=8)
def _checked_settings(raw: str) -> DriverSettings:
    """`$FASTA_SM_NPU_SETTINGS` decoded and checked once per value, not once per kernel built.

    A field `DriverSettings` does not have (`polcy`) is refused, not dropped: a misspelt setting read as its
    default would be a tune the user thinks is set one way and runs another."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"a JSON object of settings is needed, not {type(data).__name__}")
    known = DriverSettings.__dataclass_fields__
    unknown = sorted(name for name in data if name not in known)
    if unknown:
        raise ValueError(f"unknown settings {', '.join(map(repr, unknown))}; the settings are {', '.join(known)}")
    if "prior" not in data:  # as `enable()` reads it: the prior on whatever FASTA_SM_PRIOR says
        data = {**data, "prior": prior_enabled()}
    return DriverSettings.from_dict(data).checked()


@functools.cache
def _warn_unusable(why: str) -> None:
    """Once per process and reason, not once per kernel."""
    log.warning("fasta_sm.npu is on but its settings are not usable (%s); torch_npu tunes its own kernels", why)


def autoload() -> None:
    """torch's `torch.backends` entry point: with FASTA_SM_NPU=1, install the class once torch_npu's slot loads.

    It runs at the end of `import torch`, before torch_npu reads its switch:
    FASTAUTOTUNE=1 is set then, unless the environment says otherwise, so that
    torch_npu imports the slot at all (and with it on, ENABLE_PRINT_UB_BITS=1
    where that reads 0, `_print_ub_bits_for_the_switch`).
    The hook goes into the kernels' imports as soon as torch_npu's codegen
    loads, not with the class: torch_npu imports the slot only to build a
    kernel, which a process with a compile pool first does after generating
    its first graph's kernels; their workers would build torch_npu's own.
    """
    if not switch_or_off(ENV_VAR):
        return
    switch_before = _switch_now(os.environ.get(NPU_SWITCH_ENV))
    os.environ.setdefault(NPU_SWITCH_ENV, "1")
    _print_ub_bits_for_the_switch()

    def install_quietly() -> None:
        """Runs inside torch_npu's import of the slot: whatever happens, that import must go on."""
        autotuner = sys.modules.get(f"{__name__}.autotuner")
        if autotuner is not None and not hasattr(autotuner, "install"):
            # fasta_sm.npu.autotuner is importing the slot itself: it installs once it is defined
            _pending_install.append(switch_before)
            return
        _install_or_warn(switch_before)

    call_after_import(SLOT_MODULE, install_quietly)
    codegen.patch()


def _print_ub_bits_for_the_switch() -> None:
    """ENABLE_PRINT_UB_BITS=1 where torch_npu's switch is on and the variable reads as torch_npu reads a 0 (unset
    or "0"): torch_npu 2.13/2.14 would set it so after a warning, but the warning (`log.warnings`) fails their
    import first. A user's 0 kept would break every torch.compile of a process that compiles without fasta-sm."""
    if os.environ.get(NPU_SWITCH_ENV) == "1" and os.environ.get(UB_BITS_ENV, "0") == "0":
        os.environ[UB_BITS_ENV] = "1"


def install_for_kernel_source() -> None:
    """Install the class for a kernel whose source imports `fasta_sm.npu.hook`, where fasta-sm is on and not
    disabled: in a compile worker, where the entry point did not run. The kernel must load whatever happens.

    Installed whatever the settings, as `autoload` installs it in the parent: with settings it cannot use, the
    class builds torch_npu's own (`FastaNPUAutotuner.__new__`), which then pickles back as torch_npu's, not by the
    slot's name, which the parent would read as a worker where fasta-sm was never installed.

    Not installed where torch_npu's switch is off (the user's FASTAUTOTUNE=0): the parent then never loads the
    slot, so never installs it; installing here would turn the switch on in the worker alone, and the kernel,
    unpickled in the parent as fasta-sm's, would install it there too."""
    if _turned_off or not switch_or_off(ENV_VAR):
        return
    switch = _switch_now(os.environ.get(NPU_SWITCH_ENV))
    if switch:
        _install_or_warn(switch)


def _install_or_warn(switch_before: bool) -> None:
    """Install the class where nothing may fail (torch_npu's import of its slot, a kernel's load): on any error
    torch_npu keeps its own autotuner, and says so once."""
    try:
        from .autotuner import install

        install(switch_before)
    except Exception as exc:  # noqa: BLE001  whatever fails, the import or the load goes on
        _warn_not_installed(f"{type(exc).__name__}: {exc}")


@functools.cache
def _warn_not_installed(why: str) -> None:
    log.warning("fasta_sm.npu is on but could not install its autotuner (%s); torch_npu tunes its own kernels", why)


_pending_install: list[bool] = []
"""torch_npu's switch as `autoload` found it, while the install waits for `fasta_sm.npu.autotuner` to load."""


def take_pending_install() -> bool | None:
    """The switch value of an install `autoload` deferred until `fasta_sm.npu.autotuner` was defined, once."""
    return _pending_install.pop() if _pending_install else None


__all__ = [
    "ENV_VAR",
    "NPUUnavailable",
    "autoload",
    "current_settings",
    "disable",
    "enable",
    "install_for_kernel_source",
    "turned_off",
]
