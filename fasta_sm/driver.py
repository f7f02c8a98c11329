"""The tune split between a compile worker and the parent, shared by the Inductor and NPU integrations.

Inductor compiles kernels in subprocess workers and runs them in the parent,
so one kernel's tune is driven in two halves (the original FASTA design):

- the worker opens (or resumes) the tune, lets the policy plan R1 and compiles
  only the current round's configs, checkpointing as it goes;
- the parent, at the kernel's first run, benchmarks that round, refines,
  compiles and benchmarks the R2 batches in-process, and reaches DONE.

`FastaAutotunerMixin` puts this behind `CachingAutotuner`'s own seams
(`precompile`, `benchmark_all_configs`, `run`), so a subclass of Inductor's or
torch_npu's autotuner only names the few calls that differ on its device.
Nothing here imports torch: the mixin calls methods of the autotuner it is
mixed into.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.abc
import importlib.util
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .config import Config, check_config_list
from .errors import ConfigError, FastaError, LockTimeout, TuneFailed
from .machine import DEFAULT_CHUNK, Tune
from .policies import check_arguments, policy_names, with_environment
from .protocols import BenchmarkOutcome, CompileOutcome
from .state import SEED_MAX, TuneState
from .store import StateStore, is_wait
from .tuner import open_tune

log = logging.getLogger("fasta_sm.driver")

WORKER_LOCK_TIMEOUT_S = 10.0
"""A compile worker never waits long for a kernel's lock: if another process is
tuning that kernel, the worker compiles Inductor's own configs and the parent
waits for the lock instead (with the store's usual timeout)."""


def default_policy() -> str:
    """ "fasta" when it is registered, else "random" (with a warning): never a silent change."""
    if "fasta" in policy_names():
        return "fasta"
    log.warning("fasta_sm: policy 'fasta' is not available; falling back to 'random'")
    return "random"


def integration_params(
    policy: str, params: Mapping[str, Any] | None, fasta_defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """An integration's `policy_params`: `params` over its defaults for the fasta policy, as plain literals.

    They travel in generated kernel source or the environment, so a numpy
    number becomes the Python number it holds, and anything whose repr does
    not read back as itself (inf, NaN, objects) is refused, naming it. The
    knobs the environment sets (`with_environment`) are read here, once, in
    the process that sets the integration up: a compile worker started
    earlier may not have them, and both must open the tune with the same
    settings.
    """
    plain = {name: plain_literal(f"policy_params[{name!r}]", value) for name, value in params_mapping(params).items()}
    return with_environment(policy, {**(fasta_defaults if policy == "fasta" else {}), **plain})


def params_mapping(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """An integration's `policy_params` as a dict of its own; a ValueError naming anything that is no mapping (a
    list of pairs, a string), which `dict()` would take or fail on without naming it."""
    if params is not None and not isinstance(params, Mapping):
        raise ValueError(f"policy_params={params!r} must be a mapping of parameter names to values")
    return dict(params or {})


def plain_literal(name: str, value: Any) -> Any:
    """`value` (numpy numbers, also inside lists, tuples and dicts, as the Python numbers they hold, and numpy
    arrays as the lists they hold) if its repr
    reads back as itself; else an error naming `name`: inf, NaN and objects cannot travel in kernel source or a
    state file."""
    value = python_values(value)
    try:
        same = ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError):
        same = False
    if not same:
        raise ValueError(f"{name}={value!r}: must be a plain, finite Python literal")
    return value


def hook_import(module: str, builder: str) -> str:
    """The lines of kernel source that import fasta-sm's hook `module`, passing on ImportError: a kernel that a
    cache keeps outlives fasta-sm's install, and must still load (then `builder` builds it as its own)."""
    return (
        f"try:\n    import {module}  # noqa: F401  fasta-sm's autotuner, also in compile workers\n"
        f"except ImportError:  # fasta-sm uninstalled since this kernel was cached: {builder} builds it\n    pass"
    )


def whole_number(name: str, value: Any, least: int, most: int | None = None) -> int:
    """An integration setting that is written into kernel source: a plain int (numpy's too), at least `least`
    (and at most `most`, where given)."""
    value = python_scalar(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}={value!r} must be a whole number ≥ {least}")
    if most is not None and value > most:
        raise ValueError(f"{name}={value!r} must be a whole number ≤ {most}")
    return value


def seed_setting(seed: Any) -> int:
    """An integration's seed: what a state file can hold, refused where it is set rather than at the first tune."""
    return whole_number("seed", seed, 0, SEED_MAX)


def python_scalar(value: Any) -> Any:
    """A numpy number as the Python number it holds; anything else as it is."""
    return value.item() if hasattr(value, "item") and type(value).__module__ == "numpy" else value


def python_values(value: Any) -> Any:
    """`python_scalar` through lists, tuples and dicts, and a numpy array as the list it holds, as `tune` keeps
    one: `expert_configs=[np.int64(3)]` and `expert_configs=np.array([3])` are the list [3]."""
    if isinstance(value, np.ndarray):  # `item()` would refuse a longer one, and make a number of `np.array([3])`
        return value.tolist()
    if type(value) in (list, tuple):
        return type(value)(python_values(item) for item in value)
    if type(value) is dict:
        return {python_values(key): python_values(item) for key, item in value.items()}
    return python_scalar(value)


@dataclass(frozen=True)
class DriverSettings:
    """What a kernel's tune is run with; travels inside generated kernel source as a dict.

    `max_configs` caps the generated space (Inductor's own configs always stay);
    `state_dir` None means the store's default (resolved where the tune runs);
    `compile_threads` compiles a round's configs in parallel threads (Triton
    releases the GIL in LLVM and ptxas, which is most of a compile); `prior`
    starts a new tune from what the kernel's finished tunes found fast
    (`FASTA_SM_PRIOR`, read where the settings are made, as the knobs are).
    """

    policy: str = "fasta"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    state_dir: str | None = None
    max_configs: int = 64
    chunk_size: int = DEFAULT_CHUNK
    lock_timeout_s: float | None = None
    compile_threads: int = 8
    prior: bool = True

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["policy_params"] = dict(self.policy_params)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DriverSettings:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def checked(self) -> DriverSettings:
        """These settings, if a tune can run with them; else the error naming the first bad one.

        For settings read from where a user may write anything (an environment
        variable), checked once rather than failing kernel after kernel.
        """
        check_arguments(self.policy, self.policy_params)
        seed_setting(self.seed)
        for name, least in (("max_configs", 1), ("chunk_size", 1), ("compile_threads", 1)):
            whole_number(name, getattr(self, name), least)
        if not isinstance(self.prior, bool):
            raise ValueError(f"prior={self.prior!r} must be True or False")
        if self.lock_timeout_s is not None and not is_wait(self.lock_timeout_s):
            raise ValueError(f"lock_timeout_s={self.lock_timeout_s!r} must be a number of seconds ≥ 0")
        StateStore(self.state_dir, self.lock_timeout_s)  # made now if need be, or refused (a file, no permission), once
        return self


@dataclass
class TunePlan:
    """One kernel's tune as the autotuner carries it across the pickle: plain data only."""

    key: str
    kernel: str
    configs: list[Config]
    must: list[int]
    settings: DriverSettings

    def store(self) -> StateStore:
        return StateStore(self.settings.state_dir, self.settings.lock_timeout_s)

    def policy_args(self) -> tuple[str, dict[str, Any]]:
        """The registered policy and its params: the chosen one, wrapped to always measure `must`."""
        inner = self.settings.policy
        params = dict(self.settings.policy_params)
        if not self.must:
            return inner, params
        if inner == "fasta":  # the config optimizer, when on, must keep them too
            params["expert_configs"] = sorted(set(params.get("expert_configs", ())) | set(self.must))
        return "must-measure", {"inner": inner, "must": sorted(self.must), "params": params}


@contextmanager
def _opened(plan: TunePlan, backend: Any, lock_timeout_s: float | None) -> Iterator[Tune | TuneState]:
    """The plan's tune (or its DONE state) under the kernel's lock, held until the block ends."""
    store = plan.store()
    policy, params = plan.policy_args()
    with store.lock(plan.key, plan.kernel, lock_timeout_s):
        opened = open_tune(
            store,
            plan.key,
            plan.kernel,
            plan.configs,
            backend,
            policy=policy,
            policy_params=params,
            seed=plan.settings.seed,
            chunk_size=plan.settings.chunk_size,
            prior=plan.settings.prior,
        )
        try:
            yield opened
        finally:
            if isinstance(opened, Tune):
                opened.close()


def worker_phase(plan: TunePlan, backend: Any) -> TuneState:
    """Open or resume the tune and compile the current round; return the state reached.

    Stops once a round is ready to time (or at DONE): benchmarking needs the
    kernel's real arguments, which only the parent has. A tune killed after
    a round was timed resumes with the refine step, which needs nothing but
    the policy: the worker takes it, and compiles the round it decides.
    """
    with _opened(plan, backend, WORKER_LOCK_TIMEOUT_S) as opened:
        if isinstance(opened, TuneState):
            return opened
        return opened.drive(until=lambda s: s.step == "benchmark")


def parent_phase(plan: TunePlan, backend: Any) -> TuneState:
    """Drive the tune to DONE from wherever it stands (reusing a DONE state as is)."""
    with _opened(plan, backend, plan.settings.lock_timeout_s) as opened:
        state = opened if isinstance(opened, TuneState) else opened.drive()
        assert state.done
        return state


def wanted_after_worker(state: TuneState) -> list[int]:
    """Configs the parent will launch first: the round being benchmarked, or the winner."""
    if state.done:
        return [state.best] if state.best is not None else []
    return state.ready_to_time()


# --------------------------------------------------------------------------- autotuner side


_LAUNCH_OPTIONS = ("num_ctas", "maxnreg", "ir_override")


def to_fasta_config(config: Any) -> Config:
    """A `triton.Config` (Inductor's and torch_npu's are ones) as a fasta_sm Config: kwargs, warps, stages and
    the launch options set to other than Triton's defaults, all part of what a config is."""
    if isinstance(config, Config):
        return config
    options = {}
    for name in _LAUNCH_OPTIONS:
        value = getattr(config, name, None)
        if value is not None and not (name == "num_ctas" and value == 1):
            options[name] = value
    kwargs = {name: _sequence_as_text(config, name, value) for name, value in config.kwargs.items()}
    return Config(kwargs, num_warps=_whole(config.num_warps), num_stages=_whole(config.num_stages),
                  options=options)


def _sequence_as_text(config: Any, name: str, value: Any) -> Any:
    """A tuple or list kwarg as its repr, which keys it exactly and which the features skip as a string;
    anything else as it is. torch_npu sets `split_axis` and `split_blocks` as tuples on every config
    (`_triton_config_npu_index_legacy`), and only the autotuner's own config is compiled, never this one.
    Any other value (a `tl.dtype`, or a sequence holding one) is refused here, naming it and what a value
    may be: Config, which also reads replay tables, names only the scalars, and tuples are taken here."""
    if _plain_sequence(value):
        return repr(value)
    if isinstance(value, (tuple, list)):
        item = _first_unplain(value)
        held = f" holds {item!r} of type {type(item).__name__}"
    elif isinstance(value, (int, float, str)):  # bool is an int; Config checks the range of each
        return value
    else:
        held = f" has type {type(value).__name__}"
    raise ConfigError(
        f"config {dict(config.kwargs)!r}: {name}={value!r}{held}; "
        "config values must be int, float, bool or str, or tuples and lists of them"
    )


def _first_unplain(value: tuple | list) -> Any:
    """The first item, depth first, of a sequence that `_plain_sequence` refuses, that is neither a plain
    scalar nor a sequence."""
    for item in value:
        if isinstance(item, (tuple, list)):
            if not _plain_sequence(item):
                return _first_unplain(item)
        elif type(item) not in (int, float, bool, str):
            return item
    return value  # not reached: a sequence `_plain_sequence` refuses holds such an item


def _plain_sequence(value: Any) -> bool:
    """A tuple or list of ints, floats, bools, strs or such sequences: one whose repr is the same in every process."""
    return isinstance(value, (tuple, list)) and all(
        type(item) in (int, float, bool, str) or _plain_sequence(item) for item in value
    )


def _whole(value: Any) -> Any:
    """A launch option that is a whole number (4, 4.0, numpy's 4) as an int; anything else as it is, for Config
    to refuse by name."""
    try:
        whole = int(value)
    except (TypeError, ValueError, OverflowError):
        return value
    return whole if whole == value and not isinstance(value, bool) else value


CACHE_ONLY_META = {
    "'force_disable_caches': True": "'force_disable_caches': False",
    "'autotune_local_cache': False": "'autotune_local_cache': True",
    "'autotune_remote_cache': True": "'autotune_remote_cache': None",
    "'autotune_remote_cache': False": "'autotune_remote_cache': None",
}
"""inductor_meta entries Inductor writes into a kernel's source that change which of its caches it reads, not the
kernel or its configs: each as it is written when set, and as when unset (the default, so keys made without them
stay as they were). `autotune_remote_cache` is a tristate, None by default (`TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE`
unset) and True or False when set."""


def as_tuned(source: str) -> str:
    """`source` as its tune is keyed: with the cache switches of `CACHE_ONLY_META` as when unset, so that
    `TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`, `TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE=0` or `=1` and
    `autotune_local_cache=False` (which Inductor writes into every kernel's inductor_meta) find the kernel's tune
    rather than starting another."""
    for written, unset in CACHE_ONLY_META.items():
        source = source.replace(written, unset)
    return source


class AutotunerBackend:
    """The Backend protocol over one autotuner's own compile and benchmark calls.

    Compiles go through the autotuner's `_fasta_compile` (Inductor:
    `_precompile_config`); timings through `_fasta_bench` (Inductor: `bench`,
    milliseconds), with the arguments of the run that triggered the tune.
    """

    def __init__(self, autotuner: FastaAutotunerMixin, args: tuple = (), kwargs: Mapping[str, Any] | None = None):
        self.autotuner = autotuner
        self.args = args
        self.kwargs = dict(kwargs or {})

    def describe(self) -> str:
        return self.autotuner._fasta_describe()

    def compile(self, configs: Sequence[Config]) -> list[CompileOutcome]:
        indices = [self.autotuner._fasta_index(config) for config in configs]
        done = self.autotuner._fasta_compile_all(indices)
        return [CompileOutcome(error=done[i][0], seconds=done[i][1]) for i in indices]

    def benchmark(self, configs: Sequence[Config], repeat: Sequence[int] | None = None) -> BenchmarkOutcome:
        started = time.perf_counter()
        durations: list[float] = []
        errors: dict[int, str] = {}
        for position, config in enumerate(configs):
            index = self.autotuner._fasta_index(config)
            try:
                launcher = self.autotuner._fasta_launcher(index)
                ms = float(self.autotuner._fasta_bench(launcher, *self.args, **self.kwargs))
            except Exception as exc:  # noqa: BLE001  a config that cannot run is a failed config
                durations.append(math.inf)
                errors[position] = f"{type(exc).__name__}: {exc}"
                continue
            if not math.isfinite(ms) or ms <= 0:
                durations.append(math.inf)
                errors[position] = self.autotuner._fasta_failure_reason(launcher)
            else:
                durations.append(ms * 1000.0)
        return BenchmarkOutcome(durations_us=durations, seconds=time.perf_counter() - started, errors=errors)


class FastaAutotunerMixin:
    """Durable FASTA tuning behind `CachingAutotuner`'s seams; mix in before the autotuner class.

    Subclasses call `_fasta_setup(settings, must, prefix)` at the end of
    `__init__` (no settings, or a single config, leaves the base class's
    behaviour untouched) and may override the `_fasta_*` device seams.
    """

    _fasta_plan: TunePlan | None = None
    _fasta_space: tuple[Any, ...] | list[Any] = ()
    _fasta_finished: bool = False
    _fasta_keep_configs: bool = False
    """Whether `configs` must stay set once compiled (torch_npu builds its candidate plan from it)."""
    _fasta_core_names: tuple[str, str] = ("sm", "SMs")
    """What the device's `multi_processor_count` counts, in the key and in words."""
    _fasta_base_name: str = "Inductor"
    """Whose configs the kernel falls back to, in the warning that says so."""

    def _fasta_turned_off(self) -> bool:
        """Whether this process turned the integration off after the kernel was built (in a compile worker
        that never heard of it): the tune is then left, and the kernel tuned as the base class tunes it."""
        return False

    def _fasta_setup(self, settings: Mapping[str, Any] | None, must: Sequence[int], prefix: str) -> None:
        self._fasta_space = list(self.configs or ())
        self._fasta_finished = False
        self._fasta_plan = None
        if settings is None or len(self._fasta_space) < 2:
            return
        name = self.inductor_meta.get("kernel_name") or self.fn.__name__
        try:
            configs = check_config_list(name, [to_fasta_config(c) for c in self._fasta_space])
            self._fasta_plan = TunePlan(
                key=self._fasta_key(prefix, name),
                kernel=name,
                configs=configs,
                must=sorted(set(must)),
                settings=DriverSettings.from_dict(settings),
            )
        except Exception as exc:  # noqa: BLE001  a kernel fasta-sm cannot key or convert is left to the base
            log.warning("fasta_sm: kernel %s not tuned: %s: %s", name, type(exc).__name__, exc)

    # --- device seams (Inductor defaults; torch_npu overrides what differs) ---

    def _fasta_key(self, prefix: str, name: str) -> str:
        """Kernel source hash, device and Triton version: what a timing depends on."""
        import triton

        props = self.device_props
        short, _ = self._fasta_core_names
        return (
            f"{prefix}/{name}/{self._fasta_kernel_hash()}/{props.type}-cc{props.cc}-{short}{self._fasta_cores()}"
            f"/triton-{triton.__version__}"
        )

    def _fasta_cores(self) -> int:
        """The cores the kernel runs on, as its key and backend name count them: the device's."""
        return self.device_props.multi_processor_count

    def _fasta_kernel_hash(self) -> str:
        """What names the kernel's code in its key: a hash of its source file as the codegen wrote it, without
        what fasta-sm's patch added (`_fasta_generated`) and with the cache switches as when unset (`as_tuned`),
        so neither makes the same kernel a new tune; the base class's hash when there is no file."""
        try:
            source = Path(self.filename).read_text(encoding="utf-8")
        except (TypeError, OSError, UnicodeDecodeError):  # no file (built by hand)
            return self.kernel_hash
        return hashlib.sha256(as_tuned(self._fasta_generated(source)).encode()).hexdigest()[:32]

    def _fasta_generated(self, source: str) -> str:
        """`source` as the device's codegen wrote it, before fasta-sm's patch added to it."""
        return source

    def _fasta_describe(self) -> str:
        """How this tune measures: the device and the Triton that compiles (tunes measured alike lead the prior)."""
        import triton

        props = self.device_props
        _, long = self._fasta_core_names
        return (
            f"{type(self).__name__} on {props.type} cc{props.cc} ({self._fasta_cores()} {long}), "
            f"triton {triton.__version__}"
        )

    def _fasta_device_guard(self) -> Any:
        from torch._dynamo.device_interface import DeviceGuard

        return DeviceGuard(self.get_device_interface(), self.triton_meta["device"])

    def _fasta_compile(self, cfg: Any) -> Any:
        """Compile one config into a compile result (needs the live kernel function; may run in a thread)."""
        return self._precompile_config(cfg)

    def _fasta_make_launcher(self, result: Any) -> Any:
        return result.make_launcher()

    def _fasta_bench(self, launcher: Any, *args: Any, **kwargs: Any) -> float:
        """One config's timing in milliseconds (inf if it cannot run)."""
        return self.bench(launcher, *args, **kwargs)

    def _fasta_failure_reason(self, launcher: Any) -> str:
        reason = getattr(self, "benchmark_failure_reasons", {}).get(launcher)
        return f"failed at run time ({getattr(reason, 'name', reason) or 'invalid config'})"

    # --- bookkeeping ---

    def _fasta_index(self, config: Config) -> int:
        if not hasattr(self, "_fasta_positions"):
            self._fasta_positions = {c.identity: i for i, c in enumerate(self._fasta_plan.configs)}
        return self._fasta_positions[config.identity]

    def _fasta_index_of(self, cfg: Any) -> int | None:
        if self._fasta_plan is None:
            return None
        try:
            return self._fasta_index(to_fasta_config(cfg))
        except (KeyError, FastaError):
            return None

    def _fasta_result(self, index: int) -> Any | None:
        for result in self.compile_results or ():
            if self._fasta_index_of(result.config) == index:
                return result
        return None

    def _fasta_ensure_compiled(self, index: int) -> str | None:
        """Compile config `index` in this process unless already done; the error text if it fails."""
        return self._fasta_compile_all([index])[index][0]

    def _fasta_compile_all(self, indices: Sequence[int]) -> dict[int, tuple[str | None, float]]:
        """Compile the configs not compiled yet, in parallel threads: (error or None, seconds) per index.

        The first compiles alone in the calling thread, so that whatever the
        autotuner sets up lazily on its first compile (Triton's driver, its
        per-device caches) is set up once. The threads only compile; results
        are added to `compile_results` here, in order, so no two threads ever
        write the autotuner.
        """
        todo = [i for i in dict.fromkeys(indices) if self._fasta_result(i) is None]
        if todo and getattr(self.fn, "fn", None) is None:
            self.fn = self._reload_kernel().fn

        def compile_one(index: int) -> tuple[Any, str | None, float]:
            started = time.perf_counter()
            try:
                result = self._fasta_compile(self._fasta_space[index])
            except Exception as exc:  # noqa: BLE001  a config that fails to compile is a failed config
                return None, f"{type(exc).__name__}: {exc}", time.perf_counter() - started
            return result, None, time.perf_counter() - started

        threads = max(1, min(len(todo) - 1, self._fasta_plan.settings.compile_threads if self._fasta_plan else 1))
        compiled = [compile_one(index) for index in todo[:1]]  # first alone: lazy driver and cache set-up happen here
        if threads > 1:
            with ThreadPoolExecutor(threads, thread_name_prefix="fasta-compile") as pool:
                compiled += list(pool.map(compile_one, todo[1:]))
        else:
            compiled += [compile_one(index) for index in todo[1:]]
        outcomes = {index: (None, 0.0) for index in indices}
        for index, (result, error, seconds) in zip(todo, compiled):
            outcomes[index] = (error, seconds)
            if result is not None:
                self.compile_results = [*(self.compile_results or ()), result]
        return outcomes

    def _fasta_launcher(self, index: int) -> Any:
        for launcher in self.launchers:
            if self._fasta_index_of(launcher.config) == index:
                return launcher
        error = self._fasta_ensure_compiled(index)
        if error is not None:
            raise FastaError(error)
        with self._fasta_device_guard():
            launcher = self._fasta_make_launcher(self._fasta_result(index))
        self.launchers = [*self.launchers, launcher]
        return launcher

    def _fasta_give_up(self, why: BaseException) -> list[int]:
        """Behave as the base autotuner from now on, over its own configs (Inductor's or torch_npu's)."""
        log.warning(
            "fasta_sm: kernel %s: %s: %s; using %s's own configs",
            self._fasta_plan.kernel if self._fasta_plan else "?",
            type(why).__name__,
            why,
            self._fasta_base_name,
        )
        must = self._fasta_plan.must if self._fasta_plan else []
        self._fasta_plan = None
        # The base's pick over its own configs is no winner of the tuned space, under whose hash its autotune cache
        # would keep it: every later run would read it back and never tune the kernel again.
        self.save_cache_hook = None
        return must

    # --- the seams of CachingAutotuner ---

    def precompile(
        self, warm_cache_only: bool = False, reload_kernel: Callable | None = None, *args: Any, **kwargs: Any
    ):
        if self._fasta_plan is not None and not self.compile_results and not self.launchers:
            self._fasta_worker()
        return super().precompile(warm_cache_only, reload_kernel, *args, **kwargs)

    def _fasta_worker(self) -> None:
        plan = self._fasta_plan
        failed: set[int] = set()
        try:
            state = worker_phase(plan, AutotunerBackend(self))
            wanted, failed = wanted_after_worker(state), set(state.failed)
        except LockTimeout:
            log.info("fasta_sm: kernel %s is being tuned by another process; its parent will wait for it", plan.kernel)
            # the base's own configs; with none (a torch_npu kernel without `from_expert` configs), the first, so
            # that the parent has a compiled kernel to start from rather than a tune given up as if nothing compiled
            wanted = list(plan.must) or [0]
        except Exception as exc:  # noqa: BLE001  never let tuning break a compile
            wanted = self._fasta_give_up(exc)
            self.configs = [self._fasta_space[i] for i in wanted] or list(self._fasta_space)
            self.compile_results = []  # what R1 compiled before it gave up is not Inductor's list: the base compiles
            return
        for index in wanted:
            if index not in failed and self._fasta_ensure_compiled(index) is not None:
                failed.add(index)  # a config seen to fail would only fail again
        if not self.compile_results:  # the round compiled nothing: let the parent start from the defaults
            for index in plan.must:
                if index not in failed and self._fasta_ensure_compiled(index) is not None:
                    failed.add(index)
        if not self.compile_results:  # nothing compiles: Inductor's own configs, and its own error if they fail
            own = self._fasta_give_up(TuneFailed(f"none of the {len(failed)} configs tried compiled"))
            self.configs = [self._fasta_space[i] for i in own] or list(self._fasta_space)
        elif self._fasta_keep_configs:
            self.configs = [result.config for result in self.compile_results]
        else:
            self.configs = None

    def recheck_autotune_cache(self, reload_kernel_from_src: Callable[[], Any]) -> None:
        """An FX-graph-cache hit's check of the autotune cache, against the whole tuned space.

        Inductor rechecks against the configs this autotuner had compiled when
        it was cached (a tuned kernel's first round), but wrote the winner
        under the hash of the space it was built with: the check would always
        miss, and every warm process would build the round's launchers and
        read the tune again. A hit keeps the winner alone and ends the tune.
        """
        if self._fasta_plan is None:
            return super().recheck_autotune_cache(reload_kernel_from_src)
        from torch._inductor.runtime.triton_heuristics import check_autotune_cache, triton_config_to_hashable

        cached, _, self.autotune_cache_info = check_autotune_cache(
            list(self._fasta_space), self.filename, self.inductor_meta
        )
        if len(cached) != 1:
            return None
        best = cached[0]
        wanted = triton_config_to_hashable(best)
        kept = [r for r in self.compile_results or () if triton_config_to_hashable(r.config) == wanted][:1]
        if not kept:  # compiled later in the tune, or found by coordinate descent: compile it now
            if getattr(self.fn, "fn", None) is None:
                self.fn = reload_kernel_from_src().fn
            kept = [self._precompile_config(best)]
        kept[0].config.found_by_coordesc = getattr(best, "found_by_coordesc", False)
        self.compile_results = kept
        self._fasta_finished = True
        return None

    def _dynamic_scale_rblock(self) -> None:
        """Off for tuned kernels: the space already spans R0_BLOCK, and its extra compile
        would add a config outside the tune."""
        if self._fasta_plan is None:
            return super()._dynamic_scale_rblock()
        return None

    def run(self, *args: Any, stream: Any, benchmark_run: bool = False, **kwargs: Any):
        if self._fasta_plan is not None and not self._fasta_finished and not getattr(self, "triton_interpret", False):
            if not self.launchers:
                self.precompile()
            if len(self.launchers) == 1:
                # One launcher means the base would skip autotuning; the tune still has to finish.
                self.autotune_to_one_config(*args, **kwargs)
        return super().run(*args, stream=stream, benchmark_run=benchmark_run, **kwargs)

    def benchmark_all_configs(self, *args: Any, **kwargs: Any):
        if self._fasta_plan is None or self._fasta_finished:
            return super().benchmark_all_configs(*args, **kwargs)
        plan = self._fasta_plan
        backend = AutotunerBackend(self, args, kwargs)
        try:
            if self._fasta_turned_off():
                raise FastaError("fasta-sm was disabled in this process")
            state = parent_phase(plan, backend)
            if state.best is None:
                raise FastaError(f"no config ran ({state.stop_reason or 'every config tried failed'})")
            winner = self._fasta_launcher(state.best)
        except Exception as exc:  # noqa: BLE001  never let tuning break a run: Inductor's configs instead
            own = []
            for index in plan.must:  # while the plan still maps configs to launchers
                try:
                    own.append(self._fasta_launcher(index))
                except Exception as why:  # noqa: BLE001  the base benchmarks whatever launchers exist
                    log.info("fasta_sm: Inductor config #%d unavailable: %s", index, why)
            self._fasta_give_up(exc)
            if own:
                dropped = [launcher for launcher in self.launchers if not any(launcher is o for o in own)]
                self.launchers = own
                self._fasta_close(dropped, plan.kernel)
            return super().benchmark_all_configs(*args, **kwargs)
        self._fasta_finished = True
        means = {i: state.mean_us(i) / 1000.0 for i in state.durations}
        timings: dict[Any, float] = {}
        ranked = sorted(
            self.launchers,
            key=lambda launcher: (
                means.get(self._fasta_index_of(launcher.config), math.inf),
                self._fasta_index_of(launcher.config) or 0,
            ),
        )
        timings[winner] = means[state.best]
        for launcher in ranked:
            index = self._fasta_index_of(launcher.config)
            if launcher is not winner and (index in means or index in state.failed):
                # a config the tune never tried is left out rather than given inf, which Inductor reads
                # as a failure ("Skipped 120/150 configs (unknown)")
                timings[launcher] = means.get(index, math.inf)
        # every launcher stays listed: torch closes all but the winner's, the untried among them
        self.launchers = [*timings, *(launcher for launcher in ranked if launcher not in timings)]
        coordesc = getattr(self, "coordesc_tuner", None)
        for launcher, ms in timings.items():
            if coordesc is not None and math.isfinite(ms):
                coordesc.cache_benchmark_result(launcher.config, ms)
        if hasattr(self, "reset_to_zero_args"):
            self.reset_to_zero_args(*args, **kwargs)
        log.info(
            "fasta_sm: kernel %s: %s (%d of %d configs measured, %s)",
            plan.kernel,
            state.configs[state.best].label(),
            state.measured_count(),
            state.n_configs,
            state.stop_reason,
        )
        return timings

    def _fasta_close(self, launchers: list[Any], kernel: str) -> None:
        """Unload the modules of launchers taken out of `launchers`: torch closes, after a tune, those still
        listed but the winner's (where it has `_close_static_launcher`), so one dropped would stay loaded."""
        close = getattr(self, "_close_static_launcher", None)
        if close is not None:
            for launcher in launchers:
                try:
                    close(launcher)
                except Exception as why:  # noqa: BLE001  a module left loaded must not break the run it serves
                    log.warning(
                        "fasta_sm: kernel %s: a dropped launcher (%s) stays loaded: %s", kernel, launcher.config, why
                    )


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after one module is first imported (then leaves sys.meta_path)."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            load(module)
            self.callback()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def call_after_import(name: str, callback: Callable[[], None]) -> None:
    """`callback()` now if module `name` is loaded, else right after its first import.

    Used by the `torch.backends` entry points, which run inside `import torch`
    where importing Inductor (or torch_npu) eagerly would be premature.
    """
    if name in sys.modules:
        callback()
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))


def cancel_after_import(name: str) -> None:
    """Forget a `call_after_import(name, ...)` still waiting for module `name` (a no-op once it ran)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, _AfterImport) and f.name == name)]
