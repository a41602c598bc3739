"""The quickstart's drafters beside the shipped ones: τ, budgets and the steps between them.

One :class:`Comparison` per method whose shipped drafter has a ``SHIPPED.json`` record;
every figure comes from the eval stage's summary (both drafters on the same prompts and
the same validation set) and the record (how the shipped one was trained, its curve).
The steps-needed estimate is :func:`dspark.pipeline.quickstart.reach.steps_to_reach` on the
shipped curve mapped onto this run's validation set (:func:`dspark.pipeline.quickstart.reach.scaled`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark.eval.plots import plt, save_figure
from dspark.eval.report import md_table
from dspark.formats.shipped_record import ShippedRecord
from dspark.pipeline.quickstart.reach import (
    ALREADY,
    AT_LEAST,
    BEFORE_START,
    BEYOND_END,
    Reach,
    scaled,
    steps_to_reach,
)

PLOT = "eval/shipped_curves.png"


@dataclass(frozen=True, kw_only=True)
class Comparison:
    method: str
    steps: int  # this run's training steps
    tokens: float  # ≈ this run's training tokens (steps × batch × mean sample length)
    val_tau: float  # expected τ on this run's validation set
    tau: float | None  # mean τ of the evaluation (decoding)
    shipped: ShippedRecord
    shipped_val_tau: float  # the shipped drafter's expected τ on the same validation set
    shipped_tau: float | None
    reach: Reach | None  # None: the record has no curve (and this run's drafter is below the shipped one)
    tokens_per_step: float  # this run's, to say the estimate in this run's steps too

    @property
    def own_more_steps(self) -> float | None:
        r = self.reach
        return None if r is None or r.more_tokens is None else r.more_tokens / self.tokens_per_step


def comparisons(
    evaluated: dict[str, Any], trained: dict[str, dict[str, Any]], means: dict[str, dict[str, float | None]]
) -> list[Comparison]:
    """The comparisons of an eval stage summary (empty for one from before SHIPPED.json records)."""
    val = (evaluated.get("validation") or {}).get("expected_tau", {})
    per_step = evaluated.get("train_tokens_per_step")
    out = []
    for row, ref in (evaluated.get("shipped") or {}).items():
        method, raw = ref["method"], ref["record"]
        if raw is None or method not in val or row not in val:
            continue
        record = ShippedRecord.from_json(raw)
        reach = None  # without a curve, only "already there" can be said
        if val[method] >= val[row]:
            reach = Reach(kind=ALREADY, own_step=None, goal_step=None, more_steps=0.0, more_tokens=0.0)
        elif record.curve is not None:
            c = record.curve
            values = scaled(c.expected_tau, val[row])
            reach = steps_to_reach(c.steps, values, val[method], val[row], tokens_per_step=c.tokens_per_step)
        out.append(
            Comparison(
                method=method,
                steps=trained[method]["steps"],
                tokens=trained[method]["steps"] * per_step,
                val_tau=val[method],
                tau=means.get(method, {}).get("tau"),
                shipped=record,
                shipped_val_tau=val[row],
                shipped_tau=means.get(row, {}).get("tau"),
                reach=reach,
                tokens_per_step=per_step,
            )
        )
    return out


def _n(v: float) -> str:
    return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v:,.0f}"


def estimate_text(c: Comparison) -> str:
    """The steps-needed cell: an estimate, a bound, or why there is none."""
    r = c.reach
    if r is None:
        return "no estimate: the shipped record has no learning curve"
    if r.kind == ALREADY:
        return "none: already at or above the shipped drafter's expected τ"
    if r.kind == BEYOND_END:
        return "no estimate: the shipped curve never reaches that expected τ"
    if r.kind == BEFORE_START:
        return "no estimate: both values lie before the curve's first logged step"
    bound = "≥ " if r.kind == AT_LEAST else "≈ "
    text = (
        f"{bound}{r.more_steps:,.0f} steps of the shipped run ({bound}{_n(r.more_tokens)} tokens, "
        f"{bound}{c.own_more_steps:,.0f} of this run's steps)"
    )
    if r.kind == AT_LEAST:
        text += f"; the curve starts at step {c.shipped.curve.steps[0]:,}, already above this run's value"
    return text


def _f(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def comparison_markdown(items: list[Comparison], validation: dict[str, Any], plot: Path | None) -> str:
    """The report's section on the shipped drafters (a line saying there are none when empty)."""
    if not items:
        return (
            "No shipped drafter of this target has a `SHIPPED.json` record (how it was trained), "
            "so none is compared with the drafters trained here."
        )
    header = ["method", "this run", "expected τ (validation)", "τ (eval mean)", "shipped"]
    header += ["shipped expected τ (validation)", "shipped τ (eval mean)", "more training to reach it"]
    rows = [
        [
            f"**{c.method}**",
            f"{c.steps:,} steps, ≈ {_n(c.tokens)} tokens",
            _f(c.val_tau),
            _f(c.tau),
            f"{c.shipped.steps:,} steps, {c.shipped.epochs:.1f} epochs, "
            f"{_n(c.shipped.training_tokens)} tokens",
            _f(c.shipped_val_tau),
            _f(c.shipped_tau),
            estimate_text(c),
        ]
        for c in items
    ]
    text = f"""{md_table(header, rows)}

Both drafters of a row ran in the same evaluation (same prompts, seeds and measures).
**Expected τ** is measured on this run's validation set — the target's own answers to
{validation["samples"]} built-in prompts used neither for evaluation nor for calibration
({validation["tokens"]:,} tokens, fixed anchors, the same blocks for every drafter) — as
`1 + Σ_k Π_{{i≤k}} acceptance_i`, the campaign's `eval/val_expected_tau`. **The steps to reach
the shipped drafter are an estimate read off another run's learning curve** (the shipped
campaign's validation expected τ, recorded in `SHIPPED.json`): its τ − 1 is scaled so that
its last point equals the shipped drafter's expected τ measured here, then the steps between
where it first reaches this run's value and where it first reaches the shipped one's are
counted at the campaign's batch (its tokens per step; converted to this run's steps by
tokens). That run had its own data, batch and learning-rate schedule: read the figure as
how far apart the two drafters are in training, not as what more steps of this run would give."""
    if plot is not None:
        text += f"\n\n![shipped learning curves]({PLOT})"
    return text


def plot_curves(items: list[Comparison], path: Path) -> Path | None:
    """The shipped curves (mapped onto this validation set) against training tokens, with
    this run's drafters as points; None when no record has a curve."""

    with_curve = [c for c in items if c.shipped.curve is not None]
    if not with_curve:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, c in enumerate(with_curve):
        curve, color = c.shipped.curve, f"C{i}"
        values = scaled(curve.expected_tau, c.shipped_val_tau)
        ax.plot([curve.tokens(s) for s in curve.steps], values, color=color, label=f"{c.method} shipped run")
        ax.plot([c.tokens], [c.val_tau], "o", color=color, markersize=8, label=f"{c.method} this run")
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("expected τ on this run's validation set")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def headline(items: list[Comparison]) -> list[dict[str, Any]]:
    """The comparison's figures for ``summary.json`` (and the closing lines)."""
    return [
        {
            "method": c.method,
            "val_tau": round(c.val_tau, 4),
            "shipped_val_tau": round(c.shipped_val_tau, 4),
            "shipped_steps": c.shipped.steps,
            "shipped_epochs": c.shipped.epochs,
            "shipped_tokens": c.shipped.training_tokens,
            "estimate": c.reach.kind if c.reach else None,
            "more_steps": round(c.reach.more_steps) if c.reach and c.reach.more_steps is not None else None,
            "text": estimate_text(c),
        }
        for c in items
    ]


def headline_lines(entries: list[dict[str, Any]]) -> list[str]:
    return [
        f"{e['method']} vs shipped: expected τ {e['val_tau']:.2f} vs {e['shipped_val_tau']:.2f} "
        f"(shipped: {e['shipped_steps']:,} steps, {e['shipped_epochs']:.1f} epochs); "
        f"more training: {e['text']}"
        for e in entries
    ]
