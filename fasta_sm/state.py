"""TuneState: everything needed to continue a tune in another process, as msgpack.

The state file is the product's memory and its explanation: what was measured,
what failed and why, what the policy believed, and why the tune stopped. It is
msgpack only (never pickle), versioned, and round-trips exactly.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

import msgpack
import numpy as np

from . import __version__
from .config import Config, configs_hash
from .errors import StateFileError

SCHEMA_VERSION = 1

PHASES = ("R1", "R2", "DONE")
STEPS = ("compile", "benchmark", "refine", "done")


@dataclass
class RoundRecord:
    """One round (R1 or R2_k): what was asked for, why, and what it cost."""

    phase: str
    round: int
    batch: list[int]
    reason: str
    retime: bool = False
    predicted_us: list[float] = field(default_factory=list)
    started: float = 0.0
    finished: float | None = None
    compile_s: float = 0.0
    benchmark_s: float = 0.0
    policy_s: float = 0.0


@dataclass
class Cost:
    """Where the tuning time went (seconds; replay charges what a live run would)."""

    compile_s: float = 0.0
    benchmark_s: float = 0.0
    policy_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compile_s + self.benchmark_s + self.policy_s


@dataclass
class TuneState:
    """A kernel's tune at one step of R1 → R2_k → DONE.

    `step` is the trigger the machine fires next. `pending` is the current
    round's batch (config indices); `compiled` and `failed` record outcomes per
    config; `durations` keeps every timing taken (several for re-timed configs).
    """

    key: str
    kernel: str
    configs: list[Config]
    policy: str
    policy_params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    backend: str = ""
    configs_hash: str = ""
    phase: str = "R1"
    round: int = 0
    step: str = "compile"
    pending: list[int] = field(default_factory=list)
    retime: bool = False
    round_done: list[int] = field(default_factory=list)
    compiled: dict[int, float] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    durations: dict[int, list[float]] = field(default_factory=dict)
    carried: dict[int, dict[str, Any]] = field(default_factory=dict)
    policy_state: dict[str, Any] = field(default_factory=dict)
    rng_state: dict[str, Any] = field(default_factory=dict)
    best: int | None = None
    best_us: float | None = None
    predicted_us: list[float] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    cost: Cost = field(default_factory=Cost)
    stop_reason: str | None = None
    last_error: str | None = None
    restarts: list[str] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    schema: int = SCHEMA_VERSION
    library: str = __version__

    def __post_init__(self) -> None:
        if not self.configs_hash:
            self.configs_hash = configs_hash(self.configs)

    @property
    def n_configs(self) -> int:
        return len(self.configs)

    @property
    def done(self) -> bool:
        return self.phase == "DONE"

    def mean_us(self, index: int) -> float:
        samples = self.durations[index]
        return sum(samples) / len(samples)

    def measured_count(self) -> int:
        return len(self.durations)

    def evaluations(self) -> int:
        """Benchmark calls spent, re-timings included."""
        return sum(len(samples) for samples in self.durations.values())

    def duration_array(self) -> np.ndarray:
        """Mean duration per config: NaN unmeasured, inf failed."""
        out = np.full(self.n_configs, np.nan)
        for index in self.failed:
            out[index] = np.inf
        for index, samples in self.durations.items():
            out[index] = sum(samples) / len(samples)
        return out

    def position(self) -> str:
        """Where the machine stands, as people say it: 'R2_3 benchmark'."""
        if self.done:
            return "DONE"
        name = "R1" if self.phase == "R1" else f"R2_{self.round}"
        return f"{name} {self.step}"


def encode_rng(rng: np.random.Generator) -> dict[str, Any]:
    """A Generator's state for msgpack: 128-bit integers go as decimal strings."""
    return _ints_to_str(rng.bit_generator.state)


_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def decode_rng(state: Mapping[str, Any]) -> np.random.Generator:
    restored = _str_to_ints(dict(state))
    name = restored.get("bit_generator")
    if name not in _BIT_GENERATORS:  # never call whatever a state file names
        raise ValueError(f"rng_state names {name!r}, not a numpy bit generator")
    bit_generator = getattr(np.random, name)()
    bit_generator.state = restored
    return np.random.Generator(bit_generator)


def _ints_to_str(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _ints_to_str(v) for k, v in value.items()}
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return {"__int__": str(value)}
    return value


def _str_to_ints(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__int__"}:
            return int(value["__int__"])
        return {k: _str_to_ints(v) for k, v in value.items()}
    return value


def pack_state(state: TuneState) -> bytes:
    """Serialize a state to msgpack bytes (the state file's whole content)."""
    data = {f.name: getattr(state, f.name) for f in fields(TuneState)}
    data["configs"] = [config.to_dict() for config in state.configs]
    data["rounds"] = [asdict(record) for record in state.rounds]
    data["cost"] = asdict(state.cost)
    return msgpack.packb(data, use_bin_type=True)


_REQUIRED = {f.name for f in fields(TuneState) if f.name in ("key", "kernel", "configs", "policy")}


def unpack_state(blob: bytes, source: str = "<bytes>") -> TuneState:
    """Decode msgpack bytes into a TuneState, or raise StateFileError naming `source`.

    StateFileError is the only error this raises, whatever the bytes.
    """
    try:
        data = msgpack.unpackb(blob, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises many types on damaged input
        raise StateFileError(f"{source}: not a msgpack state file ({type(exc).__name__}: {exc})") from None
    try:
        return _state_from_data(data, source)
    except StateFileError:
        raise
    except Exception as exc:
        raise StateFileError(f"{source}: malformed state ({type(exc).__name__}: {exc})") from None


def _state_from_data(data: Any, source: str) -> TuneState:
    if not isinstance(data, dict):
        raise StateFileError(f"{source}: top level is {type(data).__name__}, expected a map")
    schema = data.get("schema")
    if schema != SCHEMA_VERSION:
        raise StateFileError(
            f"{source}: schema version {schema!r}; this fasta-sm ({__version__}) reads version {SCHEMA_VERSION}"
        )
    missing = sorted(_REQUIRED - set(data))
    if missing:
        raise StateFileError(f"{source}: missing field(s) {', '.join(missing)}")
    known = {f.name for f in fields(TuneState)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise StateFileError(f"{source}: unknown field(s) {', '.join(map(str, unknown))}")
    data = dict(data)
    _check_types(data, source)
    data["configs"] = [Config.from_dict(c) for c in data["configs"]]
    data["rounds"] = [RoundRecord(**r) for r in data["rounds"]]
    data["cost"] = Cost(**data["cost"])
    data["compiled"] = {int(k): float(v) for k, v in data["compiled"].items()}
    data["failed"] = {int(k): str(v) for k, v in data["failed"].items()}
    data["durations"] = {int(k): [float(x) for x in v] for k, v in data["durations"].items()}
    data["carried"] = {int(k): dict(v) for k, v in data["carried"].items()}
    state = TuneState(**data)
    _check_consistent(state, source)
    return state


_NUMBER = (int, float)
_OPTIONAL = type(None)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "key": (str,), "kernel": (str,), "policy": (str,), "backend": (str,), "configs_hash": (str,),
    "phase": (str,), "step": (str,), "library": (str,), "configs": (list,),
    "policy_params": (dict,), "policy_state": (dict,), "rng_state": (dict,), "compiled": (dict,),
    "failed": (dict,), "durations": (dict,), "carried": (dict,), "cost": (dict,),
    "seed": (int,), "round": (int,), "retime": (bool,),
    "pending": (list,), "round_done": (list,), "predicted_us": (list,), "rounds": (list,), "restarts": (list,),
    "best": (int, _OPTIONAL), "best_us": (*_NUMBER, _OPTIONAL), "stop_reason": (str, _OPTIONAL),
    "last_error": (str, _OPTIONAL), "created": _NUMBER, "updated": _NUMBER,
}
_ROUND_TYPES: dict[str, tuple[type, ...]] = {
    "phase": (str,), "round": (int,), "batch": (list,), "reason": (str,), "retime": (bool,),
    "predicted_us": (list,), "started": _NUMBER, "finished": (*_NUMBER, _OPTIONAL),
    "compile_s": _NUMBER, "benchmark_s": _NUMBER, "policy_s": _NUMBER,
}


def _check_types(data: dict, source: str) -> None:
    """Reject fields of the wrong kind, so a state that loads can also be resumed."""

    def check(where: str, value: Any, types: tuple[type, ...]) -> None:
        if isinstance(value, bool) and bool not in types:
            ok = False
        else:
            ok = isinstance(value, types)
        if not ok:
            names = " or ".join("null" if t is _OPTIONAL else t.__name__ for t in types)
            raise StateFileError(f"{source}: {where} is {type(value).__name__} {value!r:.60}, expected {names}")

    for name, value in data.items():
        if name in _FIELD_TYPES:
            check(name, value, _FIELD_TYPES[name])
    for name in ("pending", "round_done"):
        for value in data.get(name, ()):
            check(f"{name} entry", value, (int,))
    for value in data.get("predicted_us", ()):
        check("predicted_us entry", value, _NUMBER)
    for value in data.get("restarts", ()):
        check("restarts entry", value, (str,))
    for position, record in enumerate(data.get("rounds", ())):
        check(f"rounds[{position}]", record, (dict,))
        for name, value in record.items():
            check(f"rounds[{position}].{name}", value, _ROUND_TYPES.get(name, (object,)))
        for value in record.get("batch", ()):
            check(f"rounds[{position}].batch entry", value, (int,))
        for value in record.get("predicted_us", ()):
            check(f"rounds[{position}].predicted_us entry", value, _NUMBER)
    for name, value in data.get("cost", {}).items():
        check(f"cost.{name}", value, _NUMBER)
    for index, value in data.get("compiled", {}).items():
        check(f"compiled[{index!r}]", value, _NUMBER)
    for index, value in data.get("failed", {}).items():
        check(f"failed[{index!r}]", value, (str,))
    for index, samples in data.get("durations", {}).items():
        check(f"durations[{index!r}]", samples, (list,))
        for value in samples:
            check(f"durations[{index!r}] entry", value, _NUMBER)
    for index, carried in data.get("carried", {}).items():
        check(f"carried[{index!r}]", carried, (dict,))
        check(f"carried[{index!r}].compile_s", carried.get("compile_s"), (*_NUMBER, _OPTIONAL))
        check(f"carried[{index!r}].error", carried.get("error"), (str, _OPTIONAL))
        check(f"carried[{index!r}].durations_us", carried.get("durations_us", []), (list,))
        for value in carried.get("durations_us", []):
            check(f"carried[{index!r}].durations_us entry", value, _NUMBER)


def _check_consistent(state: TuneState, source: str) -> None:
    """Reject states whose parts contradict each other: resuming them would mislead."""
    n = state.n_configs
    if n == 0:
        raise StateFileError(f"{source}: empty config list")
    if state.configs_hash != configs_hash(state.configs):
        raise StateFileError(f"{source}: configs_hash does not match the config list")
    if state.phase not in PHASES or state.step not in STEPS:
        raise StateFileError(f"{source}: unknown position phase={state.phase!r} step={state.step!r}")
    if (state.phase == "DONE") != (state.step == "done"):
        raise StateFileError(f"{source}: phase {state.phase!r} with step {state.step!r}")
    if not state.done and not state.rounds:
        raise StateFileError(f"{source}: at {state.position()} without a round record")
    for name in ("pending", "round_done", "compiled", "failed", "durations", "carried"):
        indices = list(getattr(state, name))
        bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < n]
        if bad:
            raise StateFileError(f"{source}: {name} holds index {bad[0]!r} outside 0..{n - 1}")
    for index, samples in state.durations.items():
        if not samples or any(not math.isfinite(x) or x < 0 for x in samples):
            raise StateFileError(f"{source}: config #{index} has invalid durations {samples!r}")
    if state.best is not None and state.best not in state.durations:
        raise StateFileError(f"{source}: best config #{state.best} was never measured")
    if state.phase == "DONE" and state.best is None:
        raise StateFileError(f"{source}: DONE without a winner")
    if state.rng_state:
        decode_rng(state.rng_state)
