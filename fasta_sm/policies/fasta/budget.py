"""How much to measure: the R1 size, the total, and the model-or-coverage path."""

from __future__ import annotations

from dataclasses import dataclass

from ..baseline import bought, check_budget
from .params import FastaParams


@dataclass(frozen=True)
class BudgetPlan:
    """Counts are configs compiled and benchmarked, failures included (a
    failed compile costs as much as a good one, so it spends budget too)."""

    budget_class: str
    total: int
    r1: int
    path: str


def class_total(n: int, fraction: float, params: FastaParams) -> int:
    """Configs a budget fraction buys in a space of `n`: at least `min_budget`, at most all."""
    return min(n, max(bought(n, fraction), params.min_budget))


def route_budget(
    n: int, dims: int, params: FastaParams, budget: float | None, raise_to_viable: bool = True
) -> BudgetPlan:
    """Budget by N and D: small low-D spaces get more, large high-D ones less.

    Small spaces hold few near-optimal configs in absolute terms, so missing
    them is likely unless a larger fraction is measured; large spaces with
    many knobs are smooth enough in aggregate that a small fraction suffices.
    An explicit `budget` fraction overrides the routing. At least
    `guided_share` of the total is kept for the guided rounds, unless that
    would leave R1 too small for any model while a viable R1 still fits in
    the total. The model path needs
    `min_viable_np` R1 points per linear parameter; otherwise (including
    D = 0, nothing to regress on) the policy takes the coverage path. A
    routed total too small to hold a viable R1 and one guided config is
    raised to that when it costs less than the coverage path: a space of
    116 six-knob configs would otherwise measure half of them, one of 117
    fifteen. (`raise_to_viable=False` routes as fasta-sm did before that
    raise, for a tune resumed from a state it wrote.)
    """
    if budget is not None:
        budget_class, fraction = "fixed", check_budget(budget, "fasta: ")
    elif dims <= params.small_d and n <= params.small_n:
        budget_class, fraction = "small", params.small_budget
    elif dims >= params.large_d and n >= params.large_n:
        budget_class, fraction = "large", params.large_budget
    else:
        budget_class, fraction = "base", params.base_budget
    total = class_total(n, fraction, params)
    # Every share of a count is rounded up as `bought` rounds it: 0.55 of 100 configs is 55, not the 56 that
    # math.ceil makes of the product's floating-point residue (55.00000000000001).
    wanted_r1 = max(bought(n, params.r1_frac), params.r1_min, bought(1 + dims, params.r1_per_param))
    viable_r1 = bought(1 + dims, params.min_viable_np)

    def r1_of(total: int) -> int:
        guided = bought(total, params.guided_share) if total > 1 else 0
        r1 = max(1, min(wanted_r1, total - guided))
        return viable_r1 if r1 < viable_r1 < total else r1

    def viable(total: int) -> bool:
        r1 = r1_of(total)
        return dims > 0 and r1 / (1 + dims) >= params.min_viable_np and r1 < total

    if not viable(total):
        coverage_total = min(n, total if budget is not None else max(total, bought(n, params.coverage_budget)))
        if raise_to_viable and budget is None and dims > 0 and viable(viable_r1 + 1) and viable_r1 + 1 < coverage_total:
            total = viable_r1 + 1
        else:
            return BudgetPlan(budget_class=budget_class, total=coverage_total, r1=r1_of(total), path="coverage")
    return BudgetPlan(budget_class=budget_class, total=total, r1=r1_of(total), path="model")
