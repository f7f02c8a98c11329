"""One point of a kernel's config space, and the identity that keys its results.

A config is what Triton calls a `Config`: meta-parameters (`kwargs`) plus launch
options. Results are keyed per config identity, never per config list, so that a
list that gains one config does not throw away what was measured for the others.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .errors import ConfigError

Scalar = int | float | bool | str


MSGPACK_INTS = (-(2**63), 2**64)
"""The ints msgpack, hence a state file, can hold: from the first up to, not including, the second."""


def _check_scalar(config: Config, name: str, value: Any) -> Scalar:
    if isinstance(value, int) and not isinstance(value, bool) and not MSGPACK_INTS[0] <= value < MSGPACK_INTS[1]:
        raise ConfigError(f"{config._where()}: {name}={value!r} does not fit in 64 bits")
    if isinstance(value, bool) or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{config._where()}: {name}={value!r} is not a finite number")
        return value
    kind = "dict" if isinstance(value, dict) else type(value).__name__  # a table's JSON object is a dict subclass
    raise ConfigError(
        f"{config._where()}: {name}={value!r} has type {kind}; "
        "config values must be int, float, bool or str"
    )


@dataclass(frozen=True, eq=False)
class Config:
    """Meta-parameters and launch options of one kernel variant.

    `options` holds launch options other than warps and stages (num_ctas,
    maxnreg, ...). All values are plain scalars so a config survives msgpack.
    `num_stages` may be 0, which Triton's AMD backend takes (no software
    pipelining); `num_warps` is at least 1.
    Two configs are equal when their identities are: BLOCK=1, BLOCK=1.0 and
    BLOCK=True are three configs, as they are three specializations to Triton.
    """

    kwargs: Mapping[str, Scalar]
    num_warps: int = 4
    num_stages: int = 3
    options: Mapping[str, Scalar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("kwargs", "options"):
            if not isinstance(getattr(self, name), Mapping):
                raise ConfigError(f"config {name}={getattr(self, name)!r} must be a mapping of names to values")
        for name, value in self.kwargs.items():
            if not isinstance(name, str):
                raise ConfigError(f"{self._where()}: kwarg name {name!r} is not a string")
            _check_scalar(self, name, value)
        for name, value in self.options.items():
            if not isinstance(name, str):  # 1 and "1" would share an identity
                raise ConfigError(f"{self._where()}: option name {name!r} is not a string")
            _check_scalar(self, name, value)
        for name, least in (("num_warps", 1), ("num_stages", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value < 2**31:
                kind = "a positive int" if least else "an int ≥ 0"
                raise ConfigError(f"{self._where()}: {name}={value!r} must be {kind} below 2**31")
        object.__setattr__(self, "kwargs", dict(sorted(self.kwargs.items())))
        object.__setattr__(self, "options", dict(sorted(self.options.items())))

    def _where(self) -> str:
        """How an error names this config (built only when there is an error)."""
        return f"config {dict(self.kwargs)!r}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.identity == other.identity

    def __hash__(self) -> int:
        return hash(self.identity)

    @cached_property
    def identity(self) -> str:
        """A canonical string: equal for equal configs, whatever the kwarg order."""
        return json.dumps(
            [self.kwargs, self.num_warps, self.num_stages, self.options],
            sort_keys=True,
            separators=(",", ":"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kwargs": dict(self.kwargs),
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "options": dict(self.options),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        return cls(
            kwargs=dict(data["kwargs"]),
            num_warps=data.get("num_warps", 4),
            num_stages=data.get("num_stages", 3),
            options=dict(data.get("options", {})),
        )

    def label(self) -> str:
        """Short human-readable form, as shown by the CLI."""
        parts = [f"{k}={v}" for k, v in self.kwargs.items()]
        parts += [f"w{self.num_warps}", f"s{self.num_stages}"]
        parts += [f"{k}={v}" for k, v in self.options.items()]
        return " ".join(parts)


def configs_hash(configs: Sequence[Config]) -> str:
    """Hash of an ordered config list: a tune is only resumed over the same list."""
    digest = hashlib.sha256()
    for config in configs:
        digest.update(config.identity.encode())
        digest.update(b"\n")
    return digest.hexdigest()


def check_config_list(kernel: str, configs: Iterable[Config]) -> list[Config]:
    """Reject the lists no tune can run on: empty, or with a config twice."""
    configs = list(configs)
    if not configs:
        raise ConfigError(f"kernel {kernel!r}: the config list is empty; nothing to tune")
    seen: dict[str, int] = {}
    for index, config in enumerate(configs):
        if not isinstance(config, Config):
            raise ConfigError(f"kernel {kernel!r}: config #{index} is a {type(config).__name__}, not a fasta_sm.Config")
        first = seen.setdefault(config.identity, index)
        if first != index:
            raise ConfigError(
                f"kernel {kernel!r}: configs #{first} and #{index} are the same config ({config.label()})"
            )
    return configs
