"""Where a campaign stands, read from its folder alone: stages done, training curves, a plot.

``dspark campaign --status`` prints it (for the notes written at every stop); the
learning-curve plot (expected τ from the training batches and real τ from the online
evaluation, against training tokens) is redrawn from ``train/<method>/metrics.jsonl``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark.eval.plots import plt, save_figure
from dspark.pipeline.presets import METHODS


@dataclass
class Curve:
    """One drafter's logged history."""

    steps: list[int] = field(default_factory=list)
    expected_tau: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_tau: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)  # evaluations on the fixed validation samples
    val_expected_tau: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None


def read_curve(metrics: Path) -> Curve:
    curve = Curve()
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    for line in lines:
        record = json.loads(line)
        if isinstance(record.get("expected_tau"), int | float):
            curve.steps.append(int(record["step"]))
            curve.expected_tau.append(float(record["expected_tau"]))
            curve.tokens_per_s = record.get("tokens_per_s", curve.tokens_per_s)
        if isinstance(record.get("eval/tau"), int | float):
            curve.eval_steps.append(int(record["step"]))
            curve.eval_tau.append(float(record["eval/tau"]))
        if isinstance(record.get("eval/val_expected_tau"), int | float):
            curve.val_steps.append(int(record["step"]))
            curve.val_expected_tau.append(float(record["eval/val_expected_tau"]))
    return curve


def status(out: Path) -> dict[str, Any]:
    """Stages finished, and per drafter: last step, expected τ, last real τ, checkpoints."""
    stages = sorted(p.stem for p in (out / "stages").glob("*.json") if not p.stem.endswith(".started"))
    report: dict[str, Any] = {
        "folder": str(out),
        "stages_done": stages,
        "in_progress": in_progress(out, stages),
        "training": {},
    }
    variants = sorted(p.name for p in (out / "train").glob("*") if p.is_dir() and p.name not in METHODS)
    for method in (*METHODS, *variants):  # the campaign's drafters, then its sweep variants
        run = out / "train" / method
        if not run.is_dir():
            continue
        curve = read_curve(run / "metrics.jsonl")
        latest = run / "checkpoints" / "latest"
        report["training"][method] = {
            "step": curve.steps[-1] if curve.steps else 0,
            "expected_tau": round(curve.expected_tau[-1], 3) if curve.expected_tau else None,
            "real_tau": round(curve.eval_tau[-1], 3) if curve.eval_tau else None,
            "tokens_per_s": round(curve.tokens_per_s, 1) if curve.tokens_per_s else None,
            "latest_checkpoint": latest.read_text().strip() if latest.is_file() else None,
            "finished": f"train-{method}" in stages,
        }
    return report


def in_progress(out: Path, done: list[str]) -> dict[str, Any]:
    """Stages started and not finished (running now, or killed and resumed by the next run);
    the regeneration with its answers so far against the prompts it was started for, the
    cache with its samples written so far."""
    started = sorted(p.name.removesuffix(".started.json") for p in (out / "stages").glob("*.started.json"))
    report: dict[str, Any] = {}
    for stage in (s for s in started if s not in done):
        report[stage] = {}
        if stage == "regenerate":
            key = json.loads((out / "stages" / "regenerate.started.json").read_text())
            answers = out / "data" / "answers.jsonl"
            count = len(answers.read_bytes().splitlines()) if answers.is_file() else 0
            report[stage] = {"answers": count, "prompts": key.get("prompts")}  # prompts None: all
        elif stage == "cache":  # the pieces written so far (data/cache_pieces.py)
            pieces = sorted((out / "cache" / "pieces").glob("[0-9]*.json"))
            samples = sum(len(json.loads(p.read_text())["placements"]) for p in pieces)
            regen = out / "stages" / "regenerate.json"
            total = json.loads(regen.read_text())["summary"] if regen.is_file() else {}
            report[stage] = {
                "pieces": len(pieces),
                "samples": samples,
                "of_samples": total.get("prompts", 0) - total.get("failed", 0) if total else None,
            }
    return report


def plot_learning_curves(out: Path, tokens_per_step: float, path: Path) -> Path | None:
    """Expected and real τ of every trained drafter against training tokens; None before any log."""

    curves = {m: read_curve(out / "train" / m / "metrics.jsonl") for m in METHODS}
    curves = {m: c for m, c in curves.items() if c.steps}
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7.2, 5.2))
    for i, (method, c) in enumerate(curves.items()):
        color = f"C{i}"
        # The training batches' expected τ swings ±15 % between batches of 8 samples: drawn
        # faint under the expected τ on the fixed validation samples (what the stop rule reads).
        ax.plot(
            [s * tokens_per_step for s in c.steps],
            c.expected_tau,
            color=color,
            alpha=0.25 if c.val_steps else 1.0,
            linewidth=0.8 if c.val_steps else 1.5,
            label=f"{method} expected τ (training batches)",
        )
        if c.val_steps:
            x = [s * tokens_per_step for s in c.val_steps]
            ax.plot(
                x, c.val_expected_tau, color=color, linewidth=2, label=f"{method} expected τ (fixed samples)"
            )
        if c.eval_steps:
            x = [s * tokens_per_step for s in c.eval_steps]
            ax.plot(x, c.eval_tau, "o--", color=color, label=f"{method} real τ (online eval)")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("τ (accepted + 1 per round)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    fig.subplots_adjust(bottom=0.32)
    return save_figure(fig, path)
