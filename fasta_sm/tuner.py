"""tune(): load or start a kernel's tune, drive it to DONE under its lock, return the winner.

This is the entry point every integration calls. A DONE state over the same
config list and settings (policy, its parameters, seed) is reused without
taking the lock, compiling or benchmarking. A process that finds the kernel
being tuned waits for the lock, then reuses or resumes what the other
process left. A state over another list or other settings is superseded:
the new tune carries its measurements, unless the key's superseded files
hold a finished tune of the very list and settings asked for, which is put
back and reused.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from .config import MSGPACK_INTS, Config, check_config_list, configs_hash
from .errors import PolicyError, StateDirError, StateFileError, describe
from .machine import DEFAULT_BENCHMARK_CHUNK, DEFAULT_CHUNK, Tune, check_seed
from .policies import make_policy, with_environment
from .prior import earlier_winners, prior_enabled
from .protocols import Backend, Policy, TakesPrior
from .state import TuneState, pack_state
from .store import StateStore, is_wait

log = logging.getLogger("fasta_sm.tuner")

StepCallback = Callable[[TuneState], None]


@dataclass(frozen=True)
class TuneResult:
    """The winner of a tune, and whether it came from an earlier process."""

    state: TuneState
    reused: bool

    @property
    def best_index(self) -> int:
        assert self.state.best is not None
        return self.state.best

    @property
    def best_config(self) -> Config:
        return self.state.configs[self.best_index]

    @property
    def best_us(self) -> float:
        assert self.state.best_us is not None
        return self.state.best_us


def tune(
    key: str,
    kernel: str,
    configs: Sequence[Config],
    backend: Backend,
    *,
    policy: str = "fasta",
    policy_params: Mapping[str, Any] | None = None,
    seed: int = 0,
    store: StateStore | None = None,
    lock_timeout_s: float | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    benchmark_chunk: int = DEFAULT_BENCHMARK_CHUNK,
    on_step: StepCallback | None = None,
    prior: bool = True,
) -> TuneResult:
    """Tune `kernel` (durably, under `key`) and return its winner.

    `policy_params` are completed with the knobs the environment sets
    (`with_environment`), and the tune keeps them as its settings. A new
    tune starts from what the store's finished tunes of `kernel` found fast
    (fasta_sm.prior) unless `prior` is False or `FASTA_SM_PRIOR` says no.
    """
    _check_kernel(kernel)
    configs = check_config_list(kernel, configs)
    seed = check_seed(kernel, seed)
    _check_key(kernel, key)
    if lock_timeout_s is not None and not is_wait(lock_timeout_s):
        raise ValueError(
            f"kernel {kernel!r}: lock_timeout_s={lock_timeout_s!r} must be ≥ 0 (or None: the store's timeout)"
        )
    if store is not None and not isinstance(store, StateStore):
        raise TypeError(f"kernel {kernel!r}: store={store!r} must be a StateStore (StateStore(path) for a directory)")
    store = store if store is not None else StateStore()
    wanted = configs_hash(configs)
    policy_params = _with_environment(kernel, policy, storable_params(kernel, policy_params))
    done = _peek_done(store, key, kernel, wanted, policy, policy_params, seed)
    if done is not None:
        return TuneResult(done, reused=True)
    with store.lock(key, kernel, lock_timeout_s):
        tune_ = open_tune(
            store,
            key,
            kernel,
            configs,
            backend,
            policy=policy,
            policy_params=policy_params,
            seed=seed,
            chunk_size=chunk_size,
            benchmark_chunk=benchmark_chunk,
            on_step=on_step,
            prior=prior and prior_enabled(),
        )
        if isinstance(tune_, TuneState):
            return TuneResult(tune_, reused=True)
        try:
            return TuneResult(tune_.drive(), reused=False)
        finally:
            tune_.close()


def open_tune(
    store: StateStore,
    key: str,
    kernel: str,
    configs: Sequence[Config],
    backend: Backend,
    *,
    policy: str = "fasta",
    policy_params: Mapping[str, Any] | None = None,
    seed: int = 0,
    chunk_size: int = DEFAULT_CHUNK,
    benchmark_chunk: int = DEFAULT_BENCHMARK_CHUNK,
    on_step: StepCallback | None = None,
    prior: bool = True,
) -> Tune | TuneState:
    """The tune to drive for `key` (resumed or new), or its DONE state, to reuse as it is.

    The caller must hold the key's lock. `policy_params` are taken as they
    are: an integration settles them once (`integration_params`, the
    environment's knobs included), so that the processes that open one
    tune agree on them. A new tune's policy is offered the configs earlier
    tunes of `kernel` found fast where `prior` is true: the caller settles
    it, `FASTA_SM_PRIOR` included (`tune`; an integration's settings).
    """
    _check_kernel(kernel)
    wanted = configs_hash(configs)
    seed = check_seed(kernel, seed)
    _check_key(kernel, key)
    params = storable_params(kernel, policy_params)

    def fresh_policy() -> Policy:
        """The policy of a new tune, made before any old file is set aside: bad params must lose nothing."""
        try:
            return make_policy(policy, configs, params)
        except PolicyError as exc:
            raise PolicyError(f"kernel {kernel!r}: {exc}") from None

    store.discard_temp_files(key)
    notes: list[str] = []
    state = store.load(key, notes, kernel=kernel)
    carried: dict[int, dict] = {}
    fresh: Policy | None = None
    if state is None:  # none yet, or quarantined: what the key's superseded files hold is still sound
        earlier = _superseded_states(store, key, kernel)
        finished = _finished_as_asked(earlier, wanted, policy, params, seed)
        if finished is not None:
            return _reinstated(store, key, *finished)
        carried = _with_superseded(earlier, configs, {})
        if carried:
            notes.append(f"results of {len(carried)} kept from the key's superseded state files")
    else:
        if state.configs_hash != wanted:
            why = f"its config list changed ({state.n_configs} → {len(configs)} configs)"
        else:
            why = _settings_changed(state, policy, params, seed)
        if why:
            earlier = _superseded_states(store, key, kernel)
            finished = _finished_as_asked(earlier, wanted, policy, params, seed)
            if finished is not None:  # its settings are a finished tune's: no policy to check them with
                store.supersede(key, why)
                return _reinstated(store, key, *finished)
            fresh = fresh_policy()
            carried = _supersede(store, key, state, configs, why, notes, earlier)
            state = None
    if state is not None and state.done:
        return state

    def checkpoint(current: TuneState, blob: bytes) -> None:
        store.write(current.key, blob, kernel=current.kernel)
        if on_step is not None:
            try:
                on_step(current)
            except Exception as exc:  # noqa: BLE001  a progress display that fails must not undo a checkpoint
                log.warning("kernel %s: on_step raised %s: %s; the tune goes on", kernel, type(exc).__name__, exc)

    if state is not None:
        log.info("kernel %s: resuming at %s", kernel, state.position())
        try:
            chosen = make_policy(state.policy, configs, state.policy_params)
            return Tune(state, backend, chosen, checkpoint, chunk_size, benchmark_chunk)
        except Exception as exc:  # noqa: BLE001  whatever a policy raises on a state it cannot take, the file is set aside
            # The measurements are sound (the loader checked them); only the policy's own state is not.
            fresh = fresh_policy()
            why = f"its policy cannot resume from it ({describe(exc)})"
            carried = _supersede(store, key, state, configs, why, notes, _superseded_states(store, key, kernel))
    chosen = fresh if fresh is not None else fresh_policy()
    if prior and isinstance(chosen, TakesPrior) and chosen.takes_prior:
        earlier = earlier_winners(store, key, kernel, configs, backend.describe())
        if earlier:
            log.info("kernel %s: earlier tunes of it found %d configs fast; R1 may start from them", kernel,
                     len(earlier))
            chosen.use_prior(earlier)
    return Tune.start(
        key,
        kernel,
        configs,
        backend,
        chosen,
        policy_params=params,
        seed=seed,
        checkpoint=checkpoint,
        chunk_size=chunk_size,
        benchmark_chunk=benchmark_chunk,
        restarts=notes,
        carried=carried,
    )


def _supersede(
    store: StateStore,
    key: str,
    old: TuneState,
    configs: Sequence[Config],
    why: str,
    notes: list[str],
    earlier: list[tuple[Path, TuneState]],
) -> dict[int, dict]:
    """Set `key`'s file (holding `old`) aside as superseded; return the results to carry for `configs`.

    They come from `old` and then from the key's older superseded states
    (`earlier`), so a config dropped by one list change and brought back by
    the next is not measured again.
    """
    carried = _with_superseded(earlier, configs, carry_results(old, configs))
    why = f"{why}; results of {len(carried)} kept"
    notes.append(f"previous state superseded as {store.supersede(key, why).name}: {why}")
    return carried


def _superseded_states(store: StateStore, key: str, kernel: str) -> list[tuple[Path, TuneState]]:
    """The key's superseded states of `kernel`, newest first, with their files, each read once; one that cannot
    be decoded is passed over, one that cannot be read for now stops the tune (StateDirError): what it holds would
    be measured again."""
    found = []
    for path in store.superseded_files(key):
        try:
            earlier = store.read(path)
        except StateDirError:
            raise
        except (OSError, StateFileError) as exc:
            log.info("kernel %s: nothing taken from %s: %s", kernel, path.name, exc)
            continue
        if earlier.key == key and earlier.kernel == kernel:
            found.append((path, earlier))
    return found


def _finished_as_asked(
    earlier: list[tuple[Path, TuneState]], wanted: str, policy: str, params: Mapping[str, Any], seed: int
) -> tuple[Path, TuneState] | None:
    """The newest of the key's superseded states (`earlier`) that is a finished tune of these very configs and
    settings.

    A setting switched back (an environment knob, a seed, a config list
    edited and reverted) asks for a tune the key has finished already: it is
    reused, as a finished tune is, not tuned again from the results it
    carries, which would take other decisions.
    """
    for path, state in earlier:
        if state.done and state.configs_hash == wanted and _settings_changed(state, policy, params, seed) is None:
            return path, state
    return None


def _reinstated(store: StateStore, key: str, path: Path, finished: TuneState) -> TuneState:
    """`finished`, read from the superseded file at `path`, put back as the key's state file, to be reused."""
    store.reinstate(key, path, pack_state(finished))
    return finished


def _with_superseded(
    earlier: list[tuple[Path, TuneState]], configs: Sequence[Config], carried: dict[int, dict]
) -> dict[int, dict]:
    """`carried`, and for the configs it has no result of, the results the key's superseded states (`earlier`)
    hold, newest first."""
    for _, state in earlier:
        carried = {**carry_results(state, configs), **carried}
    return carried


def carry_results(old: TuneState, configs: Sequence[Config]) -> dict[int, dict]:
    """Results of `old` for configs still in `configs`, keyed by their new index.

    Results belong to a config, not to a list: adding one config to a kernel's
    list must not throw away what was measured for the others.
    """
    position = {config.identity: i for i, config in enumerate(configs)}
    carried = {}
    for old_index, config in enumerate(old.configs):
        new_index = position.get(config.identity)
        if new_index is None:
            continue
        if old_index in old.failed:
            carried[new_index] = {"error": old.failed[old_index]}
        elif old_index in old.compiled:  # timed, or compiled from a carried result whose timings wait in `carried`
            timed = old.durations.get(old_index) or old.carried.get(old_index, {}).get("durations_us", [])
            carried[new_index] = {"compile_s": old.compiled[old_index], "durations_us": list(timed), "error": None}
        elif old_index in old.carried:  # carried into `old` from the list before it, not used yet
            carried[new_index] = dict(old.carried[old_index])
    return carried


def storable_params(kernel: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """`params` as a state file keeps them, or a PolicyError naming the kernel and the value that cannot be kept.

    A numpy number or array becomes the Python value it holds and a tuple a
    list; a set (no order), a non-finite float or an object is refused here,
    before anything is tuned, not when the first checkpoint is written.
    """
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise PolicyError(f"kernel {kernel!r}: policy_params={params!r} must be a mapping of parameter names to values")
    return _storable(kernel, "policy_params", params)


def _storable(kernel: str, where: str, value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_storable(kernel, f"{where}[{position}]", item) for position, item in enumerate(value)]
    if isinstance(value, Mapping):
        for name in value:
            if not isinstance(name, str):
                raise PolicyError(f"kernel {kernel!r}: {where} has key {name!r}, not a name")
        return {name: _storable(kernel, f"{where}[{name!r}]", item) for name, item in value.items()}
    fits = value is None or isinstance(value, (bool, str))
    fits = fits or (isinstance(value, int) and MSGPACK_INTS[0] <= value < MSGPACK_INTS[1])
    fits = fits or (isinstance(value, float) and math.isfinite(value))
    if not fits:
        raise PolicyError(f"kernel {kernel!r}: {where}={value!r} cannot be kept in a state file: give null, a bool, "
                          "a finite number of 64 bits at most, a string, or a list or map of these")
    return value


def _with_environment(kernel: str, policy: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The tune's parameters, the ones its policy takes from the environment included (see `with_environment`)."""
    try:
        return with_environment(policy, params)
    except PolicyError as exc:
        raise PolicyError(f"kernel {kernel!r}: {exc}") from None


def _settings_changed(state: TuneState, policy: str, params: Mapping[str, Any], seed: int) -> str | None:
    """How the tune asked for differs from the one `state` holds (policy, its parameters, seed); None if not.

    A tune is its settings as much as its configs: a caller who changes them
    wants a new tune (the measurements carry over), not the old winner.
    The caller's parameters are compared as a state file keeps them (tuples
    as lists); `state` was read from one.
    """
    changes = []
    if state.policy != policy:
        changes.append(f"policy {state.policy!r} → {policy!r}")
    if state.policy_params != _as_stored(params):
        changes.append(f"policy_params {state.policy_params!r} → {dict(params)!r}")
    if state.seed != seed:
        changes.append(f"seed {state.seed!r} → {seed!r}")
    return "its changed " + ", ".join(changes) if changes else None


def _check_kernel(kernel: str) -> None:
    """A kernel name a state file can hold. Refused before the lock is taken, since loading the key's file under
    another name would set its tune aside as another kernel's."""
    _check_storable(kernel, f"kernel {kernel!r}")


def _check_key(kernel: str, key: str) -> None:
    """A key a state file can hold."""
    _check_storable(key, f"kernel {kernel!r}: key {key!r}")


def _check_storable(text: str, named: str) -> None:
    """Text that UTF-8 can write (a lone surrogate, as `os.fsdecode` makes of undecodable bytes, cannot be), else
    a ValueError starting with `named`."""
    try:
        text.encode()
    except (AttributeError, UnicodeEncodeError) as exc:
        raise ValueError(f"{named} cannot be stored: {exc}") from None


def _as_stored(params: Mapping[str, Any]) -> Any:
    return msgpack.unpackb(msgpack.packb(dict(params), use_bin_type=True), raw=False, strict_map_key=False)


def _peek_done(
    store: StateStore, key: str, kernel: str, wanted: str, policy: str, params: Mapping[str, Any], seed: int
) -> TuneState | None:
    """A DONE state for `key` over the same configs and settings, read without the lock or side effects."""
    try:
        state = store.read(store.file_for(key))
    except (FileNotFoundError, StateFileError):
        return None
    if state.done and state.key == key and state.configs_hash == wanted and state.kernel == kernel:
        return None if _settings_changed(state, policy, params, seed) else state
    return None
