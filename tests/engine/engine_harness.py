"""Helpers shared by the engine tests and the processes they start.

Importable both from pytest (tests/engine is on sys.path) and from child
processes (forked, or started with `python -m` / a script that puts this folder
on sys.path). Nothing here is a production hook: everything that makes a child
slow, log or crash lives in this file and wraps the public engine API.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack

from fasta_sm.config import Config
from fasta_sm.protocols import BenchmarkOutcome, CompileOutcome

# --------------------------------------------------------------------------- tables

BLOCK_M = (16, 32, 64, 128)
BLOCK_N = (32, 64, 128)
WARPS = (2, 4)
STAGES = (2, 3)


def synthetic_table(kernel: str = "mm_synth") -> dict[str, Any]:
    """A 48-config space in the shared replay format (v1).

    Durations have two repeats (a spread for noise); five configs carry a
    recorded compile failure (no durations), as the recorder writes them.
    """
    rows = []
    for bm in BLOCK_M:
        for bn in BLOCK_N:
            for warps in WARPS:
                for stages in STAGES:
                    kwargs = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32, "GROUP_M": 8}
                    fails = (bm == 128 and bn == 128) or (bm == 128 and bn == 64 and stages == 3 and warps == 2)
                    compile_s = round(0.2 + 0.01 * bm / 16 + 0.003 * bn / 32 + 0.05 * stages, 4)
                    if fails:
                        rows.append({
                            "kwargs": kwargs, "num_warps": warps, "num_stages": stages,
                            "compile_s": compile_s, "duration_us": [],
                            "error": "OutOfResources: out of resource: shared memory, Required: 262144",
                        })
                        continue
                    # A bowl with its minimum near BLOCK_M=64, BLOCK_N=64, 4 warps, 3 stages.
                    base = 100.0 + 8.0 * abs(math.log2(bm / 64)) ** 2 + 6.0 * abs(math.log2(bn / 64)) ** 2
                    base *= 1.0 + (0.07 if warps == 2 else 0.0) + (0.04 if stages == 2 else 0.0)
                    base += 0.37 * ((bm * 7 + bn * 3 + warps * 5 + stages) % 11)  # break ties
                    spread = 0.01 * base
                    rows.append({
                        "kwargs": kwargs, "num_warps": warps, "num_stages": stages,
                        "compile_s": compile_s,
                        "duration_us": [round(base - spread / 2, 3), round(base + spread / 2, 3)],
                        "error": None,
                    })
    return {
        "kernel": kernel,
        "shape": {"M": 1024, "N": 1024, "K": 1024, "dtype": "fp16"},
        "device": "synthetic",
        "torch": "none",
        "triton": "none",
        "configs": rows,
    }


def write_table(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- backends


class CountingBackend:
    """Wraps a backend and counts compile and benchmark calls (and configs)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.compile_calls = 0
        self.benchmark_calls = 0
        self.compiled: list[Config] = []
        self.benchmarked: list[Config] = []

    def describe(self) -> str:
        return self.inner.describe()

    def compile(self, configs: Sequence[Config]) -> list[CompileOutcome]:
        self.compile_calls += 1
        self.compiled.extend(configs)
        return self.inner.compile(configs)

    def benchmark(self, configs: Sequence[Config], repeat: Sequence[int] | None = None) -> BenchmarkOutcome:
        self.benchmark_calls += 1
        self.benchmarked.extend(configs)
        return self.inner.benchmark(configs, repeat=repeat)


class LoggingBackend:
    """A replay backend that appends every timing it hands out to a log file.

    One JSON line per benchmarked config, `{"tag", "pid", "index", "k", "us"}`,
    written with a single O_APPEND write and fsynced *before* the timings are
    returned to the engine: so the log is a superset of what any checkpoint can
    hold, and survives a SIGKILL that comes right after. `delay_s` adds a random
    sleep (from an RNG of its own, never the tune's) to each call, so a kill at
    a random wall-clock time lands anywhere in a tune.
    """

    def __init__(self, inner: Any, log_path: str | os.PathLike[str], tag: str = "", delay_s: float = 0.0) -> None:
        self.inner = inner
        self.log_path = str(log_path)
        self.tag = tag
        self.delay_s = delay_s
        self._sleep_rng = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "little"))

    def describe(self) -> str:
        return self.inner.describe()

    def _pause(self) -> None:
        if self.delay_s:
            time.sleep(self._sleep_rng.uniform(0, self.delay_s))

    def compile(self, configs: Sequence[Config]) -> list[CompileOutcome]:
        self._pause()
        return self.inner.compile(configs)

    def benchmark(self, configs: Sequence[Config], repeat: Sequence[int] | None = None) -> BenchmarkOutcome:
        self._pause()
        outcome = self.inner.benchmark(configs, repeat=repeat)
        repeat = list(repeat) if repeat is not None else [0] * len(configs)
        lines = []
        for config, k, us in zip(configs, repeat, outcome.durations_us):
            index = self.inner.table.index_of(config)
            lines.append(json.dumps({"tag": self.tag, "pid": os.getpid(), "index": index, "k": k,
                                     "us": None if math.isinf(us) else us}))
        append_fsynced(self.log_path, "".join(line + "\n" for line in lines))
        self._pause()
        return outcome


def append_fsynced(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The benchmark log's entries (a torn last line, if a kill tore one, is dropped)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    entries = []
    for line in text.splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return entries


# --------------------------------------------------------------------------- slow writes


def slow_down_state_writes(max_sleep_s: float, seed: int | None = None) -> None:
    """In this (child) process only: sleep at random inside StateStore.write.

    The store writes temp file → fsync → os.replace → fsync(dir). Wrapping
    `os.fsync` and `os.replace` (the functions the store module calls) with a
    random sleep widens the windows between those steps, so a SIGKILL at a
    random time often lands mid-write: after the temp file is written but
    before it replaces the state file, or before the directory is synced.
    The production code is untouched; only this process's `os` module is.
    """
    rng = random.Random(seed)
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        time.sleep(rng.uniform(0, max_sleep_s))
        real_fsync(fd)

    def replace(src: Any, dst: Any, **kw: Any) -> None:
        time.sleep(rng.uniform(0, max_sleep_s))
        real_replace(src, dst, **kw)

    os.fsync = fsync  # type: ignore[assignment]
    os.replace = replace  # type: ignore[assignment]


def seal(data: dict[str, Any], use_bin_type: bool = True, raw: dict[str, bytes] | None = None) -> bytes:
    """`data` as a state file holds it: its fields, then a CRC-32 over them, as `pack_state` writes.

    For tests that edit a decoded file: the edit reaches the loader's field
    checks instead of being caught, as damage, by the checksum. `raw` gives
    some fields' msgpack bytes as they are (what a dict cannot hold, such as
    a map with one key twice).
    """
    packer = msgpack.Packer(use_bin_type=use_bin_type)
    raw = raw or {}
    body = b"".join(
        packer.pack(name) + (raw[name] if name in raw else packer.pack(value))
        for name, value in data.items()
        if name != "crc32"
    )
    fields = sum(name != "crc32" for name in data)
    return packer.pack_map_header(fields + 1) + body + packer.pack("crc32") + packer.pack(zlib.crc32(body))
