"""The FASTA dynamic filter as a policy: R1 sample, guided R2 rounds, polish, re-time, DONE.

The policy keeps almost nothing between calls: each `refine` re-derives the
measured set from the engine's `Observations`, so its state file entry is a
handful of counters and one histogram, and a tune resumed in another process
with the same RNG state makes the same choices.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...config import Config
from ...errors import ConfigError, PolicyError
from ...failures import shared_memory_overshoot
from ...protocols import Decision, Observations, RuledOut
from .. import register
from ..baseline import bought, check_budget
from ..config_optimizer import optimize_configs
from .blas import one_blas_thread
from .budget import BudgetPlan, class_total, route_budget
from .contract import check_observations
from .feasibility import (
    failure_chance,
    load_culprits,
    overshoot_culprits,
    register_pressure,
    resource_culprits,
    resource_pressure,
    run_penalty,
    shared_memory_columns,
    spill_culprits,
)
from .features import column_index, extract_features
from .params import LARGEST, FastaParams, check_expert_configs, environment_overrides, resolve_params
from .sampling import (
    best_then_softmax,
    cell_retry_picks,
    marginal_scores,
    one_step_neighbours,
    scaled_up_tiles,
    softmax_pick,
    spill_twin_picks,
    stratified_sample,
    tile_cells,
    transposed_tile,
    unexplored_cell_picks,
)
from .stopping import histogram_settled, margin_settled, relative_histogram
from .surrogates import build_basis, compete, fit_ridge

log = logging.getLogger("fasta_sm.policies.fasta")

STATE_VERSION = 1
_PHASES = ("start", "r1", "r2", "retime", "done")
SCALED_UP = "tile scaled up with its warps"
"""How a polish decision and its history entry name the scaled-up tile rule (`_a_scaled_up_tile_ran_slow`)."""
SPILL_TWIN = "a spilled tile at more warps"
"""How a polish decision and its history entry name the spill twin (`_new_cell_steps`)."""
NEW_CELL_STEPS = "steps in its new cell"
"""How a polish decision and its history entry name the new cell's steps (`_new_cell_steps`)."""
RULE_WORDS = {
    "resource": "needs at least the resources of #{culprit}, which failed",
    "spill": "holds at least the registers per thread of #{culprit}, which ran {ratio:.1f}x slower than the best "
             "(a spill: cell_spill {params.cell_spill:g})",
    "load": "has at least the tile area and the tile per warp of #{culprit}, which ran {ratio:.1f}x slower than "
            "the best (a far spill: spill_load {params.spill_load:g})",
    "shared memory": "needs more shared memory than the device has, by the figures of #{culprit}'s failure",
}
"""What each feasibility rule says of a config it rules out (`ruled_out`)."""


def _stored_count(name: str, value: Any) -> int:
    """A count (or index) of a stored policy state; a PolicyError naming the field for anything else, a string
    of digits or a count no tune reaches among them (it would overflow rounds later)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= LARGEST:
        raise PolicyError(f"fasta: state field {name}={value!r:.60} is not a count (a whole number in 0..1e9)")
    return value


def _stored_number(name: str, value: Any) -> float | None:
    """A number (or None) of a stored policy state as a float; a PolicyError naming the field for anything else:
    a state the policy cannot take is set aside when it is read, not a crash rounds later."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError(f"fasta: state field {name}={value!r} is not a number")
    return float(value)


def _handicap_note(winner: str, rho: float, scores: dict[str, float], handicap: dict[str, float]) -> str:
    """Why a basis that ranked better lost: it is a challenger short of its lead over the incumbent. Without
    this, a round's reason names a winner with a lower score than one its history records."""
    better = [(score, name) for name, score in scores.items() if score > rho and name != winner]
    if not better:
        return ""
    score, name = max(better)
    return f"; {name}'s {score:.2f} is short of the {handicap.get(name, 0.0):.2f} lead a challenger needs"


def _without(items: np.ndarray, removed: np.ndarray, size: int) -> np.ndarray:
    """`items` (indices below `size`) less `removed`, in their order; np.setdiff1d sorts, which costs more."""
    keep = np.ones(size, dtype=bool)
    keep[removed] = False
    return items[keep[items]]


@register("fasta")
class FastaPolicy:
    """Surrogate-guided search over one kernel's config list (see docs/algorithm.md).

    `budget`, when given, is the fraction of configs to measure (at least
    `min_budget` configs) and replaces the routing by N and D; every other
    knob is a keyword argument named as in `FastaParams`.
    """

    name = "fasta"
    takes_prior = True

    def __init__(self, configs: Sequence[Config], budget: float | None = None, **params: Any) -> None:
        configs = list(configs)
        if not configs:
            raise ConfigError("fasta: the config list is empty; there is nothing to tune")
        self._configs = configs
        # As a float: a numpy scalar would pass every check yet leave a state_dict that msgpack cannot carry.
        self._budget_arg = None if budget is None else check_budget(budget, "fasta: ")
        self._setup(resolve_params(params))
        # What _setup derives, taken before the tune's memory exists; load_state_dict may rerun _setup.
        # plan_budget is among them, yet `_route_by_peak` may replace it (never mutate it): copies stay apart.
        self._derived = frozenset(vars(self)) | {"_derived"}
        self._phase = "start"
        self._r2_rounds = 0
        self._last_batch: list[int] = []
        self._reference_log: float | None = None
        self._previous_hist: list[float] | None = None
        self._previous_best_log: float | None = None
        self._retimes = 0
        self._retime_timings = 0
        self._retime_start_s: float | None = None
        self._timings: dict[str, list[float]] = {}
        self._polished = 0
        self._r1_cost: list[float] | None = None
        self._stop_reason = ""
        self._history: list[dict[str, Any]] = []
        self._prior: list[int] = []

    def use_prior(self, indices: Sequence[int]) -> None:
        """Start R1 from configs that earlier tunes of this kernel found fast (see `plan`)."""
        n = len(self._configs)
        bad = [i for i in indices if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < n]
        if bad:
            raise PolicyError(f"fasta: prior config {bad[0]!r} is not an index in 0..{n - 1}")
        self._prior = list(dict.fromkeys(int(i) for i in indices))

    @classmethod
    def check_arguments(cls, arguments: Mapping[str, Any]) -> None:
        """Refuse what the constructor would refuse, with no config list at hand: `budget` and every knob."""
        knobs = dict(arguments)
        budget = knobs.pop("budget", None)
        if budget is not None:
            check_budget(budget, "fasta: ")
        resolve_params(knobs)

    @classmethod
    def with_environment(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """`params` with the knobs the FASTA_* variables set away from their defaults; those given explicitly win."""
        return {**environment_overrides(), **params}

    @one_blas_thread()
    def _setup(self, params: FastaParams) -> None:
        self.params = params
        n = len(self._configs)
        self._active = np.ones(n, dtype=bool)
        check_expert_configs(params.expert_configs, n)
        if params.optimize_configs:
            expert = [self._configs[i] for i in params.expert_configs]
            kept = {c.identity for c in optimize_configs(self._configs, expert=expert)}
            self._active = np.array([c.identity in kept for c in self._configs])
        self._kept = self._active  # what the optimizer kept: `_active` widens past it (`_widen_past_the_kept`)
        self._space = extract_features(self._configs, log2=params.log2_features)
        self._designs = {name: build_basis(name, self._space) for name in params.bases}
        self._feasibility_design = None
        if params.failure_weight > 0 and params.failure_fit:
            full = self._designs.get("full")
            self._feasibility_design = build_basis("full", self._space) if full is None else full
        self._pressure = resource_pressure(self._space.names, self._space.levels)
        self._memory_sizes, self._memory_stages = shared_memory_columns(self._space.names)
        self._cells, self._cell_area = tile_cells(self._space, params.cell_columns, params.cell_max)
        in_cell = {c if c in self._space.names else f"kwargs.{c}" for c in params.cell_columns}
        free = [j for j, name in enumerate(self._space.names) if name not in in_cell]
        self._free_levels = self._space.levels[:, free]
        self._rare_columns = {j for j in free if self._space.names[j].startswith("kwargs.")}
        self._warps = column_index(self._space.names, "num_warps")
        self._tile_load = None
        if self._cell_area is not None and any(name.startswith("kwargs.") for name in in_cell & set(self._space.names)):
            warps = self._space.raw[:, self._warps] if self._warps is not None else 1.0
            self._tile_load = self._cell_area / warps
        # None without a kwarg column, as `_tile_load` then is: spill dominance needs both.
        self._spill_pressure = (
            register_pressure(self._space.names, self._space.levels) if params.spill_all_stages else self._pressure
        )
        self._tile_pair = None
        if {"kwargs.BLOCK_M", "kwargs.BLOCK_N"} <= set(self._space.names):
            self._tile_pair = (self._space.names.index("kwargs.BLOCK_M"), self._space.names.index("kwargs.BLOCK_N"))
        self._stages = column_index(self._space.names, "num_stages")
        self._twin_stages = self._stages if params.twin_deep else None
        self.plan_budget: BudgetPlan = route_budget(int(self._active.sum()), self._space.dims, params, self._budget_arg)
        log.debug("fasta: N=%d D=%d %s", n, self._space.dims, self.plan_budget)

    def __deepcopy__(self, memo: dict) -> FastaPolicy:
        """A copy that refines on its own, made in microseconds rather than milliseconds.

        What `_setup` derived from the configs and parameters (features,
        designs, cells) never changes afterwards and is shared; the tune's
        memory is copied. The machine's lookahead refines such copies.
        """
        clone = copy.copy(self)
        for name, value in vars(self).items():
            if name not in self._derived:
                setattr(clone, name, copy.deepcopy(value, memo))
        return clone

    # ------------------------------------------------------------------ R1

    @one_blas_thread()
    def plan(self, rng: np.random.Generator) -> Decision:
        """R1: a stratified sample (model path) or a uniform one (coverage path).

        Configs that earlier tunes of the kernel found fast (`use_prior`), at
        most a third of R1, take the place of as many sampled ones: a kernel's
        fast configs at one shape are often fast at the next, and the rest
        of R1, sampled around them, still spans the space for the model.
        """
        active = np.flatnonzero(self._active)
        size = self.plan_budget.r1
        prior = [i for i in self._prior if self._active[i]][: size // 3]
        if prior:
            active = _without(active, np.array(prior, dtype=np.int64), len(self._configs))
        if self.plan_budget.path == "model":
            covered = self._space.levels[prior] if prior else None
            picks = stratified_sample(self._space.levels[active], size - len(prior), rng, covered)
            sampled = [int(active[i]) for i in picks]
        else:
            sampled = [int(i) for i in rng.choice(active, size=min(size - len(prior), active.size), replace=False)]
        batch = sorted(sampled + prior)
        self._phase = "r1"
        self._last_batch = batch
        earlier = f"; {len(prior)} that earlier tunes of the kernel found fast: " + ", ".join(
            f"#{i}" for i in sorted(prior)) if prior else ""
        return Decision(
            batch=batch,
            reason=f"fasta R1: {len(batch)} of {len(self._configs)} configs "
            f"({self.plan_budget.path} path, budget {self.plan_budget.total}{self._raised()}, "
            f"class {self.plan_budget.budget_class})" + earlier,
        )

    def _raised(self) -> str:
        """Why a budget the caller gave buys more configs than its fraction: the `min_budget` floor."""
        if self._budget_arg is None:
            return ""
        asked = bought(int(self._active.sum()), self._budget_arg)
        if self.plan_budget.total <= asked:
            return ""
        floor = self.params.min_budget
        return f": budget={self._budget_arg:g} buys {asked}, raised by the min_budget floor ({floor}, at most all)"

    # ------------------------------------------------------------------ R2

    @one_blas_thread()
    def refine(self, observed: Observations, rng: np.random.Generator) -> Decision:
        durations = check_observations(observed, len(self._configs), self._last_batch)
        last, self._last_batch = self._last_batch, []
        if self._phase == "retime":
            self._record_timings(last, durations, observed.samples)
            return self._finish(self._stop_reason, durations, observed)
        if self._phase == "done":
            return self._stop(f"fasta: {self._stop_reason}")
        measured = np.isfinite(durations)
        evaluated = ~np.isnan(durations)
        self._widen_past_the_kept(measured)
        if self._phase == "r1" and measured.any():
            self._route_by_peak(durations[measured])
        candidates = np.flatnonzero(self._active & np.isnan(durations))
        remaining = self.plan_budget.total - int(evaluated[self._active].sum())
        if not measured.any():
            # A tune that ends with no winner is worthless: past the budget, keep sampling
            # (r1_min at a time, so that budget is left for guided rounds once one runs) until
            # one config runs or none is left, the configs the optimizer pruned included once
            # every kept one has failed.
            untried = candidates if candidates.size else np.flatnonzero(np.isnan(durations))
            if untried.size:
                why = "every config so far failed" if candidates.size else "every kept config failed, pruned ones next"
                batch = self._blind(untried, self.params.r1_min, rng)
                return self._issue(batch, f"{why}: sampling blind")
            return self._stop("fasta: every config failed")
        if self.plan_budget.path == "coverage":
            if remaining > 0 and candidates.size:
                return self._issue(self._blind(candidates, remaining, rng), "coverage path: uniform sample")
            return self._finish("coverage budget spent", durations, observed)
        if self._cost_spent(observed, durations):
            return self._finish("cost budget spent", durations, observed)
        if remaining <= 0 and candidates.size and self._polished < self._polish_allowance():
            polish = self._polish_round(durations, candidates, observed.failures)
            if polish is not None:
                return polish
        if remaining <= 0 or candidates.size == 0:
            return self._finish("budget spent" if candidates.size else "every config measured", durations, observed)
        if self._r2_rounds >= self.params.max_rounds:
            return self._finish(f"max_rounds={self.params.max_rounds} reached", durations, observed)
        return self._guided_round(observed, durations, candidates, remaining, rng)

    def _widen_past_the_kept(self, measured: np.ndarray) -> None:
        """Once only configs the optimizer pruned have run (every kept one failed), the kept list was no guide:
        the rest of the tune spans every config, at the budget of the whole list. Decided from the observations
        alone, so a resumed tune widens as the uninterrupted one did; once widened, the state says so
        (`widened`), so that a resumed tune keeps the budget it holds (a peaked R1 may have raised it)
        rather than routing the whole list again."""
        if self._active.all() or not measured.any() or (measured & self._active).any():
            return
        self._active = np.ones(len(self._configs), dtype=bool)
        self.plan_budget = route_budget(len(self._configs), self._space.dims, self.params, self._budget_arg)

    def _guided_round(
        self,
        observed: Observations,
        durations: np.ndarray,
        candidates: np.ndarray,
        remaining: int,
        rng: np.random.Generator,
    ) -> Decision:
        params = self.params
        rows, y, target = self._training_set(durations)
        handicap = {name: params.challenger_handicap for name in params.bases if name != params.incumbent_basis}
        fit, scores = compete(self._designs, params.bases, rows, target, params.ridge_lambda, handicap)
        predicted = fit.predict(self._designs[fit.basis])
        best_log = float(y.min())
        if self._reference_log is None:
            self._reference_log = best_log
        near = int(np.sum(y <= best_log + math.log1p(params.near_tol)))
        tau = params.tau_min + params.tau_range * (1.0 - fit.loo_r2) * min(1.0, near / params.near_full)
        hist = relative_histogram(y, self._reference_log, params.hist_bins, params.hist_span)
        record = {
            "round": self._r2_rounds + 1,
            "basis": fit.basis,
            "loo_rho": round(fit.loo_rho, 4),
            "loo_r2": round(fit.loo_r2, 4),
            "tau": round(tau, 5),
            "near": near,
            "scores": {k: round(v, 4) for k, v in scores.items()},
        }
        previous, self._previous_hist = self._previous_hist, hist.tolist()
        improved = self._previous_best_log is None or best_log < self._previous_best_log
        self._previous_best_log = best_log
        if self._r2_rounds >= params.min_rounds:
            lower = predicted[candidates] - fit.loo_rmse
            if margin_settled(lower, best_log, params.margin_conv, fit.loo_rho, params.trust_rho):
                self._history.append(record)
                return self._finish("margin: the model bounds every unmeasured config as slower", durations, observed)
            settled = histogram_settled(None if previous is None else np.array(previous), hist, params.l1_conv)
            if settled and not improved:
                self._history.append(record)
                return self._finish("histogram of measured durations settled, best unchanged", durations, observed)
        batch_size = min(remaining, candidates.size, self._round_size())
        n_vote = 0
        if self._space.dims >= params.marginal_d:
            n_vote = min(batch_size - 1, round(batch_size * params.marginal_share))
        p_fail = self._failure_chance(durations, observed.failures)
        model_scores = predicted - best_log + run_penalty(p_fail, tau, params.failure_weight)
        cell_picks = np.zeros(0, dtype=np.int64)
        if self._cells is not None and self.params.cell_picks > 0:
            cell_picks = unexplored_cell_picks(
                self._cells,
                self._cell_area,
                durations,
                candidates,
                model_scores,
                1.0 - p_fail,
                min(self.params.cell_picks, batch_size // 3),
                self.params.cell_min_run,
            )
            retry = cell_retry_picks(
                self._cells,
                self._cell_area,
                self._free_levels,
                durations,
                _without(candidates, cell_picks, durations.size),
                model_scores,
                1.0 - p_fail,
                min(self.params.cell_retry, batch_size // 3 - cell_picks.size),
                self.params.cell_min_run,
            )
            if retry.size:
                record["cell_retry"] = [int(i) for i in retry]
            cell_picks = np.concatenate([cell_picks, retry]).astype(np.int64)
            n_vote = min(n_vote, max(0, batch_size - cell_picks.size - 1))
        pool = _without(candidates, cell_picks, durations.size)
        n_model = max(0, batch_size - n_vote - cell_picks.size)
        drawn = pool[best_then_softmax(model_scores[pool], tau, n_model, params.greedy_picks, rng)]
        outright = drawn[: params.greedy_picks]
        picks = np.concatenate([cell_picks, drawn]).astype(np.int64)
        if n_vote > 0:
            rest = _without(candidates, picks, durations.size)
            vote = marginal_scores(self._space.levels, rows, target) - best_log
            vote += run_penalty(p_fail, params.tau_min, params.failure_weight)
            picks = np.concatenate([picks, rest[softmax_pick(vote[rest], params.tau_min, n_vote, rng)]])
        self._r2_rounds += 1
        record["batch"] = int(picks.size)
        if cell_picks.size:
            record["cell_picks"] = [int(i) for i in cell_picks]
        self._history.append(record)
        note = _handicap_note(fit.basis, fit.loo_rho, scores, handicap)
        cells = ""
        if cell_picks.size:
            cells = f", {cell_picks.size} to tile cells ({', '.join(f'#{i}' for i in cell_picks)})"
        best = f", first choice {', '.join(f'#{i}' for i in outright)}" if outright.size else ""
        return self._issue(
            sorted(int(i) for i in picks),
            f"fasta R2_{self._r2_rounds}: {picks.size} config{'s' if picks.size != 1 else ''}, basis {fit.basis} "
            f"(LOO rho {fit.loo_rho:.2f}{note}){best}, tau {tau:.3f}{cells}",
            predicted_us=np.exp(predicted),
        )

    def _training_set(self, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The measured rows, their log durations, and the regression target (capped at `cap_quantile`)."""
        rows = np.flatnonzero(np.isfinite(durations))
        y = np.log(durations[rows])
        cap = self.params.cap_quantile
        target = np.minimum(y, np.quantile(y, cap)) if cap < 1 else y
        return rows, y, target

    def _route_by_peak(self, r1: np.ndarray) -> None:
        """A peaked R1 (few runs near its best) moves the budget one class up (`peak_share`; off by default).

        `r1` is what ran by the first refine: R1's timings, with any results
        carried over from a superseded tune or measured by a wrapper's R1.

        Routing by N assumes a large space has a broad optimum; an R1 with few
        runs near its best says this one may not. On the held-out tables it
        helped one needle and cost 0.35 point on the data set for nothing
        there (docs/benchmarks.md, held-out shapes), so it is a knob.
        """
        params, plan = self.params, self.plan_budget
        if params.peak_share <= 0 or plan.budget_class not in ("large", "base"):  # an explicit budget is "fixed"
            return
        share = float(np.mean(r1 <= r1.min() * (1.0 + params.near_tol)))
        if share >= params.peak_share:
            return
        up, fraction = ("base", params.base_budget) if plan.budget_class == "large" else ("small", params.small_budget)
        total = max(plan.total, class_total(int(self._active.sum()), fraction, params))
        self.plan_budget = dataclasses.replace(plan, budget_class=f"{up} (peaked R1)", total=total)
        self._history.append({"route": self.plan_budget.budget_class, "r1_near_share": round(share, 4), "total": total})

    def _polish_allowance(self) -> int:
        """Configs the polish phase may add past the budget: none when the tune fixed its own budget."""
        return 0 if self._budget_arg is not None else self.params.polish_extra

    def _polish_round(
        self, durations: np.ndarray, candidates: np.ndarray, failures: Mapping[int, str]
    ) -> Decision | None:
        """Past the budget, one config next to the best: a local step the model ranks, or a cell's second chance.

        The pool is every untried one-level step in one column from the
        `polish_centers` fastest configs (num_warps and num_stages included),
        plus the cell retries of `cell_retry_picks`, less the configs whose
        chance to run is below `cell_min_run`; the best-scored one (model
        prediction and failure penalty) is measured; a cell whose tile spilled
        at fewer warps (`spill_twin_picks`) goes first, since the model reads
        the spill as a slow tile, then the best's tile scaled up with its warps
        (`scaled_up_tiles`; not below a failure at more stages,
        `scale_up_skip_failed`), both outside the cells where an earlier
        polish pick failed or ran slow (`polish_new_cells`), then the steps
        in its cell of a twin or scaled-up pick that ran near the best
        (`polish_new_cell_steps`), then the transposed tile (`transposed_tile`, two
        columns away) of the first of the `transpose_centers` fastest configs
        that has one untried. On a space without BLOCK_M and BLOCK_N, the
        local steps to the level of a kernel kwarg outside the cell columns
        that the fewest measured configs hold go first (`polish_rare_level`).
        The model is the basis
        that won the last guided round, refitted on everything measured (one
        fit, not a competition). None when the pool is empty.
        """
        params = self.params
        rows, _, target = self._training_set(durations)
        basis = next((h["basis"] for h in reversed(self._history) if "basis" in h), self._first_basis())
        fit = fit_ridge(basis, self._designs[basis], rows, target, params.ridge_lambda)
        order = rows[np.argsort(durations[rows], kind="stable")]
        p_fail = self._failure_chance(durations, failures)
        pool = one_step_neighbours(self._space.levels, order[: params.polish_centers], candidates)
        if self._cells is not None:
            retry = cell_retry_picks(
                self._cells,
                self._cell_area,
                self._free_levels,
                durations,
                candidates,
                np.zeros(durations.size),
                1.0 - p_fail,
                candidates.size,
                params.cell_min_run,
            )
            pool = np.union1d(pool, retry)
        pool = pool[1.0 - p_fail[pool] >= params.cell_min_run]
        all_scores = fit.predict(self._designs[fit.basis]) + run_penalty(p_fail, params.tau_min, params.failure_weight)
        rule, first = self._polish_first(durations, candidates, order, all_scores, p_fail)
        if first.size:
            pool = first
        else:
            rule = "a one-level step from a fastest config, or a cell's second chance"
        if pool.size == 0:
            return None
        if not first.size and params.polish_rare_level and self._tile_pair is None:
            pool = self._rarest_levels(pool, rows, int(order[0]))
        scores = all_scores[pool]
        pick = int(pool[np.argmin(scores)])
        self._polished += 1
        self._history.append({"polish": pick, "basis": fit.basis, "rule": rule})
        return self._issue([pick], f"fasta polish {self._polished}: {rule}, basis {fit.basis}")

    def _rarest_levels(self, pool: np.ndarray, measured: np.ndarray, best: int) -> np.ndarray:
        """The configs of `pool` whose rarest changed level (a column where it differs from `best`) the fewest
        `measured` configs hold (`polish_rare_level`)."""
        levels = self._space.levels
        rarity = np.full(pool.size, np.inf)
        for k, i in enumerate(pool):
            changed = [j for j in np.flatnonzero(levels[i] != levels[best]) if j in self._rare_columns]
            if changed:
                rarity[k] = min(int(np.sum(levels[measured, j] == levels[i, j])) for j in changed)
        return pool[rarity == rarity.min()] if np.isfinite(rarity).any() else pool

    def _first_basis(self) -> str:
        """The basis a polish fits when no guided round chose one: the incumbent, if it competes."""
        bases = self.params.bases
        return self.params.incumbent_basis if self.params.incumbent_basis in bases else bases[0]

    def _polish_first(
        self, durations: np.ndarray, candidates: np.ndarray, order: np.ndarray, scores: np.ndarray, p_fail: np.ndarray
    ) -> tuple[str, np.ndarray]:
        """The polish picks that go before the local steps, and the rule that named them (see `_polish_round`)."""
        params = self.params
        fresh = self._outside_polished_cells(durations, candidates)
        twins = self._spill_twins(durations, fresh, scores, p_fail)
        if twins.size:
            return SPILL_TWIN, twins
        runs = candidates[1.0 - p_fail[candidates] >= params.cell_min_run]
        if (
            params.polish_scale_up
            and self._tile_pair is not None
            and self._warps is not None
            and not self._a_scaled_up_tile_ran_slow(durations)
        ):
            larger = scaled_up_tiles(
                self._space.levels, int(order[0]), np.intersect1d(runs, fresh), *self._tile_pair, self._warps,
                self._twin_stages,
            )
            if params.scale_up_skip_failed:
                larger = self._not_below_a_failure(larger, durations)
            if larger.size:
                return f"config #{int(order[0])}'s {SCALED_UP}", larger
        pick, steps = self._new_cell_steps(durations, runs)
        if steps.size:
            return f"config #{pick}'s {NEW_CELL_STEPS}", steps
        if params.polish_transpose and self._tile_pair is not None:
            for center in order[: params.transpose_centers]:
                swapped = transposed_tile(self._space.raw, *self._tile_pair, int(center), runs)
                if swapped.size:
                    return f"config #{int(center)}'s transposed tile", swapped
        return "", np.zeros(0, dtype=np.int64)

    def _new_cell_steps(self, durations: np.ndarray, runs: np.ndarray) -> tuple[int, np.ndarray]:
        """The untried one-level steps in its own tile cell of the last spill twin or scaled-up tile that the polish
        picked and that ran within `near_tol` of the best (`polish_new_cell_steps`), once a tune.

        Such a pick found a new cell near the best at one stage count and
        `BLOCK_K`, chosen by a rule, not by the model, which still ranks the
        cell by its slow neighbours: on mm_fp16_4096 the 8-warp twin of the
        spilled 128 x 256 tile ran +2.9 % at 4 stages, and the best configs
        are one step from it (3 stages, or `BLOCK_K` 32), while the last pick
        went to the transposed tile or a step from the 256 x 128 best (+3.9 %).
        A transposed tile is not followed: it is a cell away from the best's
        (on mm_fp16_4096 seed 672 its steps took the pick that found the best).
        `runs` are the candidates likely to run. Returns the pick and its
        steps; no steps when off, with no cells, or when no pick qualifies.
        """
        none = (-1, np.zeros(0, dtype=np.int64))
        if not self.params.polish_new_cell_steps or self._cells is None:
            return none
        picks = [h for h in self._history if "polish" in h]
        if any(h["rule"].endswith(NEW_CELL_STEPS) for h in picks):
            return none
        near = durations[np.isfinite(durations)].min() * (1.0 + self.params.near_tol)
        cellish = [
            int(h["polish"]) for h in picks
            if (h["rule"] == SPILL_TWIN or h["rule"].endswith(SCALED_UP))
            and durations[int(h["polish"])] <= near
        ]
        if not cellish:
            return none
        pick = cellish[-1]
        steps = one_step_neighbours(self._space.levels, np.array([pick]), runs)
        return pick, steps[self._cells[steps] == self._cells[pick]]

    def _a_scaled_up_tile_ran_slow(self, durations: np.ndarray) -> bool:
        """Whether an earlier polish pick, a scaled-up tile, ran more than `near_tol` slower than the best.

        With `scale_up_stop_slow`. Such a tile grew past the optimum, and the
        other direction (the other side doubled, with the warps) most often
        has too: on attention_fwd_fp16_d64 both polish picks went to scaled-up
        tiles, +14 % and +20 %, while configs within 1 % of the best were one
        level from the best measured, in BLOCK_N or in the warps. A pick within `near_tol` leaves the other
        direction open (on attention_fwd_bf16_d128, 128 x 128 at 8 warps ran
        4 % slow and 256 x 64 is the best); a failed one is left to
        `polish_new_cells` and `scale_up_skip_failed`.
        """
        if not self.params.scale_up_stop_slow:
            return False
        slow = durations[np.isfinite(durations)].min() * (1.0 + self.params.near_tol)
        return any(
            h["rule"].endswith(SCALED_UP) and slow < durations[int(h["polish"])] < np.inf
            for h in self._history
            if "polish" in h
        )

    def _not_below_a_failure(self, picks: np.ndarray, durations: np.ndarray) -> np.ndarray:
        """`picks` less those whose same config at more stages was tried and failed (`scale_up_skip_failed`).

        A scaled-up tile is worth a polish pick because doubling a side and
        the warps keeps the work per thread, at the deepest pipeline that
        runs. When its deepest pipeline was tried and ran out of resources,
        the tile sits at the limit and the next stage count down is a poorer
        bet than the other direction (on attention_fwd_bf16_d128, 128 x 128
        at 8 warps failed at 4 stages and the polish took it at 3, +7.1 %,
        not 256 x 64 at 4 stages, the best). Without a stages column, or
        with no failure, `picks` is returned whole.
        """
        stages = self._stages
        failed = np.flatnonzero(np.isinf(durations))
        if stages is None or failed.size == 0 or picks.size == 0:
            return picks
        levels = self._space.levels
        others = [j for j in range(levels.shape[1]) if j != stages]
        same = np.all(levels[picks][:, None, others] == levels[failed][None, :, others], axis=2)
        deeper = levels[failed, stages][None, :] > levels[picks, stages][:, None]
        return picks[~np.any(same & deeper, axis=1)]

    def _outside_polished_cells(self, durations: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """`candidates` less those in a tile cell where an earlier polish pick failed or ran slower than the best.

        With `polish_new_cells`; the spill twins and scaled-up tiles are
        taken from what is left. The cell is the joint level of BLOCK_M,
        BLOCK_N and the warps. A twin or scaled-up tile is taken at the
        deepest stages that run; when that one fails or is slower than the
        best, the same rule would name the next stage count of the same cell
        and spend the last pick there, while the other direction of the
        scaled-up tile (or the next twin) is never tried (on
        attention_fwd_bf16_d128, 128 x 128 at 8 warps twice, never
        256 x 64). A polish pick that became the best leaves its cell open,
        and the transposed tile, one exact config, is not held back.
        """
        if not self.params.polish_new_cells or self._tile_pair is None or self._warps is None:
            return candidates
        best = durations[np.isfinite(durations)].min()
        polished = [
            int(h["polish"]) for h in self._history if "polish" in h and not durations[int(h["polish"])] <= best
        ]
        if not polished or candidates.size == 0:
            return candidates
        columns = [*self._tile_pair, self._warps]
        cell = self._space.levels[:, columns]
        taken = np.any(np.all(cell[candidates][:, None, :] == cell[polished][None, :, :], axis=2), axis=1)
        return candidates[~taken]

    def _spill_twins(
        self, durations: np.ndarray, candidates: np.ndarray, scores: np.ndarray, p_fail: np.ndarray
    ) -> np.ndarray:
        """The pick from an unexplored cell whose tile spilled at fewer warps (see sampling)."""
        if self._warps is None or self._cells is None:
            return np.zeros(0, dtype=np.int64)
        return spill_twin_picks(
            self._space.levels,
            self._warps,
            self._cells,
            self._cell_area,
            durations,
            candidates,
            scores,
            1.0 - p_fail,
            1,
            self.params.cell_min_run,
            self.params.cell_spill,
            self._twin_stages,
        )

    def _failure_chance(self, durations: np.ndarray, failures: Mapping[int, str]) -> np.ndarray:
        """P(fails) per config: ridge fit if `failure_fit`; resource, spill and load dominance; the shared-memory bound.

        A config ruled a spill counts as a failure: it is picked as rarely.
        Zero when the failure model is off (`failure_weight=0`) or nothing failed or spilled.
        """
        p_fail = np.zeros(durations.size)
        if self.params.failure_weight <= 0:
            return p_fail
        if self._feasibility_design is not None:
            tried = np.flatnonzero(~np.isnan(durations))
            failed = np.isinf(durations[tried])
            p_fail = failure_chance(self._feasibility_design, tried, failed, self.params.ridge_lambda)
        for _, culprits in self._rule_culprits(durations, failures):
            p_fail = np.where(culprits >= 0, 1.0, p_fail)
        return p_fail

    def _rule_culprits(self, durations: np.ndarray, failures: Mapping[int, str]) -> list[tuple[str, np.ndarray]]:
        """Each feasibility rule that is on, by its `RULE_WORDS` name, with the config that rules out each config
        by it (-1 for none)."""
        params, rules = self.params, []
        if self._pressure is not None and params.failure_dominance:
            rules.append(("resource", resource_culprits(self._pressure, durations)))
        if self._spill_pressure is not None and self._tile_load is not None and params.spill_dominance:
            rules.append(("spill", spill_culprits(
                self._spill_pressure, self._cell_area, self._tile_load, durations, params.cell_spill
            )))
        if self._tile_load is not None and params.spill_load > 0:
            rules.append(("load", load_culprits(self._cell_area, self._tile_load, durations, params.spill_load)))
        if params.failure_dominance:
            overshoot = shared_memory_overshoot(failures, durations.size)
            rules.append(("shared memory", overshoot_culprits(
                self._space.raw, self._memory_sizes, self._memory_stages, durations, overshoot
            )))
        return rules

    def ruled_out(self, observed: Observations) -> dict[int, tuple[RuledOut, ...]]:
        """Why each untried config that this policy puts out of reach on `observed` is out of it: every rule
        that does, in `_rule_culprits`' order (the first as before), so a user turning the first off sees
        what still holds it on these measurements.

        A config the config optimizer left out is never proposed; one a
        feasibility rule rules out (resource, spill or load dominance, the
        shared-memory bound) gets no chance to run, so it is proposed only
        over configs predicted far slower, and never as a cell pick or in
        the polish. The words name the rule and the config that rules it
        out: why a config an exhaustive tune crowned was never measured here
        is more often a rule than a low rank (`fasta-sm show --config`).
        The optimizer's reason stands alone: a config it left out is out of
        the space, whatever the rules say of it.
        """
        durations = np.asarray(observed.duration_us, dtype=float)
        untried = np.isnan(durations)
        left_out = RuledOut("config optimizer", None, "left out by the config optimizer")
        reasons = {int(i): (left_out,) for i in np.flatnonzero(untried & ~self._active)}
        if self.params.failure_weight <= 0:
            return reasons
        ran = np.isfinite(durations)
        best = float(durations[ran].min()) if ran.any() else math.nan  # only spills, which need a best, say it
        ruled: dict[int, list[RuledOut]] = {}
        for rule, culprits in self._rule_culprits(durations, observed.failures):
            for i in np.flatnonzero(untried & self._active & (culprits >= 0)):
                culprit = int(culprits[i])
                words = RULE_WORDS[rule].format(culprit=culprit, ratio=durations[culprit] / best, params=self.params)
                ruled.setdefault(int(i), []).append(RuledOut(rule, culprit, words))
        return reasons | {i: tuple(whys) for i, whys in ruled.items()}

    def _round_size(self) -> int:
        plan = self.plan_budget
        return max(1, math.ceil((plan.total - plan.r1) / self.params.rounds))

    def _cost_spent(self, observed: Observations, durations: np.ndarray) -> bool:
        """Cost budget: stop once the seconds spent reach a share of the estimated exhaustive cost.

        The exhaustive cost is extrapolated from R1, a stratified sample of
        the space: its seconds per config (compiles, failures and timings)
        times the active configs. The guided picks are not in the estimate,
        so a tune whose picks cost more than the space's average stops sooner.
        """
        if self.params.cost_budget <= 0:
            return False
        if self._r1_cost is None:
            self._r1_cost = [float(observed.spent_s), int(np.sum(~np.isnan(durations)))]
        spent, count = self._r1_cost
        if count == 0:
            return False
        estimate = spent / count * int(self._active.sum())
        return observed.spent_s >= self.params.cost_budget * estimate

    def _blind(self, candidates: np.ndarray, remaining: int, rng: np.random.Generator) -> list[int]:
        size = min(remaining, candidates.size)
        return sorted(int(i) for i in rng.choice(candidates, size=size, replace=False))

    def _finish(self, why: str, durations: np.ndarray, observed: Observations) -> Decision:
        """Before DONE, time the near-best configs again, so one lucky timing cannot win.

        Up to `retime_rounds` rounds, each re-timing the near-best configs
        that `_retime_candidates` names, while all re-timing stays within
        `retime_cost` of the seconds spent before it; one timing more each
        costs a benchmark, no compile.
        """
        self._stop_reason = why
        params = self.params
        close: list[int] = []
        cut = ""
        if params.retime_top > 0 and self._retimes < params.retime_rounds:
            close = self._retime_candidates(durations, observed.samples)
            if len(close) >= params.retime_min:
                if self._retime_affordable(observed.spent_s, close):
                    for i in close:
                        if observed.samples[i] == 1:  # a mean of timings carried over has no spread to learn from
                            self._timings.setdefault(str(i), [float(durations[i])])
                    self._phase = "retime"
                    self._retimes += 1
                    self._retime_timings += len(close)
                    self._history.append({"stop": why, "retime": close})
                    self._last_batch = close
                    return Decision(batch=close, reason=f"fasta: {why}; re-timing the {len(close)} near-best",
                                    retime=True)
                cut = f"its cost cap (retime_cost {params.retime_cost:g})"
        elif self._retimes and self._retimes >= params.retime_rounds:
            close, cut = self._retime_candidates(durations, observed.samples), f"retime_rounds={params.retime_rounds}"
        self._history.append({"stop": why})
        return self._stop(f"fasta: {why}{self._retime_ending(close, cut)}", self._final_predictions(durations))

    def _retime_ending(self, close: list[int], cut: str) -> str:
        """How re-timing ended, for the stop reason: settled, or cut short with contenders still open."""
        if not self._retimes:
            return ""
        best, *open_ = close or [None]
        if best is not None and cut and not open_:
            return (f"; re-timing stopped at {cut} with the pooled noise resting on {self._noise_dof()} timings, "
                    f"fewer than retime_settle_dof={self.params.retime_settle_dof}: #{best}'s lead not settled")
        if not cut or not open_:
            return "; re-timing settled: no other config in contention with the best"
        listed = ", ".join(f"#{i}" for i in open_)
        return f"; re-timing stopped at {cut} with {listed} still in contention with #{best}"

    def _final_predictions(self, durations: np.ndarray) -> np.ndarray | None:
        """Every config's prediction by the final model: the basis of the last guided round (or the polish's
        first) refitted on every config measured, so that a config the last rounds picked is predicted by a
        model that saw its timing. None on the coverage path, which fits no model."""
        if self.plan_budget.path == "coverage" or not np.isfinite(durations).any():
            return None
        rows, _, target = self._training_set(durations)
        basis = next((h["basis"] for h in reversed(self._history) if "basis" in h), self._first_basis())
        fit = fit_ridge(basis, self._designs[basis], rows, target, self.params.ridge_lambda)
        with np.errstate(over="ignore"):  # a log prediction past the float range is an infinite duration
            return np.exp(fit.predict(self._designs[fit.basis]))

    def _retime_candidates(self, durations: np.ndarray, samples: np.ndarray) -> list[int]:
        """The configs to time again: near the best by a fixed tolerance first, then by the noise seen.

        The first round takes the `retime_top` fastest within `retime_tol`
        of the best. Later rounds, with `retime_z` > 0, keep those whose gap
        to the best is within `retime_z` standard errors of the difference
        of the two means, the noise estimated from the timings re-timing has
        produced so far; with no such contender the best stands and
        re-timing ends, unless that noise rests on fewer than
        `retime_settle_dof` timings past each config's first and some
        contender's window still reaches `retime_resolution`: then the best
        alone is timed again (a lone best confirmed by one lucky timing
        otherwise settles on the spread of its own two). With `retime_z` = 0
        the tolerance narrows by `retime_decay` per round instead.
        """
        finite = np.flatnonzero(np.isfinite(durations))
        if finite.size == 0:
            return []
        ranked = finite[np.argsort(durations[finite], kind="stable")]
        order = ranked[: self.params.retime_top]
        best = order[0]
        if self._retimes == 0 or self.params.retime_z <= 0:
            tol = self.params.retime_tol * self.params.retime_decay**self._retimes
            return [int(i) for i in order if durations[i] <= durations[best] * (1 + tol)]
        contenders = ranked[1:] if self.params.retime_rank == "lower" else order[1:]
        window = self.params.retime_z * self._noise() * np.sqrt(1.0 / samples[contenders] + 1.0 / samples[best])
        still_open = [
            (float(durations[i] / (1 + w)), int(i))
            for i, w in zip(contenders, window)
            if w >= self.params.retime_resolution and durations[i] <= durations[best] * (1 + w)
        ]
        if self.params.retime_rank == "lower":
            still_open = sorted(still_open)[: self.params.retime_top - 1]
        if still_open:
            return [int(best), *(i for _, i in still_open)]
        if self._noise_dof() < self.params.retime_settle_dof and bool(np.any(window >= self.params.retime_resolution)):
            return [int(best)]  # too few timings behind the noise to settle on: one more of the best
        return []

    def _record_timings(self, batch: list[int], durations: np.ndarray, samples: np.ndarray) -> None:
        """Recover each re-timed config's newest timing from its mean and count (the engine reports means only)."""
        for i in batch:
            known = self._timings.get(str(i))
            if known is not None and np.isfinite(durations[i]):
                known.append(float(durations[i] * samples[i] - sum(known)))

    def _noise(self, leave_out: int | None = None) -> float:
        """Pooled relative standard deviation of one timing, over the configs timed more than once (all but
        `leave_out`)."""
        squares, dof = self._pooled_squares(leave_out)
        return math.sqrt(squares / dof) if dof else 0.0

    def _noise_dof(self) -> int:
        """How many timings `_noise` rests on past each re-timed config's first (its degrees of freedom)."""
        return self._pooled_squares()[1]

    def _pooled_squares(self, leave_out: int | None = None) -> tuple[float, int]:
        """The squared relative deviations from their config's mean of the re-timed configs' timings (all but
        `leave_out`), summed, and their degrees of freedom."""
        squares, dof = 0.0, 0
        for key, values in self._timings.items():
            if len(values) > 1 and key != str(leave_out):
                v = np.array(values)
                squares += float(np.sum((v / v.mean() - 1.0) ** 2))
                dof += len(values) - 1
        return squares, dof

    def _wild_best(self, best: int) -> bool:
        """Whether the best's own timings scatter far more than the others': at least 3 of them, with a relative
        standard deviation of at least `retime_wild` times the pooled noise of the other re-timed configs."""
        values = self._timings.get(str(best))
        if self.params.retime_wild <= 0 or values is None or len(values) < 3:
            return False
        others = self._noise(leave_out=best)
        v = np.array(values)
        return others > 0 and float(np.std(v / v.mean(), ddof=1)) >= self.params.retime_wild * others

    def _retime_affordable(self, spent_s: float, close: list[int]) -> bool:
        """Whether timing `close` again keeps all re-timing within `retime_cost` of the seconds spent before it.

        The price of a timing is learnt from the re-time rounds themselves
        (seconds spent since the first began, over the timings asked for),
        so the first round is always affordable; on a space whose configs
        compile in seconds a timing is cheap and up to `retime_rounds` rounds
        run, on one that compiles in a tenth of a second they are cut short.
        While the best (`close[0]`) is a wild config (`_wild_best`), the cap
        is `retime_wild_cap` times as large: its lead may be luck that a few
        more timings of it take back.
        """
        if self.params.retime_cost <= 0:
            return True
        if self._retime_start_s is None:
            self._retime_start_s = float(spent_s)
            return True
        share = self.params.retime_cost
        if self._wild_best(close[0]):
            share *= self.params.retime_wild_cap
        per_timing = (spent_s - self._retime_start_s) / max(self._retime_timings, 1)
        return (self._retime_timings + len(close)) * per_timing <= share * self._retime_start_s

    def _issue(self, batch: list[int], reason: str, predicted_us: np.ndarray | None = None) -> Decision:
        self._phase = "r2"
        self._last_batch = batch
        return Decision(batch=batch, reason=reason, predicted_us=predicted_us)

    def _stop(self, reason: str, predicted_us: np.ndarray | None = None) -> Decision:
        self._phase = "done"
        return Decision(batch=[], reason=reason, predicted_us=predicted_us)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "params": self.params.to_dict(),
            "budget_arg": self._budget_arg,
            "phase": self._phase,
            "r2_rounds": self._r2_rounds,
            "last_batch": list(self._last_batch),
            "reference_log": self._reference_log,
            "previous_hist": self._previous_hist,
            "previous_best_log": self._previous_best_log,
            "retimes": self._retimes,
            "retime_timings": self._retime_timings,
            "retime_start_s": self._retime_start_s,
            "timings": self._timings,
            "polished": self._polished,
            "r1_cost": self._r1_cost,
            "stop_reason": self._stop_reason,
            "plan": {
                "budget_class": self.plan_budget.budget_class,
                "total": self.plan_budget.total,
                "r1": self.plan_budget.r1,
                "path": self.plan_budget.path,
            },
            "history": self._history,
            "widened": bool(self._active.all() and not self._kept.all()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise PolicyError(f"fasta: state version {state.get('version')!r}; this policy reads {STATE_VERSION}")
        stored = dict(state["params"])
        stored.setdefault("retime_z", 0.0)  # written before the noise window: re-time as it was planned to
        stored.setdefault("cell_spill", 0.0)  # written before the spill twins: polish as it was planned to
        stored.setdefault("spill_load", 0.0)  # written before far spills ruled out tiles by their tile per warp
        stored.setdefault("twin_deep", False)  # written before the deepest-stage twin: its best-scored stages
        stored.setdefault("polish_transpose", False)  # written before the transposed-tile polish pick
        stored.setdefault("transpose_centers", 1)  # written when only the best's tile was transposed
        stored.setdefault("polish_scale_up", False)  # written before the scaled-up tile polish pick
        stored.setdefault("polish_rare_level", False)  # written when local polish steps went by the model alone
        stored.setdefault("polish_new_cells", False)  # written when a polish rule could go back to its cell
        stored.setdefault("scale_up_skip_failed", False)  # written when a scaled-up tile could sit below a failure
        stored.setdefault("scale_up_stop_slow", False)  # written when a slow scaled-up tile left the other open
        stored.setdefault("polish_new_cell_steps", False)  # written before a near new cell's steps went first
        stored.setdefault("retime_rank", "mean")  # written when only the fastest means were re-timed
        stored.setdefault("failure_fit", True)  # written when the ridge fit of failures was always on
        stored.setdefault("peak_share", 0.0)  # written before a peaked R1 could raise the budget
        stored.setdefault("spill_dominance", False)  # written before spills ruled out larger tiles
        stored.setdefault("spill_all_stages", False)  # written when a spill ruled out only deeper pipelines
        stored.setdefault("greedy_picks", 0)  # written when every model pick was drawn
        stored.setdefault("retime_wild", 0.0)  # written when a wild best got no more re-timing than any other
        stored.setdefault("retime_settle_dof", 0)  # written when a lead could settle on the noise of one timing pair
        stored["bases"] = tuple(stored["bases"])
        for name in ("cell_columns", "expert_configs"):
            if name in stored:
                stored[name] = tuple(stored[name])
        params = FastaParams(**stored)
        budget_arg = state["budget_arg"]
        if params != self.params or budget_arg != self._budget_arg:
            self._budget_arg = budget_arg
            self._setup(params)
        widened = state.get("widened", False)  # written before it was kept: widened again from the observations
        if not isinstance(widened, bool):
            raise PolicyError(f"fasta: state field widened={widened!r:.60} is not True or False")
        self._active = np.ones(len(self._configs), dtype=bool) if widened else self._kept
        if state["phase"] not in _PHASES:
            raise PolicyError(f"fasta: state phase {state['phase']!r} is none of {', '.join(_PHASES)}")
        self._phase = state["phase"]
        self._r2_rounds = _stored_count("r2_rounds", state["r2_rounds"])
        self._last_batch = [_stored_count("last_batch entry", i) for i in state["last_batch"]]
        if any(not 0 <= i < len(self._configs) for i in self._last_batch):
            raise PolicyError(f"fasta: state last_batch {self._last_batch!r} holds an index outside the configs")
        self._reference_log = _stored_number("reference_log", state["reference_log"])
        hist = state["previous_hist"]
        if hist is not None and (not isinstance(hist, list) or len(hist) != params.hist_bins or None in hist):
            raise PolicyError(f"fasta: state previous_hist {hist!r:.60} is not a histogram of {params.hist_bins} bins")
        self._previous_hist = None if hist is None else [_stored_number("previous_hist", x) for x in hist]
        self._previous_best_log = _stored_number("previous_best_log", state["previous_best_log"])
        self._retimes = _stored_count("retimes", state["retimes"])
        self._retime_timings = _stored_count("retime_timings", state.get("retime_timings", 0))
        self._retime_start_s = _stored_number("retime_start_s", state.get("retime_start_s"))
        self._timings = {str(k): [float(x) for x in v] for k, v in state.get("timings", {}).items()}
        self._polished = _stored_count("polished", state.get("polished", 0))
        r1_cost = state.get("r1_cost")
        if r1_cost is not None:
            if not isinstance(r1_cost, list) or len(r1_cost) != 2 or r1_cost[0] is None:
                raise PolicyError(f"fasta: state r1_cost {r1_cost!r:.60} is not [seconds, configs]")
            r1_cost = [_stored_number("r1_cost seconds", r1_cost[0]), _stored_count("r1_cost configs", r1_cost[1])]
        self._r1_cost = r1_cost
        if not isinstance(state["stop_reason"], str):
            raise PolicyError(f"fasta: state stop_reason {state['stop_reason']!r} is not text")
        self._stop_reason = state["stop_reason"]
        if "plan" in state:  # a budget routed again after R1 (`peak_share`) is not what _setup derives
            plan = state["plan"]
            routed = self.plan_budget
            if "path" not in plan:  # written before a small total was raised to a viable R1: routed without it
                active = int(self._active.sum())
                routed = route_budget(active, self._space.dims, self.params, self._budget_arg, raise_to_viable=False)
            self.plan_budget = dataclasses.replace(
                routed,
                budget_class=str(plan["budget_class"]),
                total=_stored_count("plan total", plan["total"]),
                r1=_stored_count("plan r1", plan.get("r1", routed.r1)),
                path=str(plan.get("path", routed.path)),
            )
        if not isinstance(state["history"], list) or not all(isinstance(h, dict) for h in state["history"]):
            raise PolicyError("fasta: state history is not a list of records")
        bases = [h["basis"] for h in state["history"] if "basis" in h]
        if any(not isinstance(b, str) or b not in self._designs for b in bases):
            raise PolicyError(f"fasta: state history names a basis outside {', '.join(self._designs)}")
        self._history = list(state["history"])

    def check_round(self, batch: Sequence[int]) -> None:
        """The open round must be one this state issued: every config of its last batch is in it."""
        if self._phase not in ("r1", "r2", "retime") or not set(self._last_batch) <= set(batch):
            raise PolicyError(
                f"fasta: state in phase {self._phase!r}, last batch {self._last_batch!r:.60}, did not issue "
                f"the open round of {len(batch)} configs"
            )
