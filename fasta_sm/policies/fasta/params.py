"""Every knob of the FASTA policy in one place: default, validation, env override.

A knob is set, in increasing priority, by its default, by a `FASTA_*`
environment variable (only the knobs listed in `ENV_VARS`), and by a keyword
argument of the policy constructor. Keeping the env subset small is deliberate:
a variable that silently retunes every kernel of a process should be one a
user would reasonably want to set globally.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import numbers
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ...env import COMPILE_POOL_SETTINGS, env_value, parse_switch
from ...env_numbers import real_from_env, whole_from_env
from ...errors import PolicyError, SettingError


@dataclass(frozen=True)
class FastaParams:
    """Defaults measured on the recorded H200 tables (see docs/algorithm.md)."""

    # --- budget (fractions of N, routed by N and D) ---
    r1_frac: float = 0.06
    r1_min: int = 12
    r1_per_param: float = 2.0
    guided_share: float = 0.3
    small_budget: float = 0.2
    base_budget: float = 0.12
    large_budget: float = 0.05
    min_budget: int = 13
    small_n: int = 220
    small_d: int = 5
    large_n: int = 300
    large_d: int = 2
    cost_budget: float = 0.0
    peak_share: float = 0.0
    coverage_budget: float = 0.5
    # --- model ---
    min_viable_np: float = 2.0
    ridge_lambda: float = 0.03
    bases: tuple[str, ...] = ("linear", "quad", "full", "fourier", "cubic", "rbf")
    incumbent_basis: str = "rbf"
    challenger_handicap: float = 0.2
    log2_features: bool = True
    failure_weight: float = 3.0
    failure_fit: bool = False
    failure_dominance: bool = True
    spill_dominance: bool = True
    spill_all_stages: bool = True
    cap_quantile: float = 0.5
    # --- batch selection ---
    rounds: int = 12
    max_rounds: int = 16
    greedy_picks: int = 1
    tau_min: float = 0.01
    tau_range: float = 0.05
    near_tol: float = 0.05
    near_full: int = 4
    marginal_d: int = 3
    marginal_share: float = 0.4
    cell_columns: tuple[str, ...] = ("BLOCK_M", "BLOCK_N", "num_warps")
    cell_max: int = 40
    cell_picks: int = 1
    cell_min_run: float = 0.5
    cell_retry: int = 1
    cell_spill: float = 3.0
    spill_load: float = 5.0
    twin_deep: bool = True
    # --- polish, past the budget ---
    polish_extra: int = 2
    polish_centers: int = 2
    polish_scale_up: bool = True
    polish_transpose: bool = True
    transpose_centers: int = 2
    polish_new_cells: bool = True
    scale_up_skip_failed: bool = True
    scale_up_stop_slow: bool = True
    polish_new_cell_steps: bool = True
    polish_rare_level: bool = True
    # --- stopping ---
    min_rounds: int = 3
    margin_conv: float = 0.05
    trust_rho: float = 0.95
    l1_conv: float = 0.0
    hist_bins: int = 10
    hist_span: float = 0.1
    # --- re-timing before DONE ---
    retime_top: int = 3
    retime_tol: float = 0.05
    retime_rounds: int = 20
    retime_min: int = 1
    retime_decay: float = 0.6
    retime_cost: float = 0.1
    retime_z: float = 2.5
    retime_resolution: float = 0.01
    retime_rank: str = "lower"
    retime_wild: float = 2.0
    retime_wild_cap: float = 2.0
    retime_settle_dof: int = 4
    # --- config optimizer (off by default) ---
    optimize_configs: bool = False
    expert_configs: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for f in fields(self):  # a numpy scalar passes as a number but no checkpoint can carry it
            value = getattr(self, f.name)
            if isinstance(value, np.generic):
                object.__setattr__(self, f.name, value.item())
            elif isinstance(value, tuple) and any(isinstance(item, np.generic) for item in value):
                object.__setattr__(self, f.name, tuple(i.item() if isinstance(i, np.generic) else i for i in value))
        self._check_kinds()
        for name in ("r1_frac", "small_budget", "base_budget", "large_budget", "coverage_budget"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise PolicyError(f"fasta: {name}={value!r} must be a fraction in (0, 1]")
        if not 0.0 <= self.peak_share <= 1.0:
            raise PolicyError(f"fasta: peak_share={self.peak_share!r} must be 0 (off) or a share in (0, 1]")
        if not 0.0 <= self.cost_budget <= 1.0:
            raise PolicyError(f"fasta: cost_budget={self.cost_budget!r} must be 0 (off) or a fraction in (0, 1]")
        if not 0.0 < self.guided_share < 1.0:  # with none, R1 would fill the budget and the model never pick
            raise PolicyError(f"fasta: guided_share={self.guided_share!r} must be in (0, 1)")
        if not 0.0 <= self.marginal_share < 1.0:
            raise PolicyError(f"fasta: marginal_share={self.marginal_share!r} must be in [0, 1)")
        for name in ("tau_min", "ridge_lambda", "near_tol", "retime_tol", "hist_span"):
            if getattr(self, name) <= 0:
                raise PolicyError(f"fasta: {name}={getattr(self, name)!r} must be positive")
        for name in ("r1_min", "min_budget", "rounds", "max_rounds", "hist_bins", "near_full", "retime_min",
                     "polish_centers", "transpose_centers"):
            if getattr(self, name) < 1:
                raise PolicyError(f"fasta: {name}={getattr(self, name)!r} must be at least 1")
        if self.hist_bins > HIST_BINS_MOST:  # each stop test allocates that many bins
            raise PolicyError(f"fasta: hist_bins={self.hist_bins!r} must be at most {HIST_BINS_MOST}")
        for name in ("greedy_picks", "tau_range", "retime_top", "min_rounds", "failure_weight", "cell_max",
                     "cell_picks", "cell_retry", "polish_extra", "cell_spill", "retime_z", "retime_resolution",
                     "retime_rounds", "r1_per_param", "small_n", "small_d", "large_n", "large_d", "min_viable_np",
                     "marginal_d", "margin_conv", "l1_conv", "retime_wild", "retime_settle_dof"):
            if getattr(self, name) < 0:
                raise PolicyError(f"fasta: {name}={getattr(self, name)!r} must not be negative")
        if not 0.0 <= self.retime_cost <= 1.0:
            raise PolicyError(f"fasta: retime_cost={self.retime_cost!r} must be 0 (no cap) or a fraction in (0, 1]")
        if not 0.0 <= self.cell_min_run <= 1.0:
            raise PolicyError(f"fasta: cell_min_run={self.cell_min_run!r} must be in [0, 1]")
        for name in ("cell_spill", "spill_load"):
            if getattr(self, name) < 0 or 0.0 < getattr(self, name) <= 1.0:
                raise PolicyError(f"fasta: {name}={getattr(self, name)!r} must be 0 (off) or a factor above 1")
        if self.retime_wild_cap < 1.0:
            raise PolicyError(f"fasta: retime_wild_cap={self.retime_wild_cap!r} must be at least 1")
        if not 0.0 < self.retime_decay <= 1.0:
            raise PolicyError(f"fasta: retime_decay={self.retime_decay!r} must be in (0, 1]")
        if self.retime_rank not in ("lower", "mean"):
            raise PolicyError(f"fasta: retime_rank={self.retime_rank!r} must be 'lower' or 'mean'")
        if not -1.0 <= self.trust_rho <= 1.0:
            raise PolicyError(f"fasta: trust_rho={self.trust_rho!r} must be a Spearman correlation, in [-1, 1]")
        if not 0.0 < self.cap_quantile <= 1.0:
            raise PolicyError(f"fasta: cap_quantile={self.cap_quantile!r} must be in (0, 1]")
        from .surrogates import BASIS_NAMES, IDENTIFIABILITY_GATED

        unknown = [b for b in self.bases if b not in BASIS_NAMES]
        if unknown or not self.bases:
            raise PolicyError(f"fasta: bases={self.bases!r}; each must be one of {', '.join(BASIS_NAMES)}")
        if set(self.bases) <= IDENTIFIABILITY_GATED:
            raise PolicyError(
                f"fasta: bases={self.bases!r}: {', '.join(sorted(IDENTIFIABILITY_GATED))} competes only once more "
                "than twice its columns are measured, which R1 never is; name another basis beside it"
            )
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.expert_configs):
            raise PolicyError(f"fasta: expert_configs={self.expert_configs!r} must be config indices (ints ≥ 0)")
        if self.incumbent_basis not in BASIS_NAMES:
            raise PolicyError(
                f"fasta: incumbent_basis={self.incumbent_basis!r} must be one of {', '.join(BASIS_NAMES)}"
            )

    def _check_kinds(self) -> None:
        """Each knob of its declared kind (a float knob takes an int too), numbers finite and below `LARGEST`:
        a string or NaN would otherwise surface mid-tune, as a comparison that fails or never holds, and a
        huge count as an overflow in the budget's arithmetic."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool":
                fits = isinstance(value, (bool, np.bool_))
            elif f.type in ("int", "float"):
                kinds = (numbers.Integral,) if f.type == "int" else (numbers.Real,)
                fits = isinstance(value, kinds) and not isinstance(value, (bool, np.bool_))
                fits = fits and abs(value) <= LARGEST  # False for NaN and inf; no float() to overflow on a huge int
            elif f.type == "str":
                fits = isinstance(value, str)
            else:  # the tuples: bases and cell_columns of str, expert_configs of int (checked below)
                fits = isinstance(value, tuple)
                if fits and f.name != "expert_configs":
                    fits = all(isinstance(item, str) for item in value)
            if not fits:
                raise PolicyError(f"fasta: {f.name}={value!r} must be {_KIND_NAMES.get(f.type, f.type)}")

    def to_dict(self) -> dict[str, Any]:
        """Msgpack-able form, stored in the policy state."""
        out = dataclasses.asdict(self)
        out["bases"] = list(self.bases)
        out["cell_columns"] = list(self.cell_columns)
        out["expert_configs"] = list(self.expert_configs)
        return out


LARGEST = 1e9
"""No knob needs a larger magnitude: counts are of configs or rounds, the rest shares and factors."""

HIST_BINS_MOST = 10_000

_KIND_NAMES = {
    "bool": "True or False",
    "int": "a whole number of magnitude at most 1e9",
    "float": "a finite number of magnitude at most 1e9",
    "str": "a string",
    "tuple[str, ...]": "a sequence of names",
    "tuple[int, ...]": "a sequence of config indices",
}


LIVE_DEFAULTS: dict[str, Any] = {"retime_rounds": 6, "retime_cost": 0.05}
"""Re-timing for tunes that time on a device while the user waits (`fasta_sm.autotune`, Inductor).

The replay defaults re-time until the noise settles, up to 20 rounds within
10 % of the seconds spent. In a live tune most of those seconds are compile
seconds spent in parallel workers, so that budget would buy timings one after
another on the wall clock. Live tunes keep the noise window but stop after 6
rounds or 5 % of the seconds spent; on the H200 the window ends after one
round on quiet kernels (docs/benchmarks.md). A `policy_params` entry
overrides each.
"""

# Knobs a user may set process-wide; every other knob is per tune only.
ENV_VARS: dict[str, str] = {
    "FASTA_R1_PCT": "r1_frac",
    "FASTA_BASE_BUDGET": "base_budget",
    "FASTA_SMALL_BUDGET": "small_budget",
    "FASTA_LARGE_BUDGET": "large_budget",
    "FASTA_COST_BUDGET": "cost_budget",
    "FASTA_MAX_ROUNDS": "max_rounds",
    "FASTA_RETIME_TOP": "retime_top",
    "FASTA_CONFIG_OPTIMIZER": "optimize_configs",
}


DESCRIPTIONS: dict[str, str] = {
    "r1_frac": "R1 size as a fraction of N",
    "r1_min": "smallest R1",
    "r1_per_param": "R1 points wanted per linear-model parameter (1 + D)",
    "guided_share": "least share of the total budget kept for the guided rounds",
    "small_budget": "budget fraction of small low-D spaces",
    "base_budget": "budget fraction of the other spaces",
    "large_budget": "budget fraction of large high-D spaces",
    "min_budget": "smallest total budget, in configs",
    "small_n": "N at or below which a space can be small",
    "small_d": "D at or below which a space can be small",
    "large_n": "N at or above which a space can be large",
    "large_d": "D at or above which a space can be large",
    "cost_budget": "stop once this share of the estimated exhaustive seconds is spent (0: off)",
    "coverage_budget": "budget fraction of the coverage path",
    "peak_share": "after R1, a space whose R1 has fewer than this share of its runs within `near_tol` of its best "
    "is routed one budget class up (large to base, base to small; 0: off)",
    "min_viable_np": "R1 points per linear parameter below which no model is fitted (coverage path)",
    "ridge_lambda": "ridge penalty, on unit-scaled features and log durations",
    "bases": "bases that compete each round",
    "incumbent_basis": "the basis the others must beat by `challenger_handicap` in LOO Spearman; one not among "
    "`bases` leaves none incumbent: every basis competes alike, and a polish with no guided round's basis fits "
    "the first of `bases`",
    "challenger_handicap": "LOO Spearman margin a challenger needs over the incumbent basis",
    "log2_features": "take all-positive columns in log2",
    "failure_weight": "softmax weights are multiplied by P(config runs) to this power (0: no failure model)",
    "failure_fit": "a ridge fit of which configs failed gives every other config a smooth P(fails) (off: only the "
    "rules of `failure_dominance` set it, to 1)",
    "failure_dominance": "a config with every kwarg and the stages at least, and warps at most, those of a "
    "failed one is taken to fail; so is one that an out-of-shared-memory failure's figures bound past the limit "
    "(Feasibility)",
    "spill_dominance": "a config with every kwarg (and the stages, unless `spill_all_stages`) at least, and warps "
    "at most, those of one that "
    "ran `cell_spill` times slower than the best with at least its tile area and tile per warp is taken to spill "
    "too, and is picked no more than a failure (Feasibility; off without a tile kwarg among `cell_columns` or "
    "without tile cells)",
    "spill_all_stages": "`spill_dominance` ignores the stages: a spill also rules out its tile and the larger "
    "ones at fewer stages (registers, not shared memory, spill; False: only at as many stages or more)",
    "cap_quantile": "fit log durations capped at this quantile of the measured ones (1: no cap)",
    "rounds": "the guided budget is split into this many batches",
    "max_rounds": "cap on guided rounds",
    "greedy_picks": "per guided round, the model's best-scored candidates taken outright before the softmax "
    "draws the rest of its picks (0: all drawn)",
    "tau_min": "softmax temperature floor (log-duration units)",
    "tau_range": "temperature added for a poor model with many near-optimal configs",
    "near_tol": "a config within this share of the best counts as near-optimal",
    "near_full": "near-optimal count at which the temperature is fully adaptive",
    "marginal_d": "D from which the marginal vote takes part",
    "marginal_share": "share of each batch picked by the marginal vote",
    "cell_columns": "columns whose joint values form a tile cell (cell exploration)",
    "cell_max": "cell exploration runs only when the space has at most this many cells (0: off)",
    "cell_picks": "per guided round, at most this many picks go to unexplored tile cells",
    "cell_min_run": "a cell is explored only if its best candidate runs with at least this probability",
    "cell_retry": "per guided round, at most this many picks retry an explored cell at its tile area's best values",
    "cell_spill": "a config this many times slower than the best spilled: its tile at more warps gets the next "
    "polish pick, and `spill_dominance` rules out the tiles above it (0: off; otherwise above 1)",
    "spill_load": "a config that ran this many times slower than the best, with at least its tile area and tile "
    "per warp, is a spill that rules out every config with at least its tile area and its tile per warp, at any "
    "warps, stages and other kwargs (Feasibility; 0: off; otherwise above 1)",
    "twin_deep": "a spill twin is tried at the deepest stage count that runs (False: the best-scored stages)",
    "polish_extra": "past the budget, at most this many more configs next to the best (0: off; none with `budget=`)",
    "polish_centers": "polish steps one level in one column from this many of the fastest configs",
    "polish_scale_up": "each polish pick after any spill twin is, while one is left, the best's tile one level "
    "larger in BLOCK_M or BLOCK_N with one level more warps, at the deepest stages that run",
    "polish_transpose": "each polish pick after any spill twin is, while one is left, a fast config with BLOCK_M "
    "and BLOCK_N swapped",
    "transpose_centers": "that config is the first of this many fastest whose transposed tile is untried and runs",
    "polish_rare_level": "without BLOCK_M and BLOCK_N in the space, a local polish step goes first to the level of "
    "a kernel kwarg outside `cell_columns` that the fewest measured configs hold",
    "polish_new_cells": "a spill twin or scaled-up tile is not taken in a tile cell (BLOCK_M, BLOCK_N, "
    "num_warps) where an earlier polish pick failed or ran slower than the best",
    "scale_up_skip_failed": "a scaled-up tile is not taken where the same config at more stages failed",
    "scale_up_stop_slow": "no further scaled-up tile once one ran more than `near_tol` slower than the best "
    "(its tile grew past the optimum, and so, most often, does the other direction)",
    "polish_new_cell_steps": "once a spill twin or scaled-up tile polish pick ran within `near_tol` of the best, "
    "the next polish pick (with no scaled-up tile to take) is one of its one-level steps in its own tile cell "
    "(stages, BLOCK_K, ...), before the transposed tile and the local steps",
    "min_rounds": "guided rounds before the margin and histogram tests may stop",
    "margin_conv": "margin test: untried configs must all be bounded this much slower",
    "trust_rho": "margin test: LOO Spearman the model needs to be believed",
    "l1_conv": "histogram test: L1 change below which results have settled (0: off)",
    "hist_bins": "histogram test: bins",
    "hist_span": "histogram test: log-duration span above the R1 best",
    "retime_top": "re-time at most this many configs per round, the first round of the fastest (0: off)",
    "retime_tol": "re-time only configs within this share of the best",
    "retime_rounds": "re-time rounds before DONE",
    "retime_min": "re-time only when at least this many configs are near the best (1: confirm a lone best too)",
    "retime_decay": "with `retime_z=0`: each further re-time round narrows `retime_tol` by this factor",
    "retime_cost": "re-timing stops before it costs more than this share of the seconds spent before it (0: no cap)",
    "retime_z": "after the first re-time round, re-time configs within this many standard errors of the best "
    "(noise from the re-timings; 0: narrow by `retime_decay` instead)",
    "retime_resolution": "with `retime_z`: a contender whose window is narrower than this share of the best is "
    "settled (gaps that small do not matter)",
    "retime_rank": "after the first re-time round, the contenders are the configs within the noise window of "
    "the best, lowest window bound first (`lower`), or only the fastest means (`mean`)",
    "retime_wild": "while the best has 3 or more timings whose relative spread is at least this many times the "
    "pooled noise of the other re-timed configs, re-timing may cost up to `retime_wild_cap` times `retime_cost` "
    "(0: off)",
    "retime_wild_cap": "with `retime_wild`: the factor on `retime_cost` while the best's own timings scatter",
    "retime_settle_dof": "after the first re-time round, no lead is settled on a pooled noise resting on fewer "
    "than this many timings past each config's first while a contender's window still reaches `retime_resolution`: "
    "the best alone is timed again (0: off)",
    "optimize_configs": "prune the list with the config optimizer first",
    "expert_configs": "indices (in the tune's config list) of configs the config optimizer always keeps: a "
    "kernel author's own",
}


BOUNDS: dict[str, tuple[float | None, bool, float | None, bool]] = {
    **dict.fromkeys(("r1_frac", "small_budget", "base_budget", "large_budget", "coverage_budget", "retime_decay",
                     "cap_quantile"), (0, False, 1, True)),
    **dict.fromkeys(("cost_budget", "peak_share", "retime_cost", "cell_min_run"), (0, True, 1, True)),
    "guided_share": (0, False, 1, False),
    "marginal_share": (0, True, 1, False),
    "trust_rho": (-1, True, 1, True),
    "hist_bins": (1, True, HIST_BINS_MOST, True),
    **dict.fromkeys(("tau_min", "ridge_lambda", "near_tol", "retime_tol", "hist_span"), (0, False, None, False)),
    **dict.fromkeys(("r1_min", "min_budget", "rounds", "max_rounds", "near_full", "retime_min", "polish_centers",
                     "transpose_centers"), (1, True, None, False)),
    **dict.fromkeys(("greedy_picks", "tau_range", "retime_top", "min_rounds", "failure_weight", "cell_max",
                     "cell_picks", "cell_retry", "polish_extra", "retime_z", "retime_resolution", "retime_rounds",
                     "r1_per_param", "small_n", "small_d", "large_n", "large_d", "min_viable_np", "marginal_d",
                     "margin_conv", "l1_conv", "retime_wild", "retime_settle_dof"), (0, True, None, False)),
    "retime_wild_cap": (1, True, None, False),
    "challenger_handicap": (None, False, None, False),
}
"""The numbers each numeric knob takes besides the magnitude cap `LARGEST`: (least, least included, most, most
included), None where unbounded. Written into the parameter table; tests/policies probes each end against
`FastaParams`, so that the table says what the checks refuse."""

_OTHER_VALUES = {
    "cell_spill": "0, or > 1",
    "spill_load": "0, or > 1",
    "incumbent_basis": "a basis name",
    "cell_columns": "column names",
    "retime_rank": "`'lower'` or `'mean'`",
    "expert_configs": "config indices, 0 to N − 1",
}


def _values(f: dataclasses.Field) -> str:
    """What the parameter table says knob `f` takes."""
    if f.name == "bases":
        from .surrogates import BASIS_NAMES, IDENTIFIABILITY_GATED

        names, gated = (", ".join(f"`{b}`" for b in group) for group in (BASIS_NAMES, sorted(IDENTIFIABILITY_GATED)))
        return f"names of {names}; not {gated} alone"
    if f.name in _OTHER_VALUES:
        return _OTHER_VALUES[f.name]
    if f.type == "bool":
        return "`True`, `False`"
    least, least_in, most, most_in = BOUNDS[f.name]
    whole = "whole, " if f.type == "int" else ""
    if least is None and most is None:
        return "any number"
    if most is None:
        return f"{whole}{'≥' if least_in else '>'} {least}"
    return f"{whole}{'[' if least_in else '('}{least}, {most}{']' if most_in else ')'}"


def parameter_table() -> str:
    """The parameter reference of docs/algorithm.md, generated so it cannot drift."""
    env_of = {name: var for var, name in ENV_VARS.items()}
    lines = ["| parameter | default | values | env var | meaning |", "| --- | --- | --- | --- | --- |"]
    for f in fields(FastaParams):  # each default as a Python literal: what `fasta-sm bench --param` reads
        env = f"`{env_of[f.name]}`" if f.name in env_of else ""
        lines.append(f"| `{f.name}` | `{f.default!r}` | {_values(f)} | {env} | {DESCRIPTIONS[f.name]} |")
    return "\n".join(lines)


def _parse(field_type: Any, name: str, text: str, where: str) -> Any:
    kind = field_type if isinstance(field_type, str) else getattr(field_type, "__name__", str(field_type))
    try:
        if kind == "bool":
            return parse_switch(where, text)
        if kind == "int":  # the knob's own least, so that a fixed value is not refused a second time for it
            least, least_in = BOUNDS[name][:2]
            return whole_from_env(where, text, least=int(least) + (0 if least_in else 1))
        if kind == "float":
            return real_from_env(where, text)
    except SettingError as error:
        raise PolicyError(f"fasta: {error} (it sets {name})") from None
    raise PolicyError(f"fasta: {name} cannot be set from {where}")


def environment_params(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The knobs the FASTA_* environment variables set, parsed and checked; empty when none is set.

    A FASTA_* name that sets nothing (a misspelling, or a variable of the
    original FASTA such as FASTA_HIGH_BUDGET) is warned about once: read as
    nothing, it would leave the user believing a knob was set.
    """
    environ = os.environ if environ is None else environ
    known = {*ENV_VARS, *COMPILE_POOL_SETTINGS}
    for name in sorted(environ):
        if name.startswith("FASTA_") and not name.startswith("FASTA_SM_") and name not in known:
            _warn_ignored(name)
    types = {f.name: f.type for f in fields(FastaParams)}
    given = {var: name for var, name in ENV_VARS.items() if env_value(var, environ) is not None}
    values = {name: _parse(types[name], name, environ[var], var) for var, name in given.items()}
    if values:
        try:
            FastaParams(**values)
        except PolicyError as error:
            settings = ", ".join(f"{var}={environ[var]!r}" for var in given)
            raise PolicyError(f"{error} (set from the environment: {settings})") from None
    return values


@functools.cache
def _warn_ignored(name: str) -> None:
    logging.getLogger("fasta_sm.policies.fasta").warning(
        "$%s sets nothing and is ignored; the FASTA_* policy knobs are %s (docs/algorithm.md, Parameters)",
        name,
        ", ".join(ENV_VARS),
    )


def environment_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The knobs the FASTA_* variables set to something other than their default: what changes a tune."""
    values = environment_params(environ)
    if not values:  # the usual case, and on every launch's lookup: no defaults to build and check
        return {}
    defaults = FastaParams()
    return {name: value for name, value in values.items() if getattr(defaults, name) != value}


def check_expert_configs(indices: Iterable[int], count: int) -> None:
    """Refuse an `expert_configs` index past the end of a config list of `count` (indices are checked ≥ 0 by
    `FastaParams`): wherever the list's length is first known, so that the user hears of it there."""
    outside = [i for i in indices if i >= count]
    if outside:
        raise PolicyError(
            f"fasta: expert_configs index {outside[0]} is past the end of the config list "
            f"({count} configs, indices 0..{count - 1})"
        )


def resolve_params(overrides: Mapping[str, Any]) -> FastaParams:
    """Defaults, then per-tune keyword arguments.

    The FASTA_* variables are not read here but once, where a tune is opened
    (`environment_overrides`, through `fasta_sm.policies.with_environment`),
    and kept in its `policy_params`: a policy built again from those, in a
    worker or a later process with another environment, decides the same.
    """
    types = {f.name: f.type for f in fields(FastaParams)}
    values: dict[str, Any] = {}
    for name, value in overrides.items():
        if name not in types:
            raise PolicyError(f"fasta: unknown parameter {name!r}; known: {', '.join(sorted(types))}")
        if name in ("bases", "cell_columns", "expert_configs"):
            if isinstance(value, str) and name != "expert_configs":
                value = (value,)
            elif isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
                raise PolicyError(f"fasta: {name}={value!r} must be a list")
            value = tuple(value)
        values[name] = value
    return FastaParams(**values)
