"""FastaCachingAutotuner and the `cached_autotune` dispatcher that builds it.

Generated kernel source calls `triton_heuristics.pointwise/reduction/
persistent_reduction(...)`, which call the module's `cached_autotune`. The
dispatcher installed there hands a kernel to fasta-sm only when its
`inductor_meta` carries fasta-sm settings (written into the source by the
codegen patch), so every other kernel of the process is built exactly as
Inductor would build it.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
from typing import Any

from torch._inductor.runtime import triton_heuristics
from torch._inductor.runtime.hints import HeuristicType

from ..config import Config
from ..driver import DriverSettings, FastaAutotunerMixin, to_fasta_config
from .codegen import META_KEY, without_settings
from .space import DeviceLimits, generate_space

log = logging.getLogger("fasta_sm.inductor.autotuner")

KIND_OF = {
    HeuristicType.POINTWISE: "pointwise",
    HeuristicType.REDUCTION: "reduction",
    HeuristicType.PERSISTENT_REDUCTION: "persistent_reduction",
}
_UNTOUCHED_META = ("RSPLIT_SIZE", "tma_min_block_sizes", "profile_bandwidth", "deterministic")
"""Kernel variants whose configs carry constraints the tile generator does not model."""
_UNNAMED = "Placeholder."
"""The start of a kernel name Inductor never filled in: a kernel it compiles only to time a fusion choice
(`benchmark_fusion`), not one the program runs. Tuned, each would be a tune of its own under one shared name."""
_DETERMINISTIC_REDUCTION_META = (
    "force_filter_reduction_configs",
    "are_deterministic_algorithms_enabled",
    "strict_sum_rblock",
)
"""With any of these set, Inductor cuts a reduction's configs to one fixed config so that its numerics do not
depend on a timing (`filter_reduction_configs_for_determinism`; torch 2.14's `numerics="strict"` pins the
R0_BLOCK its sum was planned with): tuning it by timing would undo that."""


class FastaCachingAutotuner(FastaAutotunerMixin, triton_heuristics.CachingAutotuner):
    """Inductor's CachingAutotuner, tuning its (rich) config list with a durable FASTA tune.

    Behaves exactly as the base class when built without fasta-sm settings or
    with a single config (an autotune-cache hit).
    """

    def __init__(
        self,
        *args: Any,
        fasta_settings: dict | None = None,
        fasta_default_ids: frozenset[int] = frozenset(),
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        must = [i for i, c in enumerate(self.configs) if id(c) in fasta_default_ids]
        self._fasta_setup(fasta_settings, must, "inductor")

    def _fasta_turned_off(self) -> bool:
        from . import turned_off

        return turned_off()

    def _fasta_generated(self, source: str) -> str:
        """Without the settings fasta-sm wrote into the source (and the hook): they are the tune's settings, not
        its kernel (a tune run with others is superseded, its measurements kept), and a state dir or a seed must
        not make the same kernel a new tune."""
        return without_settings(source, self.inductor_meta.get(META_KEY))


def _to_inductor(template: Any, config: Config) -> Any:
    out = copy.deepcopy(template)
    out.kwargs = dict(config.kwargs)
    out.num_warps = config.num_warps
    out.num_stages = config.num_stages
    return out


def build_space(
    kind: str, size_hints: dict, configs: list, triton_meta: dict, inductor_meta: dict, settings: DriverSettings
) -> list:
    """Inductor's configs (the same objects, first) plus generated ones as Inductor configs."""
    props = triton_meta.get("device")
    limits = DeviceLimits(
        warp_size=getattr(props, "warp_size", None) or 32,
        max_threads_per_block=getattr(props, "max_threads_per_block", None) or 1024,
    )
    floors = {
        k: v
        for k, v in (("XBLOCK", inductor_meta.get("min_xblock")), ("R0_BLOCK", inductor_meta.get("min_rblock")))
        if v
    }
    defaults = [to_fasta_config(c) for c in configs]
    space = generate_space(kind, size_hints, defaults, limits=limits, floors=floors, max_configs=settings.max_configs)
    return list(configs) + [_to_inductor(configs[0], c) for c in space[len(defaults) :]]


def cached_autotune(*args: Any, **kwargs: Any) -> Any:
    """Inductor's `cached_autotune`, with fasta-sm's class and space for kernels that ask for it."""
    original = ORIGINAL_CACHED_AUTOTUNE
    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    inductor_meta = a.get("inductor_meta") or {}
    raw = inductor_meta.get(META_KEY)
    kind = KIND_OF.get(a.get("heuristic_type"))
    if (
        raw is None
        or kind is None
        or a.get("size_hints") is None
        or a.get("caching_autotuner_cls") is not triton_heuristics.CachingAutotuner
        or any(inductor_meta.get(k) for k in _UNTOUCHED_META)
        or (kind != "pointwise" and any(inductor_meta.get(k) for k in _DETERMINISTIC_REDUCTION_META))
        or (a.get("triton_meta") or {}).get("native_matmul")
        or str(inductor_meta.get("kernel_name", "")).startswith(_UNNAMED)
    ):
        return original(*args, **kwargs)
    settings = DriverSettings.from_dict(raw)
    configs = list(a["configs"])
    try:
        a["configs"] = build_space(kind, a["size_hints"], configs, a["triton_meta"], inductor_meta, settings)
    except Exception as exc:  # noqa: BLE001  a space we cannot build is Inductor's own space
        log.warning("fasta_sm: no generated space for %s: %s", inductor_meta.get("kernel_name"), exc)
    a["caching_autotuner_cls"] = functools.partial(
        FastaCachingAutotuner, fasta_settings=settings.to_dict(), fasta_default_ids=frozenset(map(id, configs))
    )
    return original(*bound.args, **bound.kwargs)


ORIGINAL_CACHED_AUTOTUNE = getattr(
    triton_heuristics.cached_autotune, "__wrapped_original__", triton_heuristics.cached_autotune
)
cached_autotune.__wrapped_original__ = ORIGINAL_CACHED_AUTOTUNE  # type: ignore[attr-defined]


def install() -> None:
    """Route `triton_heuristics.cached_autotune` through the dispatcher (idempotent)."""
    triton_heuristics.cached_autotune = cached_autotune


def uninstall() -> None:
    triton_heuristics.cached_autotune = ORIGINAL_CACHED_AUTOTUNE
