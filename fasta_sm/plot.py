"""A picture of one tune: what each round measured against what the surrogate predicted.

Left: every measured config's duration against its prediction when it was
picked (hollow, against the final model's, for a round that stored none: R1, a
polish round), one colour per round, the winner starred (re-time rounds time
configs drawn already, so they add no point). Right: the whole space sorted by the
final prediction, measured configs placed at their rank, so one sees whether
the unmeasured configs were predicted slow. Durations are on log axes: a tune
meets configs ten times slower than the best, and a linear axis would flatten
the near-best ones that matter.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .state import TuneState

PLOT_SUFFIXES = (".png", ".svg")
"""What `plot_tune` draws, by the file's suffix."""


def plot_tune(state: TuneState, out: Path) -> Path:
    """Draw `state` to `out` (PNG or SVG, by its suffix); needs matplotlib."""
    if Path(out).suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError("name a file ending in .png or .svg")
    if state.no_winner:  # not "nothing timed yet": running it again stops the same way
        raise ValueError(f"{state.kernel}: the tune stopped with no config run ({state.position()}), so there is "
                         "nothing to draw")
    if not any(math.isfinite(state.mean_us(index)) for index in state.durations):
        raise ValueError(f"{state.kernel}: nothing is timed yet ({state.position()}), so there is nothing to draw")
    fig = tune_figure(state)
    out = Path(out)
    fig.savefig(out, dpi=110)
    _pyplot().close(fig)
    return out


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("fasta-sm show --plot needs matplotlib: pip install 'fasta-sm[plot]'") from None
    return plt


def tune_figure(state: TuneState):
    """The figure `plot_tune` saves (a matplotlib Figure; the caller closes it)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 6), constrained_layout=True)
    colours = plt.get_cmap("viridis")(np.linspace(0, 0.9, max(len(state.rounds), 1)))
    measured_round: dict[int, int] = {}
    for number, record in enumerate(state.rounds):
        for index in record.batch:
            measured_round.setdefault(index, number)

    final = np.asarray(state.predicted_us, dtype=float) if state.predicted_us else None
    has_prediction = False
    for number, record in enumerate(state.rounds):
        if record.retime:
            continue
        name = record.name
        at_pick = record.predicted_us
        if not at_pick and final is not None:
            at_pick = [float(final[i]) for i in record.batch]
            name += " (vs final model)"
        points = [
            (p, state.mean_us(i))
            for i, p in zip(record.batch, at_pick or [math.nan] * len(record.batch))
            if i in state.durations and math.isfinite(p)
        ]
        if points:
            has_prediction = True
            xs, ys = zip(*points)
            hollow = not record.predicted_us
            left.scatter(
                xs,
                ys,
                s=22,
                label=f"{name} ({len(points)})",
                alpha=0.85,
                facecolors="none" if hollow else colours[number],
                edgecolors=colours[number],
            )
    winner = _winner_prediction(state, measured_round, final)
    if winner is not None:
        predicted, versus_final = winner
        left.scatter(
            [predicted],
            [state.best_us],
            marker="*",
            s=260,
            color="crimson",
            edgecolor="black",
            zorder=5,
            label="winner (vs final model)" if versus_final else "winner",
        )
    if has_prediction:
        lo, hi = left.get_xlim()
        left.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8, linestyle="--", label="measured = predicted")
        left.set_xscale("log")
        left.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    else:
        left.text(
            0.5, 0.5, f"policy {state.policy!r} made no predictions", ha="center", va="center", transform=left.transAxes
        )
    left.set_xlabel("predicted duration when picked (µs)")
    left.set_ylabel("measured duration (µs)")
    left.set_yscale("log")
    retimes = sum(record.retime for record in state.rounds)
    title = "Measured vs predicted, per round"
    left.set_title(f"{title} ({retimes} re-time rounds: no new point)" if retimes else title)

    if final is not None and np.isfinite(final).any():
        order = np.argsort(np.where(np.isfinite(final), final, np.inf))
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        right.plot(
            np.arange(len(order)),
            final[order],
            color="grey",
            linewidth=1.2,
            label=f"final prediction, all {state.n_configs} configs",
        )
        for number, record in enumerate(state.rounds):
            indices = [i for i in record.batch if i in state.durations and measured_round.get(i) == number]
            if indices:
                right.scatter(rank[indices], [state.mean_us(i) for i in indices], s=16, color=colours[number])
        if state.best is not None:
            right.scatter(
                [rank[state.best]], [state.best_us], marker="*", s=260, color="crimson", edgecolor="black", zorder=5
            )
        right.set_xlabel("config rank by final prediction")
        right.legend(fontsize=8, loc="upper left")
    else:
        ordered = [i for record in state.rounds for i in record.batch if i in state.durations]
        right.scatter(
            np.arange(len(ordered)),
            [state.mean_us(i) for i in ordered],
            s=16,
            color=[colours[measured_round[i]] for i in ordered],
        )
        if state.best in ordered:
            right.scatter(
                [ordered.index(state.best)], [state.best_us], marker="*", s=260, color="crimson", edgecolor="black",
                zorder=5,
            )
        right.set_xlabel("measurement order")
    right.set_ylabel("duration (µs)")
    right.set_yscale("log")
    right.set_title("The space: predicted and measured")
    if state.failed:
        right.text(
            0.99,
            0.02,
            f"{len(state.failed)} failed config(s) not drawn",
            ha="right",
            va="bottom",
            transform=right.transAxes,
            fontsize=8,
        )
    for axis in (left.xaxis, left.yaxis, right.yaxis):
        _readable_log_ticks(axis)
    best = "-" if state.best is None else f"#{state.best} {state.configs[state.best].label()}"
    fig.suptitle(
        f"{state.kernel}: {state.position()}, {state.measured_count()}/{state.n_configs} measured, winner {best}",
        fontsize=11,
    )
    return fig


def _winner_prediction(
    state: TuneState, measured_round: dict[int, int], final: np.ndarray | None
) -> tuple[float, bool] | None:
    """Where the winner sits on the predicted axis, and whether that is the final model's prediction: a round
    that stored no predictions (R1, a polish round) has its points drawn against the final model, and its
    winner must be starred there too, not left a hollow point. None when neither model predicted it."""
    if state.best is None or state.best not in measured_round:
        return None
    picked = state.rounds[measured_round[state.best]]
    if picked.predicted_us:
        at_pick = picked.predicted_us[list(picked.batch).index(state.best)]
        return (at_pick, False) if math.isfinite(at_pick) else None
    if final is not None and math.isfinite(final[state.best]):
        return float(final[state.best]), True
    return None


def _readable_log_ticks(axis) -> None:
    """A log axis spanning less than a decade labels its minor ticks (`1.25×10²`, `1.3×10²`, …), which run
    into each other: there, five plain labels instead."""
    from matplotlib.ticker import MaxNLocator, NullFormatter, ScalarFormatter

    if axis.get_scale() != "log":
        return
    low, high = sorted(axis.get_view_interval())
    if not 0 < low < high < 10 * low:
        return
    axis.set_major_locator(MaxNLocator(nbins=5))
    formatter = ScalarFormatter()
    formatter.set_scientific(False)
    formatter.set_useOffset(False)  # 1000.1, not 0.1 and "+1e3" at the axis end
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(NullFormatter())
