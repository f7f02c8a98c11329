"""TuneState: everything needed to continue a tune in another process, as msgpack.

The state file is the product's memory and its explanation: what was measured,
what failed and why, what the policy believed, and why the tune stopped. It is
msgpack only (never pickle), versioned, and round-trips exactly.
"""

from __future__ import annotations

import hashlib
import math
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from itertools import chain
from typing import Any

import msgpack
import numpy as np
import numpy.random  # noqa: F401  loaded on first use otherwise, a warm start's first read would import it

from . import __version__
from .config import MSGPACK_INTS, Config, configs_hash
from .errors import StateFileError
from .protocols import LONGEST_US, Observations

SCHEMA_VERSION = 3
"""3: `carried_taken` says which results came from a superseded tune, so that what a tune spent can be told from
what it was given. 2: the top map ends with `crc32`, a CRC-32 of the bytes of every field before it, so that
damage that still decodes (a flipped bit in a timing) is caught. 1: the same fields without it. 1 and 2 are read,
no longer written."""
READABLE_SCHEMAS = (1, 2, 3)
CHECKSUM_FIELD = "crc32"

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
    """The policy's seconds after this round's results, choosing the next round or to stop, with the lookahead
    that guessed the next round's picks while it ran; R1's also holds the plan that chose R1. The seconds that
    chose a guided round are its predecessor's."""

    @property
    def name(self) -> str:
        """The round as people say it: 'R1', 'R2_3'."""
        return round_name(self.phase, self.round)


def sample_mean(samples: Sequence[float]) -> float:
    """The mean of a config's timings, summed left to right.

    Every stored `best_us` was computed this way; Python 3.12's `sum()` compensates
    rounding and can differ in the last bit, which would make a state file's best
    disagree with its own timings on one Python and not another.
    """
    total = 0.0
    for sample in samples:
        total += sample
    return total / len(samples)


def _compensated_mean(samples: Sequence[float]) -> float:
    """The mean as `sum(samples) / len(samples)` gives it on Python 3.12+ (Neumaier's compensated sum)."""
    total = compensation = 0.0
    for sample in samples:
        step = total + sample
        if abs(total) >= abs(sample):
            compensation += (total - step) + sample
        else:
            compensation += (sample - step) + total
        total = step
    if compensation and math.isfinite(compensation):
        total += compensation
    return total / len(samples)


def round_name(phase: str, number: int) -> str:
    """'R1' for R1, 'R2_<number>' for a guided round."""
    return "R1" if phase == "R1" else f"R2_{number}"


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
    carried_taken: dict[int, int] = field(default_factory=dict)
    """The configs whose compile outcome was taken from `carried`, each with how many of its first timings were:
    results this tune was given, not ones it paid for."""
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
        return sample_mean(self.durations[index])

    def uncompiled(self) -> list[int]:
        """The current batch's configs neither compiled nor failed yet."""
        return [i for i in self.pending if i not in self.compiled and i not in self.failed]

    def untimed(self) -> list[int]:
        """The current batch's configs not timed this round and not failed, compiled or not."""
        timed = set(self.round_done)
        return [i for i in self.pending if i not in timed and i not in self.failed]

    def ready_to_time(self) -> list[int]:
        """The current batch's configs compiled and not yet timed this round."""
        return [i for i in self.untimed() if i in self.compiled]

    def measured_count(self) -> int:
        return len(self.durations)

    def tried_count(self) -> int:
        """Configs that ran or failed: each is compiled and timed at most once, re-timings aside."""
        return len(self.durations) + len(self.failed)

    def evaluations(self) -> int:
        """Timings held, re-timings and those taken from a superseded tune included."""
        return sum(len(samples) for samples in self.durations.values())

    def timings_given(self) -> int:
        """Timings held that were taken from a superseded tune: they cost this one nothing."""
        return sum(taken for index, taken in self.carried_taken.items() if index in self.durations)

    def duration_array(self) -> np.ndarray:
        """Mean duration per config: NaN unmeasured, inf failed."""
        out = np.full(self.n_configs, np.nan)
        for index in self.failed:
            out[index] = np.inf
        for index, samples in self.durations.items():
            out[index] = sample_mean(samples)
        return out

    def observed(self) -> Observations:
        """What a policy's refine sees: durations, timings per config, compile seconds, seconds spent, failures."""
        return Observations(
            duration_us=self.duration_array(),
            samples=np.array([len(self.durations.get(i, ())) for i in range(self.n_configs)]),
            compile_s=np.array([self.compiled.get(i, math.nan) for i in range(self.n_configs)]),
            spent_s=self.cost.compile_s + self.cost.benchmark_s,
            failures=dict(self.failed),
        )

    def position(self) -> str:
        """Where the machine stands, as people say it: 'R2_3 benchmark'."""
        if self.done:
            return "DONE"
        return f"{round_name(self.phase, self.round)} {self.step}"

    @property
    def no_winner(self) -> bool:
        """The policy stopped with no config run (`last_error` says so): resuming stops the same way."""
        return not self.done and self.best is None and ": TuneFailed: " in (self.last_error or "")

    def status(self) -> str:
        """The position, and that the tune ended without a winner when it did."""
        return f"{self.position()}, no config ran" if self.no_winner else self.position()


SEED_MAX = MSGPACK_INTS[1] - 1
"""The largest seed: a tune's seed is stored in its state file, which holds no int past 64 bits."""


def storable_text(text: Any) -> str:
    """`text` as a state file can hold it: msgpack writes UTF-8, so bytes a message could not decode
    (a compiler's output read with `surrogateescape`) are kept as backslash escapes."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


def encode_rng(rng: np.random.Generator) -> dict[str, Any]:
    """A Generator's state for msgpack: 128-bit integers go as decimal strings."""
    return _ints_to_str(rng.bit_generator.state)


_BIT_GENERATORS = ("PCG64", "PCG64DXSM")
"""The generators whose state `encode_rng` writes back: the others hold arrays, which a checkpoint cannot carry."""


def decode_rng(state: Mapping[str, Any]) -> np.random.Generator:
    restored = _str_to_ints(dict(state))
    name = restored.get("bit_generator")
    if name not in _BIT_GENERATORS:  # never call whatever a state file names
        raise ValueError(f"rng_state names {name!r}; a checkpoint holds {' or '.join(_BIT_GENERATORS)} states only")
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


_CACHE_SIZE = 8  # config lists kept per process (each cache); bounds their memory
_packed_configs: dict[str, tuple[list, int, bytes]] = {}
_decoded_configs: dict[bytes, tuple[list, str]] = {}


def _pack_configs(configs: Sequence[Config]) -> bytes:
    """A config list's msgpack: what a state file holds, and what `remember_configs` must match byte for byte."""
    return msgpack.packb([config.to_dict() for config in configs], use_bin_type=True)


def _configs_bytes(state: TuneState) -> bytes:
    """The msgpack of a state's config list, packed once per list object.

    A tune checkpoints the same (immutable) config list after every step; packing
    it is most of pack_state's cost, so the bytes are kept, keyed by the list's
    hash and checked against the list object itself.
    """
    hit = _packed_configs.get(state.configs_hash)
    if hit is not None and hit[0] is state.configs and hit[1] == len(state.configs):
        return hit[2]
    blob = _pack_configs(state.configs)
    if len(_packed_configs) >= _CACHE_SIZE:
        _packed_configs.clear()
    _packed_configs[state.configs_hash] = (state.configs, len(state.configs), blob)
    return blob


_FIELD_NAMES = tuple(f.name for f in fields(TuneState))
_ROUND_FIELDS = tuple(f.name for f in fields(RoundRecord))
_COST_FIELDS = tuple(f.name for f in fields(Cost))


def pack_state(state: TuneState) -> bytes:
    """Serialize a state to msgpack bytes (the state file's whole content).

    Byte for byte what `msgpack.packb` gives for the map of every field in
    declaration order (configs as dicts, rounds and cost as maps, `schema`
    and `library` today's), then `crc32` over those fields' bytes; the map is written
    field by field so the config list's cached bytes can be spliced in.
    """
    packer = msgpack.Packer(use_bin_type=True)
    parts = []
    for name in _FIELD_NAMES:
        parts.append(packer.pack(name))
        if name == "configs":
            parts.append(_configs_bytes(state))
        elif name == "rounds":
            parts.append(packer.pack([{f: getattr(r, f) for f in _ROUND_FIELDS} for r in state.rounds]))
        elif name == "cost":
            parts.append(packer.pack({f: getattr(state.cost, f) for f in _COST_FIELDS}))
        elif name == "schema":  # a state read from an older file is written in today's schema
            parts.append(packer.pack(SCHEMA_VERSION))
        elif name == "library":  # and names the version that wrote it last
            parts.append(packer.pack(__version__))
        else:
            parts.append(packer.pack(getattr(state, name)))
    body = b"".join(parts)
    checksum = packer.pack(CHECKSUM_FIELD) + packer.pack(zlib.crc32(body))
    return packer.pack_map_header(len(_FIELD_NAMES) + 1) + body + checksum


def remember_configs(configs: Sequence[Config]) -> None:
    """Let a state over `configs` be read without decoding its config list: this process holds it already.

    A warm start reads a DONE state over the very list its caller holds, and
    decoding that list again is most of the read (about 1 ms for 150
    configs). Seeded here, the decode cache answers for a state whose list
    has the same bytes (it is keyed by their hash); any other list is
    decoded and checked as before.
    """
    key = hashlib.blake2b(_pack_configs(configs), digest_size=32).digest()
    if key not in _decoded_configs and len(_decoded_configs) >= _CACHE_SIZE:
        _decoded_configs.clear()
    _decoded_configs[key] = (list(configs), configs_hash(configs))


def _decode_configs(raw: Any, source: str) -> tuple[list[Config], str]:
    """Config objects and their hash for a raw config list, decoded once per distinct list.

    Building a Config and its identity costs microseconds each; a process that
    reloads states over the same list (rollback, `ls`, a waiter reusing a DONE
    state) gets them from a cache keyed by the list's own canonical msgpack.
    """
    packed = raw.blob if isinstance(raw, _RawConfigs) else msgpack.packb(raw, use_bin_type=True)
    key = hashlib.blake2b(packed, digest_size=32).digest()
    hit = _decoded_configs.get(key)
    if hit is None:
        if isinstance(raw, _RawConfigs):
            raw = msgpack.unpackb(raw.blob, raw=False, strict_map_key=False, use_list=True)
            if not isinstance(raw, list):
                raise TypeError(f"configs is {type(raw).__name__}, expected list")
        for position, entry in enumerate(raw):
            _check_config_entry(entry, position, source)
        configs = [Config.from_dict(c) for c in raw]
        hit = (configs, configs_hash(configs))
        if len(_decoded_configs) >= _CACHE_SIZE:
            _decoded_configs.clear()
        _decoded_configs[key] = hit
    return list(hit[0]), hit[1]


_CONFIG_TYPES: dict[str, type] = {"kwargs": dict, "num_warps": int, "num_stages": int, "options": dict}


def _check_config_entry(entry: Any, position: int, source: str) -> None:
    """A config entry holds exactly its four fields, like the state around it: a field filled in by default
    would pass a lost `num_stages` for 3, and one this version drops would be gone at the next checkpoint."""
    if type(entry) is dict and entry.keys() == _CONFIG_TYPES.keys() and all(
            type(entry[name]) is kind for name, kind in _CONFIG_TYPES.items()):
        return
    where = f"configs[{position}]"
    if not isinstance(entry, dict):
        raise StateFileError(f"{source}: {where} is {type(entry).__name__}, expected a map")
    _check_field_set(entry, tuple(_CONFIG_TYPES), source, f"{where}: ")
    for name, kind in _CONFIG_TYPES.items():
        if type(entry[name]) is not kind:  # exact: True is not a warp count
            raise StateFileError(f"{source}: {where}.{name} is {type(entry[name]).__name__}, expected {kind.__name__}")


def unpack_state(blob: bytes, source: str = "<bytes>") -> TuneState:
    """Decode msgpack bytes into a TuneState, or raise StateFileError naming `source`.

    StateFileError is the only error this raises, whatever the bytes; MemoryError, which says nothing of
    them, is passed on (a sound file must not be set aside for it).
    """
    try:
        data = _read_top_map(blob, source)
    except (StateFileError, MemoryError):
        raise
    except Exception as exc:  # msgpack raises many types on damaged input
        raise StateFileError(f"{source}: not a msgpack state file{_damage(blob, exc)} "
                             f"({type(exc).__name__}: {exc})") from None
    try:
        return _state_from_data(data, source)
    except (StateFileError, MemoryError):
        raise
    except Exception as exc:
        raise StateFileError(f"{source}: malformed state ({type(exc).__name__}: {exc})") from None


def _damage(blob: bytes, exc: Exception) -> str:
    """What msgpack's error means for a file, in words a user acts on: an empty file, one cut short (a copy or a
    disk that stopped mid-write), or one that is not a single value (a text file, or bytes added after a state)."""
    if not blob:
        return ": the file is empty"
    if isinstance(exc, msgpack.OutOfData) or "incomplete input" in str(exc):
        return ": its bytes end inside a value (cut short, or not a state file at all)"
    if isinstance(exc, msgpack.ExtraData) or "extra data after the state" in str(exc):
        return ": more bytes follow its first value (a text file, say, or bytes added after a state)"
    return ""


@dataclass(frozen=True)
class FinishedTune:
    """What a finished tune offers a later tune of its kernel: its key and backend, when it ended, what it timed."""

    key: str
    backend: str
    fastest: tuple[Config, ...]  # every config it timed, fastest mean first (ties by index)
    finished_at: float  # when its last round ended, as the tune recorded it


def unpack_finished(blob: bytes, source: str = "<bytes>") -> FinishedTune | None:
    """The finished tune in a state's bytes, its timed configs alone decoded; None if it is not DONE with a best.

    A full decode builds every config of the list and the list's hash (70 ms
    for 1,150 configs); a new tune reads every finished tune of its kernel,
    whose lists differ where `prune_configs_by` pruned per shape. The
    checksum and every field read here are checked; what this reads is only
    ever a hint (the prior keeps configs the new list holds), and the tune
    itself is judged by `unpack_state` when it is loaded. StateFileError
    naming `source` for bytes that are no sound state.
    """
    try:
        data = _read_top_map(blob, source)
        schema = data.get("schema") if isinstance(data, dict) else None
        if type(schema) is not int or schema not in READABLE_SCHEMAS:  # as the full decode: True is no schema
            raise StateFileError(f"{source}: not a state of a schema this fasta-sm reads")
        if (CHECKSUM_FIELD in data) != (schema >= 2):  # a checksum only guards a file that must hold one
            raise StateFileError(f"{source}: a schema {schema} file {'without' if schema >= 2 else 'with'} "
                                 f"{CHECKSUM_FIELD}")
        if data.get("phase") != "DONE" or type(data.get("best")) is not int:
            return None
        _check_index_keys(data["durations"], "durations", source)  # "1" is index 1, as the full decode reads it
        durations = {int(i): [float(t) for t in timings] for i, timings in data["durations"].items()}
        if data["best"] not in durations:
            raise StateFileError(f"{source}: best config #{data['best']} was never measured")
        raw = _entries_at(data["configs"].blob, set(durations))
        if any(i not in raw for i in durations):
            raise StateFileError(f"{source}: durations name a config outside the list")
        if any(not timings or not all(0 < t <= LONGEST_US for t in timings) for timings in durations.values()):
            raise StateFileError(f"{source}: durations hold an invalid timing")  # would rank its config first
        means = {i: sample_mean(timings) for i, timings in durations.items()}
        fastest = sorted(means, key=lambda i: (means[i], i))
        for i in fastest:
            _check_config_entry(raw[i], i, source)
        last = data["rounds"][-1] if data["rounds"] else {}
        finished_at = float(last.get("finished") or last.get("started") or 0.0)
        if not math.isfinite(finished_at):  # it orders the kernel's tunes, newest first
            raise StateFileError(f"{source}: the last round's time {finished_at!r} is not finite")
        return FinishedTune(
            key=str(data["key"]),
            backend=str(data["backend"]),
            fastest=tuple(Config.from_dict(raw[i]) for i in fastest),
            finished_at=finished_at,
        )
    except (StateFileError, MemoryError):
        raise
    except Exception as exc:  # msgpack and the fields raise many types on damaged input
        raise StateFileError(f"{source}: malformed state ({type(exc).__name__}: {exc})") from None


def _entries_at(blob: bytes, wanted: set[Any]) -> dict[int, Any]:
    """The entries of a packed list at the positions `wanted` names, the others skipped over undecoded."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, use_list=True, max_buffer_size=max(len(blob), 1))
    unpacker.feed(blob)
    entries = {}
    for position in range(unpacker.read_array_header()):
        if position in wanted:
            entries[position] = unpacker.unpack()
        else:
            unpacker.skip()
    return entries


def peek_kernel(blob: bytes, complete: bool = True) -> str | None:
    """The kernel a state's bytes name, read from its leading fields without decoding the rest.

    `pack_state` writes `key` and `kernel` first, so this costs microseconds
    where `unpack_state` costs a millisecond: enough to tell a state dir's
    tunes of one kernel from the others. None for bytes that do not start
    like a state (the full decode is what judges a file). With `complete`
    False, `blob` is only a file's head: EOFError if it ends before the
    kernel does.
    """
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(blob), 1))
    try:
        unpacker.feed(blob)
        for _ in range(unpacker.read_map_header()):
            name = unpacker.unpack()
            if name == "kernel":
                kernel = unpacker.unpack()
                return kernel if isinstance(kernel, str) else None
            unpacker.skip()
    except msgpack.OutOfData:
        if not complete:
            raise EOFError("the bytes end before the kernel") from None
    except Exception:  # noqa: BLE001  msgpack raises many types on bytes that are not a map
        return None
    return None


def _types(values: Any) -> set[type]:
    return set(map(type, values))


class _RawConfigs:
    """The config list's msgpack bytes, left undecoded: decoding is cached per distinct list."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob


def _read_top_map(blob: bytes, source: str) -> Any:
    """`msgpack.unpackb(blob)`, except that a top-level map's "configs" stays raw bytes.

    Decoding a thousand configs into dicts costs more than all other fields
    together; skipping over them (no objects built) and keeping their bytes lets
    `_decode_configs` reuse an earlier decoding of the same list.
    """
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, use_list=True, max_buffer_size=max(len(blob), 1))
    unpacker.feed(blob)
    try:
        size = unpacker.read_map_header()
    except Exception:  # not a map at the top: decode plainly, for the plain error
        return msgpack.unpackb(blob, raw=False, strict_map_key=False, use_list=True)
    data: dict = {}
    body_start = unpacker.tell()
    for position in range(size):
        key_start = unpacker.tell()
        key = unpacker.unpack()
        if key == "configs":
            start = unpacker.tell()
            unpacker.skip()
            data[key] = _RawConfigs(bytes(blob[start:unpacker.tell()]))
        elif key in _INDEX_MAPS:
            start = unpacker.tell()
            data[key] = unpacker.unpack()
            _check_entry_count(key, data[key], memoryview(blob)[start : start + 5])
        elif key == CHECKSUM_FIELD:
            data[key] = unpacker.unpack()
            if position != size - 1:
                raise StateFileError(f"{source}: {CHECKSUM_FIELD} is not the last field")
            if zlib.crc32(memoryview(blob)[body_start:key_start]) != data[key]:
                raise StateFileError(f"{source}: checksum mismatch: the file was damaged after it was written")
        else:
            data[key] = unpacker.unpack()
    if unpacker.tell() != len(blob):
        raise ValueError(f"{len(blob) - unpacker.tell()} bytes of extra data after the state")
    return data


_INDEX_MAPS = ("compiled", "failed", "durations", "carried", "carried_taken")
_MAP_HEADERS = {0xDE: 2, 0xDF: 4}  # map16, map32: the entry count follows in this many bytes


def _check_entry_count(name: str, value: Any, header: memoryview) -> None:
    """Refuse a map keyed by config index that names one index in two entries.

    A dict keeps the last of two equal keys (and 1, 1.0 and True are equal),
    so the entry count msgpack wrote in the map's `header` is compared with
    what is left after decoding.
    """
    if not isinstance(value, dict):
        return
    width = _MAP_HEADERS.get(header[0])
    written = header[0] & 0x0F if width is None else int.from_bytes(header[1 : 1 + width], "big")  # fixmap: 0x8N
    if written != len(value):
        raise ValueError(f"{name} names one config index in two of its {written} entries")


def _state_from_data(data: Any, source: str) -> TuneState:
    if not isinstance(data, dict):
        raise StateFileError(f"{source}: top level is {type(data).__name__}, expected a map")
    schema = data.get("schema")
    if type(schema) is not int or schema not in READABLE_SCHEMAS:  # not 2.0 or True: the field is an int
        raise StateFileError(
            f"{source}: schema version {schema!r}; this fasta-sm ({__version__}) reads versions "
            f"{', '.join(map(str, READABLE_SCHEMAS))}"
        )
    if (CHECKSUM_FIELD in data) != (schema >= 2):
        raise StateFileError(f"{source}: a schema {schema} file {'without' if schema >= 2 else 'with'} "
                             f"{CHECKSUM_FIELD}")
    data = {name: value for name, value in data.items() if name != CHECKSUM_FIELD}
    if schema < 3:
        if "carried_taken" in data:
            raise StateFileError(f"{source}: a schema {schema} file with carried_taken")
        data["carried_taken"] = {}  # filled in below, from what the file still tells
    _check_field_set(data, _FIELD_NAMES, source)
    _check_types(data, source)
    data["configs"], list_hash = _decode_configs(data["configs"], source)
    if data["configs_hash"] != list_hash:  # checked before TuneState, which would fill in an empty hash
        raise StateFileError(f"{source}: configs_hash does not match the config list")
    data["rounds"] = [RoundRecord(**r) for r in data["rounds"]]
    data["cost"] = Cost(**data["cost"])
    # convert only where msgpack did not already give the exact types (it does for files we wrote)
    for name in ("compiled", "failed", "durations", "carried", "carried_taken"):
        _check_index_keys(data[name], name, source)
    if not (_types(data["compiled"]) <= {int} and _types(data["compiled"].values()) <= {float}):
        data["compiled"] = {int(k): float(v) for k, v in data["compiled"].items()}
    if not _types(data["failed"]) <= {int}:
        data["failed"] = {int(k): str(v) for k, v in data["failed"].items()}
    durations = data["durations"]
    if not (_types(durations) <= {int} and _types(chain.from_iterable(durations.values())) <= {float}):
        data["durations"] = {int(k): list(map(float, v)) for k, v in durations.items()}
    data["carried"] = {int(k): dict(v) for k, v in data["carried"].items()}
    data["carried_taken"] = {int(k): v for k, v in data["carried_taken"].items()}
    if schema < 3:  # a compile taken from a carried result whose timings wait is known; one used up is not
        data["carried_taken"] = {i: 0 for i in data["carried"] if i in data["compiled"]}
    state = TuneState(**data)
    _check_consistent(state, source)
    return state


_NUMBER = (int, float)
_OPTIONAL = type(None)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "key": (str,), "kernel": (str,), "policy": (str,), "backend": (str,), "configs_hash": (str,),
    "phase": (str,), "step": (str,), "library": (str,), "configs": (list, _RawConfigs),
    "policy_params": (dict,), "policy_state": (dict,), "rng_state": (dict,), "compiled": (dict,),
    "failed": (dict,), "durations": (dict,), "carried": (dict,), "carried_taken": (dict,), "cost": (dict,),
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
    for name in ("policy_params", "policy_state"):
        _check_nesting(data.get(name, {}), name, source)
    _check_plain(data.get("policy_params", {}), "policy_params", source)

    def each(where: str, values: Any, types: tuple[type, ...]) -> None:
        values = values if isinstance(values, (list, tuple)) else list(values)
        if not set(map(type, values)) <= set(types):  # fast path: msgpack gives exact types
            for value in values:
                check(where, value, types)

    for name in ("pending", "round_done"):
        each(f"{name} entry", data.get(name, ()), (int,))
    each("predicted_us entry", data.get("predicted_us", ()), _NUMBER)
    each("restarts entry", data.get("restarts", ()), (str,))
    for position, record in enumerate(data.get("rounds", ())):
        check(f"rounds[{position}]", record, (dict,))
        _check_field_set(record, _ROUND_FIELDS, source, f"rounds[{position}]: ")
        for name, value in record.items():
            check(f"rounds[{position}].{name}", value, _ROUND_TYPES.get(name, (object,)))
        each(f"rounds[{position}].batch entry", record.get("batch", ()), (int,))
        each(f"rounds[{position}].predicted_us entry", record.get("predicted_us", ()), _NUMBER)
    _check_field_set(data.get("cost", {}), _COST_FIELDS, source, "cost: ")
    for name, value in data.get("cost", {}).items():
        check(f"cost.{name}", value, _NUMBER)
    each("compiled value", data.get("compiled", {}).values(), _NUMBER)
    each("failed value", data.get("failed", {}).values(), (str,))
    durations = data.get("durations", {})
    each("durations value", durations.values(), (list,))
    each("durations entry", chain.from_iterable(durations.values()), _NUMBER)
    each("carried_taken value", data.get("carried_taken", {}).values(), (int,))
    for index, carried in data.get("carried", {}).items():
        check(f"carried[{index!r}]", carried, (dict,))
        check(f"carried[{index!r}].compile_s", carried.get("compile_s"), (*_NUMBER, _OPTIONAL))
        check(f"carried[{index!r}].error", carried.get("error"), (str, _OPTIONAL))
        check(f"carried[{index!r}].durations_us", carried.get("durations_us", []), (list,))
        for value in carried.get("durations_us", []):
            check(f"carried[{index!r}].durations_us entry", value, _NUMBER)


MOST_NESTED = 32
"""Lists and maps in lists and maps, at most: no state nests deeper, and printing or checking deeper ones would
run out of stack."""


def _check_nesting(value: Any, where: str, source: str) -> None:
    """No list or map nested more than `MOST_NESTED` deep (checked without recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MOST_NESTED:
                raise StateFileError(f"{source}: {where} nests lists or maps more than {MOST_NESTED} deep")
            stack.extend((inner, depth + 1) for inner in (item.values() if isinstance(item, dict) else item))


def _check_plain(value: Any, where: str, source: str) -> None:
    """Parameters are what a caller passes and `show --json` prints: null, bools, numbers, text, lists, maps
    (nested no deeper than `_check_nesting` lets through)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise StateFileError(f"{source}: {where} has key {key!r}, not a name")
            _check_plain(item, f"{where}.{key}", source)
    elif isinstance(value, list):
        for position, item in enumerate(value):
            _check_plain(item, f"{where}[{position}]", source)
    elif isinstance(value, float) and not math.isfinite(value):
        raise StateFileError(f"{source}: {where} is {value!r}, not a finite number")
    elif value is not None and not isinstance(value, (bool, int, float, str)):
        raise StateFileError(f"{source}: {where} is {type(value).__name__}, not a parameter value")


def _check_field_set(record: dict, names: tuple[str, ...], source: str, where: str = "") -> None:
    """The state, each config, round and the cost hold exactly their fields: a default for a lost one would hide a lost
    RNG or policy state, or pass for a measured 0; a field this version does not know needs a newer schema."""
    missing = [name for name in names if name not in record]
    if missing:
        raise StateFileError(f"{source}: {where}missing field(s) {', '.join(missing)}")
    unknown = sorted(map(str, set(record) - set(names)))
    if unknown:
        raise StateFileError(f"{source}: {where}unknown field(s) {', '.join(unknown)}")


def _check_index_keys(mapping: dict, name: str, source: str) -> None:
    """Config indices as keys: whole numbers, or their decimal text; int() would take True or 2.9 for an index."""
    if _types(mapping) <= {int}:
        return
    for key in mapping:
        if isinstance(key, bool) or not (isinstance(key, int) or (isinstance(key, str) and key.isdecimal())):
            raise StateFileError(f"{source}: {name} has key {key!r}, not a config index")
    if len({int(key) for key in mapping}) != len(mapping):  # 1 and "1", or "1" and "01"
        raise StateFileError(f"{source}: {name} names one config index in two of its {len(mapping)} entries")


def _carried_numbers(carried: dict) -> list[float]:
    """A carried result's compile seconds and timings: numbers that must be finite and ≥ 0."""
    seconds = carried.get("compile_s")
    return ([] if seconds is None else [seconds]) + list(carried.get("durations_us", ()))


def _check_consistent(state: TuneState, source: str) -> None:
    """Reject states whose parts contradict each other: resuming them would mislead."""
    n = state.n_configs
    if n == 0:
        raise StateFileError(f"{source}: empty config list")
    if state.phase not in PHASES or state.step not in STEPS:
        raise StateFileError(f"{source}: unknown position phase={state.phase!r} step={state.step!r}")
    if (state.phase == "DONE") != (state.step == "done"):
        raise StateFileError(f"{source}: phase {state.phase!r} with step {state.step!r}")
    if not state.done and not state.rounds:
        raise StateFileError(f"{source}: at {state.position()} without a round record")
    for name in ("pending", "round_done", "compiled", "failed", "durations", "carried", "carried_taken"):
        indices = list(getattr(state, name))
        if not indices or (set(map(type, indices)) <= {int} and min(indices) >= 0 and max(indices) < n):
            continue
        bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < n]
        if bad:
            raise StateFileError(f"{source}: {name} holds index {bad[0]!r} outside 0..{n - 1}")
    flat = list(chain.from_iterable(state.durations.values()))
    if flat and (min(flat) <= 0 or max(flat) > LONGEST_US or any(map(math.isnan, flat))) or not all(
        state.durations.values()
    ):  # a timing past the engine's bound (older files hold some) would stop every tune that carried it
        for index, samples in state.durations.items():
            if not samples or any(not 0 < x <= LONGEST_US for x in samples):
                raise StateFileError(f"{source}: config #{index} has invalid durations {samples!r}")
    stamps = [("created", state.created), ("updated", state.updated)]
    for position, record in enumerate(state.rounds):
        stamps += [(f"rounds[{position}].started", record.started), (f"rounds[{position}].finished", record.finished)]
    for where, stamp in stamps:
        if stamp is not None and not math.isfinite(stamp):
            raise StateFileError(f"{source}: {where} is {stamp!r}, not a time")
    both = state.failed.keys() & state.durations.keys()
    if both:
        raise StateFileError(f"{source}: config #{min(both)} is both failed and measured")
    seconds = [
        ("compiled", state.compiled.values()),
        ("cost", (state.cost.compile_s, state.cost.benchmark_s, state.cost.policy_s)),
        *((f"carried[{i}]", _carried_numbers(c)) for i, c in state.carried.items()),
        *(
            (f"rounds[{k}]", (r.compile_s, r.benchmark_s, r.policy_s))
            for k, r in enumerate(state.rounds)
        ),
    ]
    for where, values in seconds:
        values = list(values)
        if values and (min(values) < 0 or not all(map(math.isfinite, values))):
            raise StateFileError(f"{source}: {where} holds {values!r:.80}: seconds and timings must be finite and ≥ 0")
    if not math.isfinite(state.cost.total_s):
        raise StateFileError(f"{source}: cost's seconds add up to more than a number can hold")
    for index, carried in state.carried.items():
        if any(not 0 < x <= LONGEST_US for x in carried.get("durations_us", ())):  # as for `durations`
            raise StateFileError(f"{source}: carried[{index}] has invalid durations {carried['durations_us']!r}")
    never = state.durations.keys() - state.compiled.keys()
    if never:  # a timing is taken of a compiled config only; a re-time would compile it, and fail it, again
        raise StateFileError(f"{source}: config #{min(never)} is measured but was never compiled")
    if state.predicted_us and len(state.predicted_us) != n:
        raise StateFileError(f"{source}: predicted_us has {len(state.predicted_us)} values for {n} configs")
    for position, record in enumerate(state.rounds):
        if record.batch and not (min(record.batch) >= 0 and max(record.batch) < n):
            raise StateFileError(f"{source}: rounds[{position}].batch holds an index outside 0..{n - 1}")
        if record.predicted_us and len(record.predicted_us) != len(record.batch):
            raise StateFileError(
                f"{source}: rounds[{position}] predicts {len(record.predicted_us)} values for "
                f"{len(record.batch)} configs"
            )
    if not state.done and not state.pending:
        raise StateFileError(f"{source}: at {state.position()} no config is pending (a round in progress has a batch)")
    waiting = state.uncompiled()
    if waiting and (state.step == "refine" or (state.step == "benchmark" and not state.ready_to_time())):
        # a benchmark step times what compiled while the rest compiles on; it needs something to time
        raise StateFileError(f"{source}: at {state.position()} config #{waiting[0]} of the batch was never compiled")
    if state.step == "refine":
        untimed = state.untimed()
        if untimed:
            raise StateFileError(f"{source}: at {state.position()} config #{untimed[0]} of the batch was never timed")
    if state.durations and state.best is None:
        raise StateFileError(f"{source}: {len(state.durations)} configs measured but no best")
    if (state.best is None) != (state.best_us is None):
        raise StateFileError(f"{source}: best={state.best!r} with best_us={state.best_us!r}")
    if state.best is not None and state.best not in state.durations:
        raise StateFileError(f"{source}: best config #{state.best} was never measured")
    if state.best is not None and state.best_us not in (
        state.mean_us(state.best), _compensated_mean(state.durations[state.best])
    ):  # the second as Python 3.12+'s sum() gave it, for files written there before sample_mean
        raise StateFileError(
            f"{source}: best_us={state.best_us!r} is not the mean timing of config #{state.best} "
            f"({state.mean_us(state.best)!r})"
        )
    if state.phase == "DONE" and state.best is None:
        raise StateFileError(f"{source}: DONE without a winner")
    _check_best_is_fastest(state, source)
    _check_rounds(state, source)
    _check_carried(state, source)
    if state.rng_state:
        decode_rng(state.rng_state)
    elif state.rounds:  # the machine keeps the RNG with every decision; re-seeding would change the next ones
        raise StateFileError(f"{source}: rng_state is empty after {len(state.rounds)} round(s)")


def _check_best_is_fastest(state: TuneState, source: str) -> None:
    """`best` is the fastest mean measured (ties to the lower index), as the machine keeps it."""
    if not state.durations:
        return
    indices = list(state.durations)
    means = [sample_mean(x) for x in state.durations.values()]
    low = min(means)
    fastest = indices[means.index(low)]
    if means.count(low) > 1:  # a tie goes to the lower index, whatever order the map holds them in
        fastest = min(index for index, mean in zip(indices, means) if mean == low)
    if state.best != fastest:
        raise StateFileError(
            f"{source}: best is config #{state.best} ({state.best_us!r} µs), "
            f"but config #{fastest} was measured faster ({low!r} µs)"
        )


def _check_rounds(state: TuneState, source: str) -> None:
    """Rounds are R1, then R2_1, R2_2, …; the state stands at the last one, its batch pending."""
    for position, record in enumerate(state.rounds):
        expected = ("R1", 0) if position == 0 else ("R2", position)
        if (record.phase, record.round) != expected:
            raise StateFileError(
                f"{source}: rounds[{position}] is {record.phase} round {record.round}, "
                f"expected {round_name(*expected)}"
            )
    if len(set(state.pending)) != len(state.pending):
        raise StateFileError(f"{source}: at {state.position()} the pending batch lists a config twice")
    timed = set(state.round_done)
    if len(timed) != len(state.round_done) or not timed <= set(state.pending):
        raise StateFileError(f"{source}: at {state.position()} round_done lists a config twice or off the batch")
    untimed = timed.difference(state.durations, state.failed)
    if untimed:
        raise StateFileError(
            f"{source}: at {state.position()} config #{min(untimed)} is listed as timed but has no timing"
        )
    if not state.rounds:
        return
    last = state.rounds[-1]
    if state.round != last.round or (not state.done and state.phase != last.phase):
        raise StateFileError(
            f"{source}: at {state.phase} round {state.round}, but its last round record is {last.name}"
        )
    if state.done:
        return
    if state.pending != last.batch or state.retime != last.retime:
        raise StateFileError(f"{source}: at {state.position()} the pending batch is not {last.name}'s")


def _check_carried(state: TuneState, source: str) -> None:
    """A carried result waits for a config not measured yet: `{error}`, or `{compile_s, durations_us}`.

    A config compiled from its carried result keeps the entry until its
    timings are taken, and only then; `carried_taken` names every config
    whose compile outcome came from one, with the number of its timings that
    did (at most those it has, unless a later timing failed it).
    """
    for index, carried in state.carried.items():
        unknown = set(carried) - {"compile_s", "durations_us", "error"}
        if unknown:
            names = ", ".join(sorted(map(str, unknown)))
            raise StateFileError(f"{source}: carried[{index}] has unknown field(s) {names}")
        if index in state.durations or index in state.failed:
            raise StateFileError(f"{source}: carried[{index}] is for config #{index}, measured already")
        if carried.get("error") is not None:
            if carried.get("durations_us"):
                raise StateFileError(f"{source}: carried[{index}] failed and has timings")
            if index in state.compiled:
                raise StateFileError(f"{source}: carried[{index}] failed, but config #{index} is compiled")
        elif carried.get("compile_s") is None:
            raise StateFileError(f"{source}: carried[{index}] has neither an error nor compile seconds")
        elif index in state.compiled and not carried.get("durations_us"):
            raise StateFileError(f"{source}: carried[{index}] is for config #{index}, compiled already")
        elif index in state.compiled and state.carried_taken.get(index) != 0:
            raise StateFileError(f"{source}: config #{index} is compiled from carried[{index}], "
                                 "which carried_taken does not say")
    for index, taken in state.carried_taken.items():
        if index not in state.compiled and index not in state.failed:
            raise StateFileError(f"{source}: carried_taken names config #{index}, neither compiled nor failed")
        if taken < 0 or (taken > len(state.durations.get(index, ())) and index not in state.failed):
            raise StateFileError(f"{source}: carried_taken says {taken!r} timings of config #{index} were carried, "
                                 f"of the {len(state.durations.get(index, ()))} it has")
