"""Policies by name: the engine builds one per tune through `make_policy`."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config import Config
from ..errors import ConfigError, PolicyError
from ..protocols import Policy

PolicyFactory = Callable[..., Policy]

_REGISTRY: dict[str, PolicyFactory] = {}
_UNLISTED: set[str] = set()


def register(name: str, *, listed: bool = True) -> Callable[[PolicyFactory], PolicyFactory]:
    """Make a policy available by name to the engine, and, when `listed`, to users (the CLI, error messages).

    An unlisted policy is one the integrations build with arguments no user
    passes (a wrapper around another policy).
    """

    def add(factory: PolicyFactory) -> PolicyFactory:
        _REGISTRY[name] = factory
        if not listed:
            _UNLISTED.add(name)
        return factory

    return add


def policy_names() -> list[str]:
    """The policies a user can name."""
    _load_builtin()
    return sorted(set(_REGISTRY) - _UNLISTED)


def require_listed(name: str) -> None:
    """A PolicyError listing the policies a user can name, unless `name` is one of them."""
    if not isinstance(name, str) or name not in policy_names():
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(policy_names())}")


def named_parameters(name: str) -> list[str] | None:
    """The parameters policy `name` takes beside its configs; None when it takes any name (fasta's `**params`,
    which it checks itself)."""
    _load_builtin()
    parameters = list(inspect.signature(_REGISTRY[name]).parameters.values())[1:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters]


def make_policy(name: str, configs: Sequence[Config], params: Mapping[str, Any] | None = None) -> Policy:
    """Build policy `name` over `configs`; unknown names and parameters are errors."""
    _load_builtin()
    if not isinstance(name, str) or name not in _REGISTRY:
        require_listed(name)
    factory = _REGISTRY[name]
    if not configs:
        raise ConfigError(f"policy {name!r}: the config list is empty; there is nothing to tune")
    given = dict(params or {})
    try:
        inspect.signature(factory).bind(list(configs), **given)
    except TypeError:
        raise PolicyError(f"policy {name!r} takes {', '.join(named_parameters(name) or []) or 'no parameters'}; "
                          f"got {given!r}") from None
    try:
        return factory(list(configs), **given)
    except (TypeError, ValueError) as exc:  # a value of the wrong kind, found by the policy itself
        raise PolicyError(f"policy {name!r} cannot take {given!r}: {exc}") from None


def with_environment(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A tune's parameters with the knobs its policy reads from the environment filled in; explicit ones win.

    A tune keeps these as its settings, so that a variable changed after a
    tune finished counts as a changed setting (a new tune, results carried
    over), not as something the old winner silently ignores.
    """
    if name == "fasta":  # as in check_arguments: a decorated kernel loads no other policy
        from .fasta import FastaPolicy

        return FastaPolicy.with_environment(params)
    _load_builtin()
    hook = getattr(_REGISTRY.get(name), "with_environment", None) if isinstance(name, str) else None
    return hook(params) if hook is not None else dict(params)


def check_arguments(name: str, params: Mapping[str, Any]) -> None:
    """Refuse an unknown policy, or a parameter it cannot take, before any tune: when an integration is set up.

    fasta, the default, checks its own arguments, without loading the other
    policies (this runs when a kernel is decorated); another policy is built
    over a two-config probe.
    """
    if name == "fasta":
        from .fasta import FastaPolicy

        FastaPolicy.check_arguments(params)
        return
    require_listed(name)  # an unlisted policy takes arguments only fasta-sm's integrations pass
    make_policy(name, [Config({"XBLOCK": 1}), Config({"XBLOCK": 2})], params)


def _load_builtin() -> None:
    """Register the shipped policies; scikit-learn is imported only when `trees` runs."""
    from . import baseline, coordinate, fasta, must_measure, trees  # noqa: F401
