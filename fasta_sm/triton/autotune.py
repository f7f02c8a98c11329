"""`fasta_sm.autotune`: a drop-in for `triton.autotune` that tunes durably and cheaply.

The decorator has `triton.autotune`'s call shape and semantics (the key, config
pruning, reset/restore of mutated arguments, hooks, a custom `do_bench`), but
each tuning key is a fasta-sm tune: the policy measures a fraction of the
configs, every step is checkpointed, a process killed mid-tune resumes where it
stopped, and a finished tune is reused by the next process without measuring
anything.

The key is Triton's (the `key` arguments' values and every tensor argument's
dtype) plus the device name, the Triton version and a hash of the kernel's
source, since a winner on one GPU, compiler or version of the code says little
about another.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import logging
import numbers
import os
import textwrap
import threading
import time
import types
import warnings
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import triton
from triton.runtime.autotuner import Autotuner as TritonAutotuner
from triton.runtime.jit import JITFunction

from ..config import Config
from ..driver import integration_params, plain_literal, seed_setting, to_fasta_config
from ..errors import ConfigError, FastaError, StateDirError, add_note
from ..policies import check_arguments
from ..policies.fasta.params import LIVE_DEFAULTS, check_expert_configs
from ..prior import prior_enabled
from ..state import TuneState, remember_configs
from ..store import StateStore, default_lock_timeout, refuse_non_directory, state_dir_path
from ..tuner import TuneResult, tune
from .backend import REP_MS, WARMUP_MS, TritonBackend, device_name, zero_args
from .compile_pool import check_settings, shared_pool
from .fork_server import interpreting, note_kernel_module, start_fork_server
from .worker import config_failures, kernel_path, unwrap_jit

logger = logging.getLogger("fasta_sm.triton.autotune")


def _compiles_in_pool(fn: Any) -> bool:
    """Whether the compile workers can compile `fn`: a bare jit function with a path they import it by."""
    return isinstance(fn, JITFunction) and kernel_path(fn) is not None


def to_triton_config(config: Config) -> triton.Config:
    """The `triton.Config` a fasta-sm config stands for: what a tune's winner is launched with."""
    return triton.Config(
        dict(config.kwargs), num_warps=config.num_warps, num_stages=config.num_stages, **dict(config.options)
    )


def _as_triton_configs(kernel: str, configs: Any) -> list[triton.Config]:
    """The decorator's `configs`, a list of `triton.Config` (or of fasta-sm `Config`s), as `triton.Config`s;
    anything else (one config not in a list, None, a dict of kwargs) is a TypeError naming the kernel."""
    if isinstance(configs, (triton.Config, Config)):
        raise TypeError(f"fasta_sm.autotune({kernel}): configs must be a list of triton.Config, not one config "
                        "alone (put it in a list)")
    if isinstance(configs, (str, Mapping)):
        raise TypeError(f"fasta_sm.autotune({kernel}): configs must be a list of triton.Config, not the "
                        f"{type(configs).__name__} {configs!r:.80}")
    try:
        listed = list(configs)
    except TypeError:
        raise TypeError(f"fasta_sm.autotune({kernel}): configs must be a list of triton.Config, not {configs!r}") \
            from None
    for position, config in enumerate(listed):
        if not isinstance(config, (triton.Config, Config)):
            raise TypeError(f"fasta_sm.autotune({kernel}): configs[{position}] is a {type(config).__name__}, "
                            f"not a triton.Config: {config!r:.80}")
    return [c if isinstance(c, triton.Config) else to_triton_config(c) for c in listed]


_TIMINGS_LOCK = threading.Lock()
"""Orders a tune's pending `configs_timings`, a reader's keeping of what it made of them, and an assignment."""


MOST_NAMED = 5  # repeated configs a warning names; it counts the rest


def _distinct(
    kernel: str,
    configs: list[triton.Config],
    as_fasta: Callable[[triton.Config], Config],
    decorated: bool = True,
) -> list[triton.Config]:
    """`configs` with each config once: Triton would time a repeat again and keep one of the two.

    In the list a kernel is decorated with, two configs fasta-sm cannot tell
    apart (the same kwargs and launch options, `ir_override` among them) that
    differ by a `pre_hook` are an error: which of them won could not be told
    from the state file. Twins a prune makes at launch are silently one, the
    first (`decorated=False`). `as_fasta` converts a config: the decorator's
    conversions, kept, so that neither decorating nor a launch converts a
    config twice.
    """
    first_of: dict[str, triton.Config] = {}
    kept, repeated = [], []
    for config in configs:
        try:
            identity = as_fasta(config).identity
        except ConfigError as error:
            raise ConfigError(f"fasta_sm.autotune({kernel}): {error}") from None
        first = first_of.get(identity)
        if first is None:
            first_of[identity] = config
            kept.append(config)
            continue
        if decorated and _extras(first) != _extras(config):
            raise ValueError(
                f"fasta_sm.autotune({kernel}): two configs differ only by a pre_hook "
                f"({as_fasta(config).label()}); fasta-sm keys a config by its kwargs and launch options"
            )
        repeated.append(as_fasta(config).label())
    if decorated and repeated:
        shown = ", ".join(repeated[:MOST_NAMED]) + (f" and {len(repeated) - MOST_NAMED} more"
                                                     if len(repeated) > MOST_NAMED else "")
        logger.warning("fasta_sm.autotune(%s): %d repeated configs dropped, each kept once: %s", kernel,
                       len(repeated), shown)
    return kept


def _extras(config: triton.Config) -> tuple:
    """What a config holds beyond its kwargs and launch options."""
    return (config.pre_hook,)


@dataclass(frozen=True)
class _Listing:
    """A tune's config list as the launch path needs it: Triton's configs, their fasta-sm conversions, and what
    the checks and the backend read off them. Built once for the decorated list, which every launch without a
    prune tunes over."""

    configs: list[triton.Config]
    fasta: list[Config]
    by_identity: dict[str, triton.Config]
    names: frozenset[str]  # what the configs set: meta-parameters and launch options
    # a tuple kwarg is its repr in a fasta config (it keys the state); launched, it is the tuple
    kwargs: dict[str, dict[str, Any]]

    @classmethod
    def of(cls, configs: list[triton.Config], fasta: list[Config]) -> _Listing:
        return cls(
            configs=configs,
            fasta=fasta,
            by_identity={f.identity: c for f, c in zip(fasta, configs)},
            names=frozenset(name for config in configs for name in config.all_kwargs()),
            kwargs={f.identity: dict(c.kwargs) for f, c in zip(fasta, configs) if dict(c.kwargs) != dict(f.kwargs)},
        )


class Autotuner(TritonAutotuner):
    """The object `@fasta_sm.autotune(...)` puts in place of the kernel; launch it as `kernel[grid](...)`.

    It is a `triton.runtime.autotuner.Autotuner` so that PyTorch takes it for one: `torch.compile` traces
    its launches as a user-defined Triton kernel (Inductor compiles `fn` with `configs` and tunes them
    itself), and `torch.library.wrap_triton` accepts it. Triton's `__init__` is not called, as its
    arguments and what it sets up differ between Triton versions; this one sets the attributes PyTorch
    reads (`fn`, `configs`, `keys`, `arg_names`, `reset_to_zero`, `restore_value`, the prune callbacks,
    the timing knobs and whether hooks were given), under Triton's names.
    """

    def __init__(
        self,
        fn: Any,
        configs: Sequence[Any],
        key: Sequence[str],
        *,
        prune_configs_by: Mapping[str, Any] | None = None,
        reset_to_zero: Sequence[str] | None = None,
        restore_value: Sequence[str] | None = None,
        pre_hook: Callable[..., Any] | None = None,
        post_hook: Callable[..., Any] | None = None,
        warmup: float | None = None,
        rep: float | None = None,
        use_cuda_graph: bool = False,
        do_bench: Callable[..., Any] | None = None,
        policy: str | None = "fasta",
        budget: float | None = None,
        policy_params: Mapping[str, Any] | None = None,
        seed: int = 0,
        state_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.fn = fn
        self.arg_names = list(fn.arg_names)
        base, set_by_heuristics = fn, set()
        while hasattr(base, "fn"):  # heuristics → jit → the Python function, as Triton's own Autotuner does
            set_by_heuristics |= set(getattr(base, "values", None) or {})  # what a heuristics layer sets at launch
            base = base.fn
        self.base_fn = base
        self._required = [name for name, parameter in inspect.signature(base).parameters.items()
                          if parameter.default is inspect.Parameter.empty and name not in set_by_heuristics]
        self.kernel_name = f"{base.__module__}.{base.__qualname__}"
        # Converted, hashed and handed to the state reader once, here: a warm start must not
        # pay for it before its first launch.
        converted: dict[int, Config] = {}
        self.configs = _distinct(
            self.kernel_name,
            _as_triton_configs(self.kernel_name, configs),
            as_fasta=lambda config: converted.setdefault(id(config), to_fasta_config(config)),
        )
        if not self.configs:
            raise ValueError(f"fasta_sm.autotune({self.kernel_name}): the config list is empty")
        # each conversion with its config, held alive: keyed by the id of a config freed since (a list assigned
        # to `configs`), a conversion would pass to a new config given that id
        self._as_fasta = {id(c): (c, converted[id(c)]) for c in self.configs}
        remember_configs([fasta for _, fasta in self._as_fasta.values()])
        self.keys = _names(self.kernel_name, "key", key, self.arg_names)
        self._warn_of_keys_set_for_the_launch(set_by_heuristics)
        self.reset_to_zero = _names(self.kernel_name, "reset_to_zero", reset_to_zero or [], self.arg_names)
        self.restore_value = _names(self.kernel_name, "restore_value", restore_value or [], self.arg_names)
        self.user_pre_hook = pre_hook
        self.post_hook = post_hook
        self.user_defined_pre_hook = pre_hook is not None
        self.user_defined_post_hook = post_hook is not None
        self.num_warmups, self.num_reps, self.use_cuda_graph = warmup, rep, use_cuda_graph
        self.cache_results = False
        self.warmup_ms = self._milliseconds("warmup", warmup, WARMUP_MS)
        self.rep_ms = self._milliseconds("rep", rep, REP_MS)
        if warmup is not None or rep is not None or use_cuda_graph:  # as in Triton: they replace `do_bench`
            warnings.warn(
                "warmup, rep, and use_cuda_graph parameters are deprecated. See "
                "https://github.com/triton-lang/triton/pull/4496 for details.",
                DeprecationWarning,
                stacklevel=3,  # the line that decorates the kernel
            )
            do_bench = _cuda_graph_bench(self.rep_ms) if use_cuda_graph else None
        self._do_bench = do_bench
        prune = dict(prune_configs_by or {})
        self.perf_model = prune.get("perf_model")
        self.configs_top_k = prune.get("top_k", 1.0)
        self.early_config_prune = prune.get("early_config_prune")
        self.policy = "fasta" if policy is None else policy
        try:  # refused here, where the decorator is written, not at the first launch
            self.policy_params = integration_params(self.policy, policy_params, LIVE_DEFAULTS)
            if budget is not None:
                if "budget" in (policy_params or {}):
                    raise ValueError(
                        f"budget={budget!r} and policy_params['budget']={policy_params['budget']!r}: give one"
                    )
                self.policy_params["budget"] = plain_literal("budget", budget)  # as policy_params' values are
            where = state_dir_path(state_dir)
            refuse_non_directory(where)
            check_arguments(self.policy, self.policy_params)
            self._check_expert_configs()
            self.seed = seed_setting(seed)
            check_settings()
            prior_enabled()  # read again at each tune; a bad value is refused where the decorator is written
            default_lock_timeout()
        except (FastaError, ValueError) as exc:
            raise ValueError(f"fasta_sm.autotune({self.kernel_name}): {exc}") from None
        # one given is made absolute now, as the program may change directory before its first launch; the default
        # is read then, as the environment that names it may be set after decoration
        self.state_dir: Path | None = where if state_dir is not None else None
        self._store: StateStore | None = None
        self.cache: dict[tuple, triton.Config] = {}
        self.results: dict[tuple, TuneResult] = {}
        self.best_config: triton.Config | None = None
        self.bench_time: float | None = None
        self.configs_timings = {}
        self.nargs: dict[str, Any] | None = None  # set by code that calls `prune_configs` as Triton's
        self._decorated: tuple[tuple[int, ...], _Listing] | None = None
        self._listed()  # here, as the conversions are: a warm start's first launch reads it
        if len(self.configs) > 1 and _compiles_in_pool(fn):
            note_kernel_module(base.__module__, getattr(base, "__globals__", {}))
            start_fork_server()

    @property
    def configs_timings(self) -> dict[triton.Config, list[float]]:
        """Triton's `configs_timings` of the last key tuned or reused (`_configs_timings`), made when first
        read: keying it hashes every timed config (Triton's `all_kwargs`), which a launch need not wait for."""
        pending = self._timings_of  # read once: another thread's tune or read may replace or clear it
        if pending is None:
            return self._configs_timings
        timings = _configs_timings(*pending)
        with _TIMINGS_LOCK:  # kept only if no tune or assignment came since: a later one is not undone
            if self._timings_of is pending:
                self._configs_timings, self._timings_of = timings, None
        return timings

    @configs_timings.setter
    def configs_timings(self, timings: dict[triton.Config, list[float]]) -> None:
        with _TIMINGS_LOCK:
            self._configs_timings, self._timings_of = timings, None

    def _check_expert_configs(self) -> None:
        """Refuse a fasta `expert_configs` index past the end of `configs` now rather than at the first launch.

        The indices name configs of the list a tune runs on: after `prune_configs_by`, the pruned list, which
        the policy checks them against when the tune starts. A `perf_model` keeps some of `configs`, so an
        index past them never names one; an `early_config_prune` may return a list of its own, of any length,
        so with one nothing can be told before the launch.
        """
        if self.policy == "fasta" and self.early_config_prune is None:
            check_expert_configs(self.policy_params.get("expert_configs", ()), len(self.configs))

    def _milliseconds(self, name: str, value: Any, default: float) -> float:
        """A timing knob (`warmup`, `rep`) as a number of ms ≥ 0, or `default` for None; else an error naming it."""
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
            raise ValueError(f"fasta_sm.autotune({self.kernel_name}): {name}={value!r} must be a number of ms ≥ 0")
        return float(value)

    # ------------------------------------------------------------------ key

    def _warn_of_keys_set_for_the_launch(self, set_by_heuristics: set[str]) -> None:
        """Warn of `key` names that a config or a heuristic sets: no launch passes them, so they never reach the
        key, and the one durable winner serves every call (Triton drops them the same way, for one process)."""
        set_by_configs = {name for config in self.configs for name in config.kwargs}
        unseen = [name for name in self.keys if name in set_by_configs or name in set_by_heuristics]
        if unseen:
            warnings.warn(
                f"fasta_sm.autotune({self.kernel_name}): key names {', '.join(unseen)}, which the "
                f"{'configs set' if set(unseen) <= set_by_configs else 'configs or heuristics set'}, "
                "not the caller: it stays out of the tuning key, so one winner serves every call; key on the "
                "arguments that vary between calls (sizes, strides)",
                stacklevel=4,  # the line that decorates the kernel
            )

    def key_of(self, nargs: Mapping[str, Any]) -> tuple:
        """Triton's tuning key (key values, then tensor dtypes) plus device, Triton version and kernel source.

        The source is the kernel's own text: an edit to it is a new tune, as a
        stale winner may no longer compile or be right for the new code.
        """
        values = [nargs[name] for name in self.keys if name in nargs]
        values += [str(arg.dtype) for name, arg in nargs.items() if name in self.arg_names and hasattr(arg, "dtype")]
        return (*values, device_name(), triton.__version__, self.source_hash)

    @functools.cached_property
    def source_hash(self) -> str:
        """Taken at the first launch, not at decoration: a helper the module defines after the kernel exists
        by then, as it does when Triton compiles."""
        return _source_hash(self.fn)

    def store(self) -> StateStore:
        if self._store is None:
            try:
                self._store = StateStore(self.state_dir)
            except StateDirError as exc:  # made a file, or unwritable, since the decoration
                raise StateDirError(f"{self.kernel_name}: {exc}") from None
        return self._store

    # ------------------------------------------------------------------ launch

    def run(self, *args: Any, **kwargs: Any) -> Any:
        nargs = {**dict(zip(self.arg_names, args)), **kwargs}
        reused_from = None
        if len(self.configs) == 1:
            config = self.configs[0]
        else:
            key = self.key_of(nargs)
            config = self.cache.get(key)
            if config is None:
                config = self._tune(key, args, kwargs, nargs)
                self.cache[key] = config
                result = self.results.get(key)  # none when the prune left a single config
                if result is not None and result.reused:
                    reused_from = key
        self.best_config = config
        options = config.all_kwargs()
        self._refuse_conflicts(nargs, options.keys())
        if config.pre_hook is not None:
            config.pre_hook({**nargs, **options})
        try:
            return self.fn.run(*args, **kwargs, **options)
        except config_failures(interpreting(self.fn)) as error:  # the tuple is built only when a launch fails
            if reused_from is not None:
                self.cache.pop(reused_from, None)
                self.results.pop(reused_from, None)  # a later prune to one config must not pass for this reuse
                add_note(error, self._stale_winner(reused_from, config))
            raise

    def _stale_winner(self, key: tuple, config: triton.Config) -> str:
        """Why the winner an earlier process tuned fails here, and the two ways out."""
        path = self.store().file_for(_key_string(self.kernel_name, key))
        return (
            f"fasta-sm: {self.kernel_name}: the winner {self._fasta(config).label()} comes from an earlier tune of "
            f"the key {key} (state file {path}) and fails with these arguments: an argument that decides which "
            "configs compile (a constexpr, a shape) is missing from `key`; add it, or delete that state file "
            "and its `.superseded-*` files (a new tune keeps their results) to tune again"
        )

    def _refuse_conflicts(self, nargs: Mapping[str, Any], tuned: Collection[str]) -> None:
        """What a config sets (a meta-parameter, or a launch option such as num_warps) and the launch passes too,
        by name or by position, is an error before anything is tuned: the launch would get it twice."""
        conflicts = nargs.keys() & tuned
        if conflicts:
            raise ValueError(
                f"{self.kernel_name}: conflicting meta-parameters {', '.join(sorted(conflicts))}: "
                "set by the configs and also passed at launch"
            )

    def _refuse_incomplete(self, nargs: Mapping[str, Any], configs: Sequence[triton.Config]) -> None:
        """A kernel parameter neither the launch nor a config sets is an error naming it before anything is
        compiled, not once a round picks the config: the launch's when no config sets it, else the config's
        (a misspelt kwarg, say)."""
        unset = [name for name in self._required if name not in nargs]
        nowhere = [name for name in unset if not any(name in config.kwargs for config in configs)]
        if nowhere:
            strays = sorted({name for config in configs for name in config.kwargs} - set(self.arg_names))
            hint = ""
            if strays:
                hint = f" (the configs set {', '.join(strays)}, which the kernel does not take: misspelt?)"
            raise TypeError(
                f"{self.kernel_name}: the launch leaves {', '.join(nowhere)} unset, and no config sets it{hint}"
            )
        for config in configs:
            missing = [name for name in unset if name not in config.kwargs]
            if missing:
                raise ValueError(
                    f"{self.kernel_name}: config {self._fasta(config).label()} leaves {', '.join(missing)} unset: "
                    f"not passed at launch and not among its kwargs ({', '.join(sorted(config.kwargs)) or 'none'})"
                )

    def _fasta(self, config: triton.Config) -> Config:
        held = self._as_fasta.get(id(config))
        return held[1] if held is not None else to_fasta_config(config)

    def _converted_again(self, config: triton.Config) -> Config:
        """`config` as it is now, kept as its conversion: an `early_config_prune` may have edited it in place,
        and what is timed must be what is launched."""
        fresh = to_fasta_config(config)
        if id(config) in self._as_fasta:
            self._as_fasta[id(config)] = config, fresh
        return fresh

    def _in_stored_order(
        self, key: str, fasta_configs: list[Config], candidates: list[triton.Config]
    ) -> tuple[list[Config], list[triton.Config]]:
        """The configs an `early_config_prune` left, in the order the key's state file holds the same configs in.

        A prune may return its list in an order that changes from process to process (twins dropped through a
        `set`, whose order follows Python's per-process string hashing); the tune is over the list in order, so
        another order would supersede a finished tune and tune again in each new process. A list that differs
        by more than its order is left as it is, a new list (superseded as any edited list is).
        """
        try:
            stored = [config.identity for config in self.store().read(self.store().file_for(key)).configs]
        except (OSError, FastaError):  # none yet, or one the tune itself will set aside or report
            return fasta_configs, candidates
        ours = {f.identity: (f, c) for f, c in zip(fasta_configs, candidates)}
        if stored == list(ours) or len(stored) != len(ours) or set(stored) != ours.keys():
            return fasta_configs, candidates
        return [ours[identity][0] for identity in stored], [ours[identity][1] for identity in stored]

    def warmup(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Compile every config (after pruning) without launching or tuning, as `triton.autotune` does."""
        pruned = self._prune(dict(zip(self.arg_names, args)), kwargs)
        return [self.fn.warmup(*args, **kwargs, **c.all_kwargs()) for c in pruned]

    def prune_configs(self, kwargs: Mapping[str, Any]) -> list[triton.Config]:
        """Triton's own entry point, for code that calls it as Triton's (`kernel.nargs = named; kernel.prune_configs(
        kwargs)`): the positional arguments by name are `self.nargs`."""
        return self._prune(self.nargs or {}, kwargs)

    def _prune(self, positional: Mapping[str, Any], kwargs: Mapping[str, Any]) -> list[triton.Config]:
        """`prune_configs_by` exactly as triton.autotune applies it.

        As there, both callbacks get the positional arguments by name and
        the launch's keyword arguments (`grid` and `warmup` among them), and a
        fractional `top_k` is a share of the configs `early_config_prune`
        left, at least one, as Triton 3.9 takes it (3.6 to 3.8 took it of the
        whole list, and could keep none).
        """
        configs = list(self.configs)
        if self.early_config_prune:
            configs = list(self.early_config_prune(configs, dict(positional), **kwargs))
            if not configs:
                raise ValueError(f"{self.kernel_name}: early_config_prune returned no configs")
        if self.perf_model:
            top_k = self.configs_top_k
            if isinstance(top_k, float) and top_k <= 1.0:
                top_k = max(1, int(len(configs) * top_k))
            elif not isinstance(top_k, int):  # True is 1, as in Triton
                raise TypeError(f"{self.kernel_name}: top_k={top_k!r} must be a float ≤ 1.0 or an int, as in Triton")
            if len(configs) > top_k:
                estimate = {id(c): self.perf_model(**positional, **kwargs, **c.all_kwargs()) for c in configs}
                configs = sorted(configs, key=lambda c: estimate[id(c)])[:top_k]
        return configs

    def _listed(self) -> _Listing:
        """The decorated list's listing, made at decoration and kept while `configs` holds the same
        config objects (a list assigned or edited since gets a new one); a config's kwargs and launch options
        are read once, as its conversion is at decoration (its pre_hook at each tune)."""
        held = tuple(map(id, self.configs))
        if self._decorated is None or self._decorated[0] != held:
            configs = _distinct(self.kernel_name, list(self.configs), decorated=False, as_fasta=self._fasta)
            self._decorated = held, _Listing.of(configs, [self._fasta(c) for c in configs])
        return self._decorated[1]

    def _pruned(self, key: tuple, args: tuple, kwargs: Mapping[str, Any]) -> _Listing:
        """The listing of what `prune_configs_by` leaves for this launch, each config once."""
        candidates = self._prune(dict(zip(self.arg_names, args)), kwargs)
        # a prune that clamps tiles makes twins; one that edits configs in place needs them converted again
        as_fasta = self._converted_again if self.early_config_prune else self._fasta
        candidates = _distinct(self.kernel_name, candidates, decorated=False, as_fasta=as_fasta)
        fasta_configs = [self._fasta(c) for c in candidates]
        if self.early_config_prune:
            fasta_configs, candidates = self._in_stored_order(_key_string(self.kernel_name, key), fasta_configs,
                                                              candidates)
        return _Listing.of(candidates, fasta_configs)

    def _tune(self, key: tuple, args: tuple, kwargs: Mapping[str, Any], nargs: Mapping[str, Any]) -> triton.Config:
        launch_kwargs = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
        listing = self._pruned(key, args, kwargs) if self.early_config_prune or self.perf_model else self._listed()
        if len(listing.configs) == 1:
            return listing.configs[0]
        self._refuse_conflicts(nargs, listing.names)
        self._refuse_incomplete(nargs, listing.configs)
        by_identity = listing.by_identity
        backend = TritonBackend(
            self.fn,
            args,
            kwargs["grid"],
            launch_kwargs,
            reset_to_zero=self.reset_to_zero,
            restore_value=self.restore_value,
            pre_hook=self.user_pre_hook,
            post_hook=self.post_hook,
            # read at each tune, as the launch reads the winner's: Triton's configs may get hooks after decoration
            config_pre_hooks={f.identity: c.pre_hook for f, c in zip(listing.fasta, listing.configs) if c.pre_hook},
            config_kwargs=listing.kwargs,
            do_bench=self._do_bench,
            warmup_ms=self.warmup_ms,
            rep_ms=self.rep_ms,
        )
        pool_workers = 1 if backend.interpreting else shared_pool().workers
        start = time.perf_counter()
        try:
            result = tune(
                _key_string(self.kernel_name, key),
                self.kernel_name,
                listing.fasta,
                backend,
                policy=self.policy,
                policy_params=self.policy_params,
                seed=self.seed,
                store=self.store(),
                chunk_size=max(16, 2 * pool_workers),
            )
        finally:
            backend.cancel_prefetch()
        if not result.reused or key not in self.results:  # a thread that waited and reused keeps the tuner's
            self.results[key] = result
        best = by_identity[result.best_config.identity]
        with _TIMINGS_LOCK:  # Triton's dict, keyed by config, made when read
            self._timings_of = result.state, by_identity
        self._reset({**nargs, **best.all_kwargs()})  # a reuse stands for the tune Triton would run here
        if not result.reused:
            self.bench_time = time.perf_counter() - start
            if _print_autotuning():  # as triton.autotune reports a tune it ran, for whoever greps its words
                print(
                    f"Triton autotuning for function {self.base_fn.__name__},\nwith key as {key},\n"
                    f"finished after {self.bench_time:.2f}s,\nbest config selected: {best};"
                )
        logger.info(
            "%s %s: %s (%.2f us, %s)",
            self.kernel_name,
            key,
            result.best_config.label(),
            result.best_us,
            "reused" if result.reused else "tuned",
        )
        self._tell_listener(key, best, result.reused)
        return best

    def _tell_listener(self, key: tuple, best: triton.Config, reused: bool) -> None:
        """Call `triton.knobs.autotuning.listener` as triton.autotune does after each key it settles: a
        reuse of a done tune is its cache hit (no duration), as a hit on Triton's autotuning disk cache is."""
        listener = getattr(getattr(getattr(triton, "knobs", None), "autotuning", None), "listener", None)
        if listener is None:  # unset, or a Triton without the knob
            return
        listener(
            fn=unwrap_jit(self.fn),
            key=key,
            best_config=best,
            configs_timings=self.configs_timings,
            duration=None if reused else self.bench_time,
            cache_hit=reused,
        )

    def _reset(self, nargs: Mapping[str, Any]) -> None:
        """Undo the tune's launches on outputs that accumulate, as triton.autotune does."""
        if self.user_pre_hook is not None:
            self.user_pre_hook(dict(nargs), reset_only=True)
            return
        zero_args(nargs, self.reset_to_zero)


def _configs_timings(state: TuneState, by_identity: Mapping[str, triton.Config]) -> dict[triton.Config, list[float]]:
    """Triton's `configs_timings` for a tune: each config it timed → [mean, fastest, slowest] of its timings
    in ms (Triton's three values are do_bench's median, 20th and 80th percentiles of its one timing), each
    config that failed → three infinities, as Triton scores one; configs the policy left untried are absent.
    In the order of the config list, so that the first config with the lowest mean is the winner, ties
    included, as the engine breaks them."""
    timings: dict[triton.Config, list[float]] = {}
    for index in sorted(state.durations.keys() | state.failed.keys()):
        samples = state.durations.get(index)
        if samples:
            value = [state.mean_us(index) / 1000.0, min(samples) / 1000.0, max(samples) / 1000.0]
        else:
            value = [float("inf")] * 3
        timings[by_identity[state.configs[index].identity]] = value
    return timings


def _names(kernel: str, what: str, names: Sequence[str], arg_names: Sequence[str]) -> list[str]:
    """`names` as a list of the kernel's argument names; a string that names one argument is that argument
    (Triton reads a string letter by letter, which for a one-letter name, `key="n"`, comes to the same)."""
    if isinstance(names, str):
        if names in arg_names:
            return [names]
        raise TypeError(
            f"fasta_sm.autotune({kernel}): {what} must be a list of argument names, not the string {names!r} "
            "(Triton would read it letter by letter)"
        )
    try:
        names = list(names)  # once: a generator read twice would be empty the second time
    except TypeError:
        raise TypeError(f"fasta_sm.autotune({kernel}): {what} must be a list of argument names, not {names!r}") \
            from None
    unknown = [name if isinstance(name, str) else repr(name) for name in names if name not in arg_names]
    if unknown:  # a key name that is no argument would make the kernel tune once and never again
        raise ValueError(
            f"fasta_sm.autotune({kernel}): {what} names {', '.join(unknown)}, not arguments of the kernel "
            f"({', '.join(arg_names)})"
        )
    return names


def _source_hash(fn: Any) -> str:
    """12 hex digits of the kernel's source text (the jit function under any wrappers) and of the jit
    functions it calls: a helper edited is a new kernel, as it is to Triton's cache, and needs a new tune."""
    kernel, *helpers = _jit_sources(unwrap_jit(fn))
    digest = hashlib.sha256(kernel.encode())
    for source in helpers:
        digest.update(b"\0" + source.encode())
    return digest.hexdigest()[:12]


def _jit_sources(root: Any) -> list[str]:
    """The source of `root` and of every jit function it reaches through names in its module's globals
    or its closure, each followed by the plain values its closure holds: kernels a factory makes differ by those."""
    sources, seen, todo = [], set(), [root]
    while todo:
        jit = todo.pop()
        python = getattr(jit, "fn", jit)
        if id(python) in seen:
            continue
        seen.add(id(python))
        source = getattr(jit, "src", None)
        if source is None:  # the interpreter's wrapper keeps no source
            source, reads = _python_source(python)
        else:
            reads = _reads(str(source))
        captured = _closure(python)
        plain = {name: value for name, value in captured.items() if _plain_value(value)}
        plain.update(_constexpr_globals(python, reads, captured))
        sources.append(str(source) + "".join(f"\0{name}={value!r}" for name, value in sorted(plain.items())))
        todo += reversed([found for found in _named(python, reads, captured) if _is_jit(found)])
    return sources


def _python_source(python: Any) -> tuple[str, list[tuple[str, tuple[str, ...]]]]:
    """A function's source (cached by linecache) and the names it reads; for one made by `exec`, which has
    no source to read, its compiled code and the global names that code reads, so an edit still changes
    the key."""
    try:
        source = inspect.getsource(python)
    except (OSError, TypeError):
        code = getattr(python, "__code__", None)
        if code is None:
            return "", []
        return _code_text(code) + _signature_text(python), [(name, ()) for name in _code_names(code)]
    return source, _reads(source)


def _signature_text(python: Any) -> str:
    """What the source of a `def` line says and its code does not: defaults, argument names and annotations
    (`BLOCK: tl.constexpr`), as text that is the same in every process."""

    def plain(value: Any) -> str:
        if isinstance(value, type):
            return f"{value.__module__}.{value.__qualname__}"
        return repr(value) if _plain_value(value) else type(value).__name__  # a constexpr default by its value

    code = python.__code__
    defaults = tuple(getattr(python, "__defaults__", None) or ())
    kwdefaults = sorted((getattr(python, "__kwdefaults__", None) or {}).items())
    annotations = sorted((getattr(python, "__annotations__", None) or {}).items())
    return (f"|{','.join(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])}"
            f"|{','.join(map(plain, defaults))}|{','.join(k + '=' + plain(v) for k, v in kwdefaults)}"
            f"|{','.join(k + ':' + plain(v) for k, v in annotations)}")


def _code_text(code: types.CodeType) -> str:
    """Bytecode, names and constants of `code` and of the functions it defines, as text that is the same in
    every process: no addresses, and a frozenset's members sorted."""
    consts = []
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            consts.append(_code_text(const))
        elif isinstance(const, frozenset):
            consts.append(repr(sorted(map(repr, const))))
        else:
            consts.append(repr(const))
    return f"{code.co_code.hex()}|{','.join(code.co_names)}|{','.join(consts)}"


def _code_names(code: types.CodeType) -> list[str]:
    """The global and attribute names `code` and the functions it defines read, in order."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _code_names(const)
    return names


def _reads(source: str) -> list[tuple[str, tuple[str, ...]]]:
    """Every name the source reads, with the attributes read off it (`module.helper` is ('module',
    ('helper',))), node by node in `ast.walk`'s order; nothing for source that does not parse.

    One walk of one parse, written out: this runs at a warm start's first launch, where two
    `ast.walk` passes were half of the source hash's millisecond on a matmul kernel.
    """
    try:
        todo = deque([ast.parse(textwrap.dedent(source))])
    except SyntaxError:
        return []
    reads = []
    while todo:
        node = todo.popleft()
        for field in node._fields:
            child = getattr(node, field, None)
            if isinstance(child, ast.AST):
                todo.append(child)
            elif isinstance(child, list):
                todo.extend(item for item in child if isinstance(item, ast.AST))
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            reads.append((node.id, tuple(reversed(chain))))
    return reads


def _closure(python: Any) -> dict[str, Any]:
    try:
        return dict(inspect.getclosurevars(python).nonlocals)
    except (TypeError, ValueError):  # not a Python function, or a cell not yet filled
        return {}


def _plain_value(value: Any) -> bool:
    """A value that specializes a kernel and reads back the same from its repr (`tl.constexpr` holds one,
    or a `tl.dtype`, whose repr names it)."""
    value = getattr(value, "value", value) if type(value).__name__ == "constexpr" else value
    return value is None or isinstance(value, (bool, int, float, str)) or type(value).__name__ == "dtype"


def _constexpr_globals(
    python: Any, reads: list[tuple[str, tuple[str, ...]]], captured: dict[str, Any]
) -> dict[str, Any]:
    """The module-level `tl.constexpr`s the source names (not shadowed by its closure): editing one changes
    the kernel, as it changes Triton's cache key."""
    scope = getattr(python, "__globals__", {})
    names = {name for name, attrs in reads if not attrs} - set(captured)
    return {
        f"global {name}": scope[name]
        for name in names
        if type(scope.get(name)).__name__ == "constexpr" and _plain_value(scope[name])
    }


def _named(python: Any, reads: list[tuple[str, tuple[str, ...]]], captured: dict[str, Any]) -> list[Any]:
    """The objects the source names, looked up in the function's closure and globals: `helper` and
    `module.helper` alike."""
    scope = {**getattr(python, "__globals__", {}), **captured}
    found = []
    for name, attrs in reads:
        if name not in scope:
            continue
        value = scope[name]
        for attr in attrs:
            value = getattr(value, attr, None)
        found.append(value)
    return found


def _is_jit(value: Any) -> bool:
    """A user's jit function: Triton's own (`tl.sum` is one) change only with its version, already in the key."""
    if not (isinstance(value, JITFunction) or type(value).__name__ == "InterpretedFunction"):
        return False
    module = getattr(getattr(value, "fn", value), "__module__", None) or ""
    return module != "triton" and not module.startswith("triton.")


def _cuda_graph_bench(rep_ms: float) -> Callable[..., Any]:
    """Triton's `use_cuda_graph=True`: time each config with `do_bench_cudagraph` over `rep_ms`."""

    def bench(call: Callable[[], Any], quantiles: Sequence[float] | None = None) -> Any:
        from triton.testing import do_bench_cudagraph

        return do_bench_cudagraph(call, rep=rep_ms, quantiles=quantiles)

    return bench


def _print_autotuning() -> bool:
    """Triton's `TRITON_PRINT_AUTOTUNING`, through its knobs where this Triton has them."""
    knobs = getattr(getattr(triton, "knobs", None), "autotuning", None)
    if knobs is not None and hasattr(knobs, "print"):
        return bool(knobs.print)
    return os.environ.get("TRITON_PRINT_AUTOTUNING", "0") == "1"


def _key_string(kernel: str, key: tuple) -> str:
    return kernel + "[" + ", ".join(repr(value) for value in key) + "]"


def autotune(
    configs: Sequence[Any],
    key: Sequence[str],
    prune_configs_by: Mapping[str, Any] | None = None,
    reset_to_zero: Sequence[str] | None = None,
    restore_value: Sequence[str] | None = None,
    pre_hook: Callable[..., Any] | None = None,
    post_hook: Callable[..., Any] | None = None,
    warmup: float | None = None,
    rep: float | None = None,
    use_cuda_graph: bool = False,
    do_bench: Callable[..., Any] | None = None,
    cache_results: bool = False,
    *,
    policy: str | None = "fasta",
    budget: float | None = None,
    seed: int = 0,
    state_dir: str | os.PathLike[str] | None = None,
    policy_params: Mapping[str, Any] | None = None,
) -> Callable[[Any], Autotuner]:
    """Decorate a `@triton.jit` kernel like `triton.autotune`; tune each key durably with `policy`.

    The arguments up to `cache_results` are `triton.autotune`'s, in its
    order. `warmup` and `rep` (ms, Triton's deprecated timing knobs) go to
    `do_bench`, `use_cuda_graph` times with `do_bench_cudagraph` as Triton
    does, and `cache_results` changes nothing: a tune's results are always
    kept, in its state file. `configs` are `triton.Config`s (or fasta_sm
    Configs); `policy` names the policy (None: `fasta`); `budget` is the
    fraction of configs the policy may measure (None: the policy's own
    routing); `state_dir` (a str or a path) holds the state files
    (default: `$FASTA_SM_STATE_DIR` or the user cache dir). The fasta
    policy's `policy_params` start from `LIVE_DEFAULTS` (re-timing sized for
    a tune the user waits on).
    """

    def decorator(fn: Any) -> Autotuner:
        return Autotuner(
            fn,
            configs,
            key,
            prune_configs_by=prune_configs_by,
            reset_to_zero=reset_to_zero,
            restore_value=restore_value,
            pre_hook=pre_hook,
            post_hook=post_hook,
            warmup=warmup,
            rep=rep,
            use_cuda_graph=use_cuda_graph,
            do_bench=do_bench,
            policy=policy,
            budget=budget,
            policy_params=policy_params,
            seed=seed,
            state_dir=state_dir,
        )

    return decorator
