"""fasta-sm for torch_npu (Ascend): one line to switch torch_npu's FastA autotuner to the durable machine.

    import fasta_sm.npu
    fasta_sm.npu.enable()          # before the first torch.compile; or FASTA_SM_NPU=1

torch_npu's own `cached_autotune` builds `fasta_autotune.NPUFastAutotuner`
when its `fasta_autotune` config (env FASTAUTOTUNE=1) is on; `enable()` turns
that on and puts `FastaNPUAutotuner` in that slot. Compile workers are reached
the way torch_npu reaches them: through the environment (FASTAUTOTUNE,
FASTA_SM_NPU and the settings as JSON), which workers started after `enable()`
inherit, and fasta-sm's `torch.backends` entry point, which installs the
same class there. Only NPU seams live here; the tune split between worker and
parent is `fasta_sm.driver`, shared with the Inductor GPU integration.
Importing this package needs neither torch nor torch_npu.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from ..driver import DriverSettings, call_after_import, default_policy, env_flag
from ..errors import FastaError
from ..store import StateStore

log = logging.getLogger("fasta_sm.npu")

ENV_VAR = "FASTA_SM_NPU"
SETTINGS_ENV = "FASTA_SM_NPU_SETTINGS"
NPU_SWITCH_ENV = "FASTAUTOTUNE"
SLOT_MODULE = "torch_npu._inductor.runtime.fasta_autotune"

_saved_env: dict[str, str | None] | None = None


class NPUUnavailable(FastaError, ImportError):
    """torch_npu (or the Ascend libraries it loads) cannot be imported here."""


def _import_torch_npu() -> None:
    try:
        import torch_npu  # noqa: F401
        from torch_npu._inductor.runtime import fasta_autotune, triton_heuristics  # noqa: F401
    except (ImportError, OSError) as exc:
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
    optimize_configs: bool = False,
    state_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    chunk_size: int = 16,
) -> DriverSettings:
    """Tune torch_npu's generated kernels with fasta-sm; call before the first torch.compile.

    `optimize_configs` switches on the FASTA config optimizer over NPU spaces
    (prunes by circle count and sub-block size before sampling).
    """
    global _saved_env
    _import_torch_npu()
    params = dict(policy_params or {})
    if optimize_configs:
        params["optimize_configs"] = True
    settings = DriverSettings(
        policy=policy or default_policy(),
        policy_params=params,
        seed=seed,
        state_dir=str(StateStore(state_dir).path),
        chunk_size=chunk_size,
        compile_threads=1,  # torch_npu's compile has not been run in threads (no Ascend device here to check)
    )
    wanted = {ENV_VAR: "1", SETTINGS_ENV: json.dumps(settings.to_dict()), NPU_SWITCH_ENV: "1"}
    if _saved_env is None:
        _saved_env = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    from .autotuner import install

    install()
    log.info("fasta_sm.npu enabled: %s", settings)
    return settings


def disable() -> None:
    """Put back torch_npu's own FastA autotuner, its switch and the environment."""
    global _saved_env
    if _saved_env is None:
        return
    from .autotuner import uninstall

    uninstall()
    for name, value in _saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _saved_env = None


def current_settings() -> dict[str, Any] | None:
    """The settings this process tunes with: from `enable()` here, or inherited by a compile worker."""
    if not env_flag(ENV_VAR):
        return None
    return DriverSettings.from_dict(json.loads(os.environ.get(SETTINGS_ENV) or "{}")).to_dict()


def autoload() -> None:
    """torch's `torch.backends` entry point: with FASTA_SM_NPU=1, install the class once torch_npu's slot loads."""
    if not env_flag(ENV_VAR):
        return

    def install_quietly() -> None:
        from .autotuner import install

        install()

    call_after_import(SLOT_MODULE, install_quietly)


__all__ = ["ENV_VAR", "NPUUnavailable", "autoload", "current_settings", "disable", "enable"]
