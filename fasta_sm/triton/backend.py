"""The live Triton backend: compile configs of one launch in parallel, time them on the device.

It implements `fasta_sm.protocols.Backend` for one concrete launch (a kernel,
its arguments and grid). Compilation goes through the worker pool of
`compile_pool`, which also compiles the configs the policy predicts fastest
while the parent compiles and times the current batch (`prefetch`); timing
goes through `triton.testing.do_bench` medians on a GPU, or a host clock
under `TRITON_INTERPRET=1` (the interpreter has no device driver, so
`do_bench` cannot run there). Arguments the kernel mutates are zeroed or
restored around every launch, as Triton's `reset_to_zero` and
`restore_value` do, so each config is timed on the same inputs.
"""

from __future__ import annotations

import functools
import logging
import pickle
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..config import Config
from ..errors import BackendError, add_note
from ..protocols import BenchmarkOutcome, CompileOutcome
from .compile_pool import LOCAL_THREADS, CompilePool, shared_pool
from .fork_server import interpreting
from .prefetch import Prefetcher
from .worker import (
    CompileJob,
    TensorArg,
    config_failures,
    describe_error,
    kernel_key,
    kernel_path,
    module_root,
    resolve,
    triton_cache_dir,
    tuning_triton_key,
    unwrap_jit,
)

logger = logging.getLogger("fasta_sm.triton.backend")

Grid = tuple | Callable[[Mapping[str, Any]], tuple]


def zero_args(nargs: Mapping[str, Any], names: Sequence[str]) -> None:
    """Zero the named tensors (`reset_to_zero`): outputs a launch accumulates into start from nothing."""
    for name in names:
        if nargs.get(name) is not None:
            nargs[name].zero_()


def saved_args(nargs: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """Copies of the named tensors (`restore_value`), for `restore_args` to put back after a launch."""
    return {name: nargs[name].clone() for name in names if nargs.get(name) is not None}


def restore_args(nargs: Mapping[str, Any], saved: Mapping[str, Any]) -> None:
    for name, value in saved.items():
        nargs[name].copy_(value)


WARMUP_MS = 25.0
REP_MS = 100.0
"""`do_bench`'s warm-up and repetition times per config unless a tune sets them: Triton's defaults."""


def device_name() -> str:
    """The current device's name (part of every tuning key and table)."""
    import torch

    if torch.cuda.is_available() and not interpreting():
        return _cuda_name(torch.cuda.current_device())
    return "cpu (triton interpreter)"


@functools.cache
def _cuda_name(index: int) -> str:
    import torch

    return torch.cuda.get_device_name(index)


def host_bench(call: Callable[[], Any], rep_ms: float, min_runs: int = 3, max_runs: int = 100) -> float:
    """Median wall time of `call` in ms, by host clock: the interpreter's only clock."""
    call()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or ((time.perf_counter() - start) * 1e3 < rep_ms and len(times) < max_runs):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _first(value: Any, source: str) -> float:
    """do_bench returns a float or a sequence (quantiles: a list, an array, a tensor); the median comes first.
    Anything else is the `source`'s fault, said so: `float()`'s own error names neither it nor what it should have
    returned."""
    try:
        first = value[0] if getattr(value, "ndim", 1) >= 1 and hasattr(value, "__getitem__") else value
        if isinstance(first, (bool, str, bytes)):
            raise TypeError
        return float(first)
    except (TypeError, ValueError, LookupError, RuntimeError):
        raise BackendError(f"{source} returned {value!r:.80}, not a time in ms (a number, or a list whose first "
                           "item is one)") from None


class TritonBackend:
    """Compiles and times configs of one kernel launch (`fn[grid](*args, **kwargs, **config)`).

    `fn` is the `triton.jit` function or a wrapper of it (`triton.heuristics`),
    launched as given; only a bare jit function is compiled in the worker pool,
    since a wrapper may add arguments the workers would not see.
    `pre_hook`/`post_hook`, when given, replace the default reset (zeroing
    `reset_to_zero`) and restore as in `triton.autotune`; `restore_value`
    arguments are saved either way, so a user `pre_hook` without a
    `post_hook` still has them put back, where Triton puts back nothing.
    `config_kwargs` maps a config's identity to the kwargs of the Triton config it
    stands for, where they differ from its own (a tuple kwarg, which a fasta
    config holds as its repr): hooks and launches get those, as Triton's do.
    """

    def __init__(
        self,
        fn: Any,
        args: Sequence[Any],
        grid: Grid,
        kwargs: Mapping[str, Any] | None = None,
        *,
        reset_to_zero: Sequence[str] = (),
        restore_value: Sequence[str] = (),
        pre_hook: Callable[..., Any] | None = None,
        post_hook: Callable[..., Any] | None = None,
        config_pre_hooks: Mapping[str, Callable[..., Any]] | None = None,
        config_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        do_bench: Callable[..., Any] | None = None,
        warmup_ms: float = WARMUP_MS,
        rep_ms: float = REP_MS,
        pool: CompilePool | None = None,
        failures: tuple[type[BaseException], ...] | None = None,
    ) -> None:
        self.launcher = fn
        self.fn = unwrap_jit(fn)
        self.args = tuple(args)
        self.grid = grid
        self.kwargs = dict(kwargs or {})
        self.reset_to_zero = list(reset_to_zero)
        self.restore_value = list(restore_value)
        self.pre_hook = pre_hook
        self.post_hook = post_hook
        self.config_pre_hooks = dict(config_pre_hooks or {})
        self.config_kwargs = dict(config_kwargs or {})
        self.failures = failures
        self.user_do_bench = do_bench
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms
        self._pool = pool
        self._prefetcher: Prefetcher | None = None
        self.interpreting = interpreting(self.fn)
        self.arg_names = list(getattr(self.fn, "arg_names", []))

    # ------------------------------------------------------------------ protocol

    def describe(self) -> str:
        import triton

        where = "interpreter, host clock" if self.interpreting else "do_bench median"
        return f"triton {triton.__version__} live on {device_name()} ({where})"

    def compile(self, configs: Sequence[Config]) -> list[CompileOutcome]:
        """Compile each config: in the worker pool when the kernel is importable by path (and in
        this process too while the pool starts), else in this process alone."""
        if self.interpreting:
            return [CompileOutcome(error=None, seconds=0.0) for _ in configs]
        jobs = self._jobs(configs)
        if jobs is None:
            outcomes = dict(enumerate(self._compile_here(configs)))
        else:
            outcomes = self._compile_in_pool(configs, jobs, first=False)
        outcomes = self._hooked_failures_deferred(configs, outcomes)
        return [outcomes[position] for position in range(len(configs))]

    def compile_first(self, configs: Sequence[Config]) -> dict[int, CompileOutcome]:
        """Outcomes by position, back as soon as any config is compiled, with every one done by then.

        The others compile on in their workers, kept as started guesses that
        the next call collects, so the machine times what is ready while the
        rest compile. A kernel compiled in this process alone is compiled
        whole, as by `compile`.
        """
        if self.interpreting:
            return dict(enumerate(self.compile(configs)))
        jobs = self._jobs(configs)
        if jobs is None:
            outcomes = dict(enumerate(self._compile_here(configs)))
        else:
            outcomes = self._compile_in_pool(configs, jobs, first=True)
        return self._hooked_failures_deferred(configs, outcomes)

    def _hooked_failures_deferred(
        self, configs: Sequence[Config], outcomes: dict[int, CompileOutcome]
    ) -> dict[int, CompileOutcome]:
        """A config that failed to compile is left to its first timed launch when a user hook runs around it.

        Compiling ahead runs no hook, but a pre-hook (the config's own, or the
        tune's `pre_hook`) may set what the kernel is specialized on: a TMA
        descriptor's block shape, which Triton's tutorials set in a config
        `pre_hook` from a `[1, 1]` placeholder. Triton compiles inside the timed
        call, after the pre-hooks, so there the config compiles as launched, and
        a compile that fails is told to the `post_hook`. Here the timed launch
        compiles it the same way, and fails the config, the `post_hook` told,
        if it fails then.
        """
        for position, outcome in outcomes.items():
            hooked = (self.pre_hook is not None or self.post_hook is not None
                      or configs[position].identity in self.config_pre_hooks)
            if outcome.error is not None and hooked:
                logger.debug("%s: compiled ahead without its hooks: %s; left to its timed launch",
                             configs[position].label(), outcome.error)
                outcomes[position] = CompileOutcome(error=None, seconds=outcome.seconds)
        return outcomes

    def _compile_in_pool(
        self, configs: Sequence[Config], jobs: list[CompileJob], first: bool
    ) -> dict[int, CompileOutcome]:
        """Through the pool (threads here while it starts), guesses taken over; loaded here as each ends."""
        guesses = [self.prefetcher.take(config.identity) for config in configs]
        started = {position: future for position, future in enumerate(guesses) if future is not None}
        outcomes: dict[int, CompileOutcome] = {}
        load_here = self._loader_for_threads()

        def compile_here(position: int) -> tuple[str | None, float]:
            outcomes[position] = load_here(configs[position])
            return outcomes[position].error, outcomes[position].seconds

        def compiling_on(position: int, future: Future) -> None:
            self.prefetcher.adopt(configs[position].identity, future)

        detach = compiling_on if first else None
        for index, error, seconds in self.pool.run(jobs, started, in_process=compile_here, detach=detach):
            self.prefetcher.release()
            if index in outcomes:  # compiled and loaded here already
                continue
            if error is not None:
                outcomes[index] = CompileOutcome(error=error, seconds=seconds)
            else:
                outcomes[index] = self._load(configs[index], seconds)
        return outcomes

    def _compile_here(self, configs: Sequence[Config]) -> list[CompileOutcome]:
        """Compile in threads of this process, for a kernel the workers cannot import.

        Triton releases the GIL in LLVM and ptxas, so eight threads overlap
        most of a batch's compiles, where one at a time would not.
        """
        threads = min(LOCAL_THREADS[1], len(configs))
        if threads <= 1:
            return [self._load(config, 0.0) for config in configs]
        with ThreadPoolExecutor(threads, thread_name_prefix="fasta-compile") as executor:
            return list(executor.map(self._loader_for_threads(), configs))

    def _loader_for_threads(self) -> Callable[[Config], CompileOutcome]:
        """`_load` for a thread of this process: on the caller's device, which is per thread."""
        device = self._current_device()

        def load(config: Config) -> CompileOutcome:
            if device is not None:
                from triton.runtime import driver

                driver.active.set_current_device(device)
            return self._load(config, 0.0)

        return load

    def _current_device(self) -> int | None:
        """The caller's device, with the kernel's per-device cache created here, before any compile thread.

        Triton creates that cache on first use, unguarded: threads racing to
        create it would each keep their own, and the launch would find neither.
        None when there is no driver to ask (the threads then use their default).
        """
        try:
            from triton.runtime import driver

            device = driver.active.get_current_device()
            caches = getattr(self.fn, "device_caches", None)
            if caches is not None:
                caches[device]
            return device
        except Exception as error:  # noqa: BLE001  no driver: compiles report their own errors
            logger.debug("no current device: %s", describe_error(error))
            return None

    def cancel_prefetch(self) -> None:
        """Start no more guesses and drop those not yet running (a tune that ended needs none)."""
        if self._prefetcher is not None:
            self._prefetcher.cancel()

    def prefetch(self, configs: Sequence[Config], reserve: int = 0, certain: int = 0) -> None:
        """Compile configs ahead (best first) in workers the current batch leaves idle.

        The machine calls this as a batch starts compiling (`reserve`: the
        chunk's size; the first `certain` configs: the rest of the batch) and
        again while the batch is timed; see `prefetch.Prefetcher`. A pool of
        one or two workers gets no guesses.
        """
        if self.interpreting or self.pool.workers <= 2:
            return
        jobs = self._jobs(configs)
        if jobs:
            self.prefetcher.offer([(c.identity, job) for c, job in zip(configs, jobs)], reserve, certain)

    @property
    def prefetcher(self) -> Prefetcher:
        """Guesses for the current pool (a replaced shared pool starts a new list)."""
        if self._prefetcher is None or self._prefetcher.pool is not self.pool:
            self._prefetcher = Prefetcher(self.pool)
        return self._prefetcher

    def benchmark(self, configs: Sequence[Config], repeat: Sequence[int] | None = None) -> BenchmarkOutcome:
        """Time each config (median, µs); one that raises a config failure (`config_failures`) is recorded
        as failed (inf), any other error stops the tune, noted with the config it was timing.

        `repeat` (how often each config was timed before) only matters to
        replay; a live timing is always a fresh one.
        """
        start = time.perf_counter()
        durations: list[float] = []
        errors: dict[int, str] = {}
        failures = self._failures()
        for position, config in enumerate(configs):
            try:
                ms = self.time_ms(config)
                if ms == float("inf"):  # a do_bench's word for a config that cannot run: failed, as Triton scores it
                    errors[position] = f"{'do_bench' if self.user_do_bench is not None else 'the timer'} returned inf"
                durations.append(ms * 1e3)
            except failures as error:
                errors[position] = describe_error(error)
                durations.append(float("inf"))
            except Exception as error:
                add_note(error, f"fasta-sm: while timing config {config.label()}")
                raise
        return BenchmarkOutcome(durations_us=durations, seconds=time.perf_counter() - start, errors=errors)

    @property
    def pool(self) -> CompilePool:
        return self._pool or shared_pool()

    # ------------------------------------------------------------------ launches

    def nargs(self, config: Config) -> dict[str, Any]:
        """Every argument by name, as Triton's hooks receive them: the launch's, its grid, and the config's."""
        return {
            **dict(zip(self.arg_names, self.args)),
            **self.kwargs,
            "grid": self.grid,
            "warmup": False,
            **self._kwargs_of(config),
            "num_warps": config.num_warps,
            "num_ctas": 1,
            "num_stages": config.num_stages,
            **config.options,
        }

    def launch(self, config: Config) -> Any:
        """One plain launch of `config` (no hooks): what the tuned kernel runs."""
        return self.launcher.run(*self.args, grid=self.grid, warmup=False, **self._launch_kwargs(config))

    def time_ms(self, config: Config) -> float:
        """Median time of one launch with hooks, in ms."""
        nargs = self.nargs(config)
        launch_kwargs = self._launch_kwargs(config)
        saved = saved_args(nargs, self.restore_value) if self.pre_hook is not None else {}

        config_pre_hook = self.config_pre_hooks.get(config.identity)

        def call() -> None:
            nonlocal saved
            if config_pre_hook is not None:
                config_pre_hook(nargs)
            if self.pre_hook is not None:
                self.pre_hook(nargs)
            else:  # as Triton's default pre_hook: zero, then save what the config's pre_hook left
                zero_args(nargs, self.reset_to_zero)
                saved = saved_args(nargs, self.restore_value)
            try:
                self.launcher.run(*self.args, grid=self.grid, warmup=False, **launch_kwargs)
            except Exception as error:
                # As Triton's kernel_call (`try: post_hook(...) finally: raise`): an error of the hook's own is
                # what propagates, chained to the launch's, and stops the tune instead of passing for the
                # config's failure.
                if self.post_hook is not None:
                    self.post_hook(nargs, exception=error)
                else:  # as Triton's own post hook: a launch that failed part-way leaves its writes behind
                    restore_args(nargs, saved)
                raise
            if self.post_hook is not None:
                self.post_hook(nargs, exception=None)
            else:
                restore_args(nargs, saved)

        if self.user_do_bench is not None:
            return _first(self.user_do_bench(call, quantiles=(0.5, 0.2, 0.8)), "do_bench")
        if self.interpreting:
            return host_bench(call, self.rep_ms)
        import triton.testing

        timed = triton.testing.do_bench(call, warmup=self.warmup_ms, rep=self.rep_ms, quantiles=(0.5,))
        return _first(timed, "triton.testing.do_bench")

    # ------------------------------------------------------------------ internals

    def _kwargs_of(self, config: Config) -> Mapping[str, Any]:
        """The meta-parameters `config` is launched with: those `config_kwargs` gives for it where the
        fasta config holds another form of them (a tuple kwarg, kept as its repr), else its own."""
        return self.config_kwargs.get(config.identity, config.kwargs)

    def _launch_kwargs(self, config: Config) -> dict[str, Any]:
        return {
            **self.kwargs,
            **self._kwargs_of(config),
            "num_warps": config.num_warps,
            "num_stages": config.num_stages,
            **config.options,
        }

    def _jobs(self, configs: Sequence[Config]) -> list[CompileJob] | None:
        """Worker jobs, or None when the kernel or its arguments cannot travel to a worker (`kernel_path`)."""
        path = kernel_path(self.fn) if self.launcher is self.fn else None
        if path is None:
            return None
        module, qualname = path
        if any(hasattr(value, "data_ptr") for value in self.kwargs.values()):
            return None  # a tensor passed by keyword would travel to the workers whole
        try:
            pickle.dumps(self.kwargs)  # what the pool sends them
        except Exception:  # noqa: BLE001  a jit function passed as a constexpr, say: no worker can receive it
            return None
        try:
            if resolve(module, qualname) is not self.fn:
                return None
        except (ImportError, AttributeError):
            return None
        abstract = []
        for arg in self.args:
            if hasattr(arg, "data_ptr") and hasattr(arg, "dtype"):
                if arg.data_ptr() % 16:
                    return None  # specialized differently from the workers' aligned stand-ins
                abstract.append(TensorArg(str(arg.dtype)))
            elif arg is None or isinstance(arg, (bool, int, float, str)):
                abstract.append(arg)
            else:
                return None
        target, key, max_shared = _compile_target(), tuning_triton_key(), _device_max_shared()
        root, cache_dir, source = module_root(module), str(triton_cache_dir()), kernel_key(self.fn)
        return [
            CompileJob(module, qualname, tuple(abstract), self._launch_kwargs(c), target, key, root, max_shared,
                       cache_dir, source)
            for c in configs
        ]

    def _failures(self) -> tuple[type[BaseException], ...]:
        """The errors that fail a config rather than stop the tune: `failures` if given (the recorder keeps
        every error in its table), else Triton's own (`config_failures`)."""
        return self.failures if self.failures is not None else config_failures(self.interpreting)

    def _load(self, config: Config, worker_seconds: float) -> CompileOutcome:
        """Load the binary in this process (a disk-cache hit after a worker compiled it).

        Out-of-resource checks happen here: Triton raises them when a binary is
        loaded onto the device, not when it is compiled. Only the errors that
        mean "this config cannot run" (`_failures`) fail the config; any
        other (a bug in a `triton.heuristics` function, say) stops the tune, as
        it stops `triton.autotune`, instead of being kept as the config's fault:
        noted with the config it was loading.
        """
        start = time.perf_counter()
        try:
            kernel = self.launcher.run(*self.args, grid=self.grid, warmup=True, **self._launch_kwargs(config))
            init = getattr(kernel, "_init_handles", None)
            if init is not None:
                init()
        except self._failures() as error:
            return CompileOutcome(error=describe_error(error), seconds=worker_seconds + time.perf_counter() - start)
        except Exception as error:
            add_note(error, f"fasta-sm: while loading config {config.label()}")
            raise
        return CompileOutcome(error=None, seconds=worker_seconds + time.perf_counter() - start)


def _compile_target() -> Any:
    """This process's Triton target (the workers compile for it), or None where there is no driver."""
    try:
        from triton.runtime import driver

        return driver.active.get_current_target()
    except Exception as error:  # noqa: BLE001  the workers then ask their own driver
        logger.debug("no compile target: %s", describe_error(error))
        return None


def _device_max_shared() -> int | None:
    """The current device's shared memory per block as Triton checks it at load, or None where there is no driver."""
    try:
        from triton.runtime import driver

        return _max_shared_of(driver.active.get_current_device())
    except Exception as error:  # noqa: BLE001  the workers then compile in full and the load checks
        logger.debug("no shared-memory limit: %s", describe_error(error))
        return None


@functools.cache
def _max_shared_of(device: int) -> int:
    """Triton's `max_shared_mem` of `device`: the figure its load checks a binary's shared memory against."""
    from triton.runtime import driver

    return int(driver.active.utils.get_device_properties(device)["max_shared_mem"])
