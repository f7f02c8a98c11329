"""Replay: tune against a recorded exhaustive table, with no GPU.

Compiling a config charges its recorded `compile_s`; benchmarking returns its
recorded mean, optionally with noise drawn to match the recorded spread. The
noise of a config's k-th timing depends only on (seed, the table's kernel, the
config's row, k), so a tune resumed in another process sees exactly what an
uninterrupted one would, and two tables with the same config list (one kernel
at two shapes) do not share their noise under one seed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import sys
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config
from ..errors import ConfigError, TableError
from ..protocols import LONGEST_S, LONGEST_US, BenchmarkOutcome, CompileOutcome

BENCH_OVERHEAD_S = 0.125
"""Seconds one timing costs on a live device: `triton.testing.do_bench`'s default
25 ms warm-up plus 100 ms of repeats, charged per config benchmarked."""

CACHE_HIT_S = 0.05
"""Compile seconds below which a recorded compile was a load from Triton's on-disk
cache, not a compile: on the H200 tables real compiles take 0.0696 s or more, and
the cache hits once recorded by mistake 0.006 s or less (docs/recording.md)."""

DISTURBED_SPREAD = 0.5
"""A config's timings spread over more than this share of their fastest (the slowest over 1.5x the fastest)
were disturbed while recording: on the H200 tables one config's two passes differ by 26 % at most, and a
disturbance once doubled a run of timings in one pass (docs/recording.md). Such a mean is not the config's."""

INTERPRETER_TIMING = "host-clock median under the Triton interpreter"
"""How a table recorded under Triton's interpreter names its timing method (`timing.method` starts so)."""

log = logging.getLogger("fasta_sm.replay")

_TOP_FIELDS = ("kernel", "shape", "device", "torch", "triton", "configs")
_CONFIG_FIELDS = ("kwargs", "num_warps", "num_stages", "compile_s", "duration_us", "error")


@dataclass(frozen=True)
class ReplayTable:
    """One kernel's recorded config space (see shared replay-format, v1)."""

    kernel: str
    configs: list[Config]
    compile_s: np.ndarray
    samples_us: list[list[float]]
    errors: list[str | None]
    meta: dict[str, Any]
    source: str

    @property
    def mean_us(self) -> np.ndarray:
        """Recorded mean per config; NaN where the config failed."""
        return np.array([float(np.mean(s)) if e is None else math.nan for s, e in zip(self.samples_us, self.errors)])

    @property
    def exhaustive_cost_s(self) -> float:
        """What exhaustive tuning costs: compile every config, time every one that compiled, once."""
        ran = sum(1 for error in self.errors if error is None)
        return float(np.sum(self.compile_s)) + BENCH_OVERHEAD_S * ran

    @property
    def true_best_us(self) -> float:
        return float(np.nanmin(self.mean_us))

    @property
    def true_best(self) -> int:
        return int(np.nanargmin(self.mean_us))

    @functools.cached_property
    def fingerprint(self) -> str:
        """12 hex digits of a hash of everything a replay reads: two tables of one kernel name tell apart."""
        content = [
            self.kernel,
            str(self.meta.get("device", "")),
            [c.identity for c in self.configs],
            [float(x) for x in self.compile_s],
            self.samples_us,
            self.errors,
        ]
        return hashlib.sha256(json.dumps(content).encode()).hexdigest()[:12]

    def index_of(self, config: Config) -> int:
        return self._index[config.identity]

    def within(self, share: float) -> int:
        """How many configs run within `share` of the best mean (0.02: within 2 %); a needle has few."""
        return int(np.sum(self.mean_us <= self.true_best_us * (1.0 + share)))

    def cache_hits(self) -> int:
        """How many compile times are below `CACHE_HIT_S`: a table with any understates its cost.

        Zero for a table recorded under Triton's interpreter, which compiles nothing (every `compile_s` is 0).
        """
        if self.interpreted:
            return 0
        return int(np.sum(self.compile_s < CACHE_HIT_S))

    def disturbed(self) -> int:
        """How many configs' timings spread over `DISTURBED_SPREAD`: a table with any misstates those configs' speed.

        Zero for a table recorded under Triton's interpreter, whose host-clock timings are no device's.
        """
        if self.interpreted:
            return 0
        return count_disturbed(s for s, e in zip(self.samples_us, self.errors) if e is None)

    @property
    def interpreted(self) -> bool:
        """Recorded under Triton's interpreter: nothing compiled, timings by a host clock."""
        return timed_by_interpreter(self.meta)

    def repeat_spread(self) -> np.ndarray:
        """Per config timed more than once, its repeats' range over their minimum: the device's noise."""
        return repeat_spreads(s for s, e in zip(self.samples_us, self.errors) if e is None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {c.identity: i for i, c in enumerate(self.configs)})


def timed_by_interpreter(table: Mapping[str, Any]) -> bool:
    """Whether a table (its JSON object) was recorded under Triton's interpreter, by its `timing.method`."""
    timing = table.get("timing")  # not a documented field: a recorder of another kind may write anything there
    return isinstance(timing, dict) and str(timing.get("method", "")).startswith(INTERPRETER_TIMING)


def repeat_spreads(samples_us: Iterable[Sequence[float]]) -> np.ndarray:
    """Per config timed more than once, the range of its timings over their minimum."""
    return np.array([(max(s) - min(s)) / min(s) for s in samples_us if len(s) > 1], dtype=float)


def count_disturbed(samples_us: Iterable[Sequence[float]]) -> int:
    """How many of these configs' timings spread over `DISTURBED_SPREAD`; the recorder asks before a table loads."""
    return int(np.sum(repeat_spreads(samples_us) > DISTURBED_SPREAD))


def load_table(path: str | Path) -> ReplayTable:
    """Read a replay table strictly: every documented field, no duplicate configs, no documented key written
    twice; extra fields are kept or ignored, whatever they hold (the format is lenient about them)."""
    path = Path(path)
    try:  # any file it names, a pipe too (`--replay <(zcat t.json.gz)`); a folder's are listed as regular files
        text = path.read_text(encoding="utf-8-sig")  # UTF-8, its byte-order mark (as some editors write) read past
    except FileNotFoundError:
        raise TableError(f"{path}: no such replay table") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TableError(f"{path}: not a JSON replay table ({type(exc).__name__}: {exc})") from None
    return table_from_text(text, str(path))


def table_from_text(text: str, source: str) -> ReplayTable:
    """A table from its JSON text, read as `load_table` reads a file: what the recorder writes is checked so."""
    try:  # the checks recurse too, deeper in the stack than the parser: a depth it took may end there
        data = json.loads(text, object_pairs_hook=_object_noting_repeats, parse_int=_int, parse_constant=_Literal)
        return table_from_dict(data, source)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise TableError(f"{source}: not a JSON replay table ({type(exc).__name__}: {exc})") from None


def _int(digits: str) -> int | float:
    """A JSON integer; one longer than Python converts (4300 digits by default) is the float it is, ±inf."""
    try:
        return int(digits)
    except ValueError:
        return float(digits)


class _Literal(float):
    """A `NaN`, `Infinity` or `-Infinity` literal, which Python's json reads but JSON has not: refused in a
    documented field whatever its type check, kept in an extra one."""

    def __repr__(self) -> str:
        return "NaN" if math.isnan(self) else ("Infinity" if self > 0 else "-Infinity")


class _Object(dict):  # type: ignore[type-arg]
    """A JSON object that remembers the keys it was given twice (`json` keeps only the last value)."""

    repeated: tuple[str, ...] = ()


def _object_noting_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = _Object()
    repeated = []
    for key, value in pairs:
        if key in data:
            repeated.append(key)
        data[key] = value
    data.repeated = tuple(repeated)
    return data


def _repeat_in(value: Any, documented: Iterable[str] | None = None) -> str | None:
    """The first key written twice in `value`: among its own keys in `documented`, or anywhere in it if None."""
    if documented is not None:
        return next((k for k in getattr(value, "repeated", ()) if k in documented), None)
    return next((str(item.repeated[0]) for item in _nested(value) if getattr(item, "repeated", ())), None)


def _literal_in(value: Any) -> _Literal | None:
    """A `NaN` or `Infinity` literal anywhere in `value`, if it holds one."""
    return next((item for item in _nested(value) if isinstance(item, _Literal)), None)


def _nested(value: Any) -> Iterator[Any]:
    """`value` and every object, array and scalar inside it, iteratively: a shape as deep as the parser takes is
    no RecursionError here."""
    stack = [value]
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _refuse_repeats(where: str, key: str | None) -> None:
    if key is not None:
        raise TableError(f"{where}; JSON keeps only the last")


def table_from_dict(data: Any, source: str) -> ReplayTable:
    if not isinstance(data, dict):
        raise TableError(f"{source}: top level must be a JSON object")
    for name in _TOP_FIELDS:
        if name not in data:
            raise TableError(f"{source}: missing field {name!r}")
    key = _repeat_in(data, _TOP_FIELDS)
    _refuse_repeats(f"{source}: key {key!r} appears twice", key)
    key = _repeat_in(data["shape"])
    _refuse_repeats(f"{source}: key {key!r} appears twice in shape", key)
    if not isinstance(data["shape"], dict):
        raise TableError(f"{source}: shape={data['shape']!r} must be an object")
    literal = _literal_in(data["shape"])
    if literal is not None:
        raise TableError(f"{source}: shape holds {literal!r}, which is no JSON value")
    for name in ("device", "torch", "triton"):
        if not isinstance(data[name], str):
            raise TableError(f"{source}: {name}={data[name]!r} must be a string")
    _check_text(source, _documented(data))
    rows = data["configs"]
    if not isinstance(rows, list) or not rows:
        raise TableError(f"{source}: 'configs' must be a non-empty list")
    configs, compile_s, samples, errors = [], [], [], []
    seen: dict[str, int] = {}
    for index, row in enumerate(rows):
        where = f"{source}: configs[{index}]"
        if not isinstance(row, dict):
            raise TableError(f"{where} is not an object")
        for name in _CONFIG_FIELDS:
            if name not in row:
                raise TableError(f"{where}: missing field {name!r}")
        key = _repeat_in(row, (*_CONFIG_FIELDS, "options")) or _repeat_in(row["kwargs"])
        _refuse_repeats(f"{source}: key {key!r} appears twice in configs[{index}]", key)
        try:
            config = Config(kwargs=row["kwargs"], num_warps=row["num_warps"], num_stages=row["num_stages"])
        except (ConfigError, AttributeError, TypeError) as exc:
            raise TableError(f"{where}: {exc}") from None
        first = seen.setdefault(config.identity, index)  # the format's identity: kwargs, warps, stages
        if first != index:
            raise TableError(f"{where} duplicates configs[{first}] ({config.label()})")
        config = _with_options(config, row.get("options"))
        seconds, durations, error = row["compile_s"], row["duration_us"], row["error"]
        if not _is_number(seconds) or not 0 <= seconds <= LONGEST_S:
            raise TableError(f"{where}: compile_s={seconds!r} must be a number from 0 to {LONGEST_S:g}")
        if error is not None and not isinstance(error, str):
            raise TableError(f"{where}: error={error!r} must be a string or null")
        if not isinstance(durations, list) or not all(_is_number(d) and 0 < d <= LONGEST_US for d in durations):
            raise TableError(f"{where}: duration_us={durations!r} must be a list of numbers from 0 (excluded) "
                             f"to {LONGEST_US:g}")
        if error is None and not durations:
            raise TableError(f"{where}: no durations and no error")
        if error is not None and durations:
            raise TableError(f"{where}: a config that failed ({error}) has no durations, not {durations!r}")
        configs.append(config)
        compile_s.append(float(seconds))
        samples.append([float(d) for d in durations] if error is None else [])
        errors.append(error)
    if all(e is not None for e in errors):
        raise TableError(f"{source}: every config failed; the table has no best")
    kernel = data["kernel"]
    if not isinstance(kernel, str) or not kernel:
        raise TableError(f"{source}: kernel={kernel!r} must be a non-empty string")
    meta = {k: v for k, v in data.items() if k != "configs"}
    return ReplayTable(kernel, configs, np.array(compile_s), samples, errors, meta, source)


def _documented(data: dict[str, Any]) -> dict[str, Any]:
    """The fields the reader reads (a row's `options` among them): extra fields may hold any text."""
    rows = data["configs"]
    if isinstance(rows, list):
        read = (*_CONFIG_FIELDS, "options")
        rows = [{k: v for k, v in row.items() if k in read} if isinstance(row, dict) else row for row in rows]
    return {**{name: data[name] for name in _TOP_FIELDS}, "configs": rows}


def _check_text(source: str, data: dict[str, Any]) -> None:
    """Refuse a string that is not Unicode text (a lone surrogate, which JSON's `\\ud800` escape decodes to),
    naming its row if it is in one: no state file, which is UTF-8, could hold it. The whole table is checked
    at once; only a table that fails is searched row by row."""
    try:
        json.dumps(data, ensure_ascii=False, default=repr).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start:exc.end]
        rows = data["configs"] if isinstance(data["configs"], list) else []
        at = next((i for i, row in enumerate(rows) if bad in json.dumps(row, ensure_ascii=False, default=repr)), None)
        where = source if at is None else f"{source}: configs[{at}]"
        raise TableError(f"{where}: {bad!r} is not Unicode text (a lone surrogate escape)") from None


def _with_options(config: Config, options: Any) -> Config:
    """`config` with the launch options this project's recorder writes beside a row (`maxnreg`, `num_ctas`):
    an extra field, so one written otherwise by another recorder is left out rather than refused."""
    if options is None or options == {}:
        return config
    try:
        if not isinstance(options, dict):
            raise ConfigError(f"options={options!r} is not an object")
        if getattr(options, "repeated", ()):
            raise ConfigError(f"option {options.repeated[0]!r} is written twice")
        return Config(dict(config.kwargs), config.num_warps, config.num_stages, options=options)
    except ConfigError as exc:
        log.info("%s: options left out: %s", config.label(), exc)
        return config


def _is_number(value: Any) -> bool:
    """A finite JSON number: an integer too large for a float is not one (math.isfinite would overflow on it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) if isinstance(value, float) else abs(value) <= sys.float_info.max


REPLAY = "replay"
MEANS = "recorded means"


def is_replay(backend: str) -> bool:
    """Whether a state's backend description is a replay's: its seconds were read from a table, not spent."""
    return backend.split(" ", 1)[0] == REPLAY


def replays_means(backend: str) -> bool:
    """Whether a state's backend description is a replay of the recorded means, without noise."""
    return is_replay(backend) and backend.endswith(f", {MEANS})")


class ReplayBackend:
    """A backend that answers from a replay table instead of a device."""

    def __init__(self, table: ReplayTable, *, noise: bool = False, seed: int = 0) -> None:
        self.table = table
        self.noise = noise
        self.seed = seed
        self._stream = zlib.crc32(table.kernel.encode("utf-8", "surrogatepass"))

    def describe(self) -> str:
        mode = f"noise seed {self.seed}" if self.noise else MEANS
        return f"{REPLAY} {self.table.kernel} ({self.table.meta.get('device', 'unknown device')}, {mode})"

    def compile(self, configs: Sequence[Config]) -> list[CompileOutcome]:
        outcomes = []
        for config in configs:
            index = self._index(config)
            outcomes.append(CompileOutcome(error=self.table.errors[index], seconds=float(self.table.compile_s[index])))
        return outcomes

    def benchmark(self, configs: Sequence[Config], repeat: Sequence[int] | None = None) -> BenchmarkOutcome:
        repeat = repeat if repeat is not None else [0] * len(configs)
        durations, errors = [], {}
        for position, (config, k) in enumerate(zip(configs, repeat)):
            index = self._index(config)
            if self.table.errors[index] is not None:
                durations.append(math.inf)
                errors[position] = self.table.errors[index]
                continue
            durations.append(self.timing(index, k))
        return BenchmarkOutcome(durations_us=durations, seconds=BENCH_OVERHEAD_S * len(configs), errors=errors)

    def timing(self, index: int, repeat: int = 0) -> float:
        """The k-th timing of config `index`: its recorded mean, plus noise if enabled."""
        samples = self.table.samples_us[index]
        mean = float(np.mean(samples))
        if not self.noise or len(samples) < 2:
            return mean
        spread = float(np.std(samples, ddof=1))
        draw = np.random.default_rng([self.seed, self._stream, index, repeat]).standard_normal()
        return min(max(mean + spread * draw, mean * 0.5), LONGEST_US)  # a timing the engine takes

    def _index(self, config: Config) -> int:
        try:
            return self.table.index_of(config)
        except KeyError:
            raise TableError(f"{self.table.source}: config {config.label()} is not in the table") from None
