"""Ablations that train small drafters and evaluate them side by side (paper Figs. 3 and 4).

- **block-size sweep** (Fig. 4): the draft length — the γ proposals plus the anchor,
  the paper's x axis {4, 8, 12, 16}, i.e. γ ∈ {3, 7, 11, 15} — for DSpark (Markov head,
  optionally the RNN head) against DFlash at a fixed depth;
- **depth sweep** (Fig. 3): DSpark with 1, 2, 5 layers against a 5-layer DFlash, γ fixed.

Each variant is a preset of :mod:`dspark.presets.drafters` with its block size or depth
replaced, trained with the library trainer for the same budget on the same data
(``<out>/runs/<label>/``; an interrupted sweep resumes, a finished run is not redone),
then all variants decode the same prompts with the same seeds
(:func:`dspark.eval.runner.run_eval`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dspark.data.samples import TrainDataset
from dspark.eval import plots
from dspark.eval.benchmarks import Benchmark
from dspark.eval.report import md_table, write_eval_report, write_json
from dspark.eval.runner import EvalConfig, EvalResult, run_eval
from dspark.formats.folder import load_drafter
from dspark.presets import drafters as presets
from dspark.targets import TargetAdapter
from dspark.training.fresh import train_new_drafter
from dspark.training.recipe import train_config

log = logging.getLogger(__name__)

# Method label -> preset of the tiny target (dimensions come from the target at build time).
METHOD_PRESETS: dict[str, Callable[[], Any]] = {
    "dspark": presets.dspark_tiny,
    "dspark-rnn": presets.dspark_rnn_tiny,
    "dflash": presets.dflash_tiny,
}


@dataclass(frozen=True, kw_only=True)
class SweepTraining:
    """The training budget every variant gets (small on purpose: the sweep compares, it does not ship)."""

    steps: int = 300
    batch_size: int = 8
    micro_batch_size: int = 2
    lr: float = 6e-4
    num_anchors: int = 512
    seed: int = 0
    progress: bool = True


@dataclass(frozen=True)
class Variant:
    label: str  # e.g. "dspark L=8" / "dflash 5L"
    method: str  # key of METHOD_PRESETS
    value: int  # the swept quantity: draft length (γ+1) or number of layers
    config: Any  # the drafter config to train


@dataclass(frozen=True)
class SweepPoint:
    label: str
    method: str
    value: int
    benchmark: str
    domain: str
    tau: float


@dataclass
class SweepResult:
    kind: str  # "block-size" | "depth"
    variants: list[Variant]
    points: list[SweepPoint]
    eval: EvalResult


def _config(method: str, **changes: int):
    if method not in METHOD_PRESETS:
        raise ValueError(f"unknown sweep method {method!r}; choose from {', '.join(METHOD_PRESETS)}")
    return dataclasses.replace(METHOD_PRESETS[method](), **changes)


def block_size_variants(
    lengths: Sequence[int], methods: Sequence[str], num_layers: int | None
) -> list[Variant]:
    """One variant per method and draft length ``L`` (γ = L − 1 drafts per round)."""
    out = []
    for method in methods:
        for length in lengths:
            if length < 2:
                raise ValueError(f"a draft length must be >= 2 (anchor + 1 draft), got {length}")
            changes = {"block_size": length - 1} | ({"num_layers": num_layers} if num_layers else {})
            out.append(Variant(f"{method} L={length}", method, length, _config(method, **changes)))
    return out


def depth_variants(layers: Sequence[int], baseline_layers: int, block_size: int) -> list[Variant]:
    """DSpark at each depth of ``layers`` and DFlash at ``baseline_layers`` (paper Fig. 3)."""
    out = [
        Variant(f"dspark {n}L", "dspark", n, _config("dspark", num_layers=n, block_size=block_size))
        for n in layers
    ]
    out.append(
        Variant(
            f"dflash {baseline_layers}L",
            "dflash",
            baseline_layers,
            _config("dflash", num_layers=baseline_layers, block_size=block_size),
        )
    )
    return out


def _run_dir(root: Path, label: str) -> Path:
    return root / "runs" / re.sub(r"[^A-Za-z0-9_.-]+", "_", label)


def train_variant(
    target: TargetAdapter, variant: Variant, dataset: TrainDataset, out: Path, training: SweepTraining
) -> torch.nn.Module:
    """Train (or resume / reuse) one variant and load it back through the strict folder loader."""
    run = _run_dir(out, variant.label)
    cfg = train_config(run, training, max_steps=training.steps, save_every=0, progress=training.progress)
    train_new_drafter(cfg, target, variant.config, dataset, run / "drafter")
    return load_drafter(run / "drafter", target)


def run_sweep(
    kind: str,
    target: TargetAdapter,
    variants: Sequence[Variant],
    dataset: TrainDataset,
    benchmarks: Sequence[Benchmark],
    out: Path,
    *,
    training: SweepTraining,
    eval_config: EvalConfig,
) -> SweepResult:
    """Train every variant, evaluate them together, and collect τ per variant and benchmark."""
    drafters = {}
    for i, variant in enumerate(variants, start=1):
        log.info("training %s (%d/%d)", variant.label, i, len(variants))
        drafters[variant.label] = train_variant(target, variant, dataset, out, training)
    config = dataclasses.replace(eval_config, baseline=False, block_size=None)
    result = run_eval(target, drafters, benchmarks, config)
    return SweepResult(kind, list(variants), sweep_points(variants, result), result)


def sweep_points(variants: Sequence[Variant], result: EvalResult) -> list[SweepPoint]:
    """τ per variant and benchmark from an evaluation whose drafters are labelled as the variants."""
    by_label = {v.label: v for v in variants}
    return [
        SweepPoint(
            r.drafter, by_label[r.drafter].method, by_label[r.drafter].value, r.benchmark, r.domain, r.tau
        )
        for r in result.rows
        if r.drafter in by_label
    ]


# -- outputs --------------------------------------------------------------------------------


def _domain_tau(points: Sequence[SweepPoint]) -> dict[str, dict[str, dict[int, float]]]:
    """domain -> method -> value -> τ macro-averaged over the domain's benchmarks."""
    acc: dict[tuple[str, str, int], list[float]] = {}
    for p in points:
        acc.setdefault((p.domain, p.method, p.value), []).append(p.tau)
    out: dict[str, dict[str, dict[int, float]]] = {}
    for (domain, method, value), taus in acc.items():
        out.setdefault(domain, {}).setdefault(method, {})[value] = sum(taus) / len(taus)
    return out


# What a sweep writes in its folder (run_sweep's runs/, write_sweep_report's files).
OUTPUTS = ("runs", "eval", "sweep.json", "block_size.png", "depth.png", "report.md")


def write_sweep_report(sweep: SweepResult, out: Path, meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``sweep.json``, the figure, ``report.md``, and the full evaluation under ``eval/``."""
    out = Path(out)
    write_eval_report(sweep.eval, out / "eval", meta)
    write_json(
        out / "sweep.json",
        {
            **(meta or {}),
            "kind": sweep.kind,
            "variants": [
                {"label": v.label, "method": v.method, "value": v.value, "config": drafter_fields(v.config)}
                for v in sweep.variants
            ],
            "points": [dataclasses.asdict(p) for p in sweep.points],
        },
    )
    by_domain = _domain_tau(sweep.points)
    if sweep.kind == "block-size":
        figure = "block_size.png"
        plots.plot_sweep_lines(
            by_domain, out / figure, xlabel="draft length (γ + 1)", ylabel="acceptance length τ"
        )
        title = "Acceptance length vs draft length (paper Fig. 4)"
    else:
        figure = "depth.png"
        groups = {
            b: {p.label: p.tau for p in sweep.points if p.benchmark == b}
            for b in dict.fromkeys(p.benchmark for p in sweep.points)
        }
        plots.plot_grouped_bars(groups, out / figure, ylabel="acceptance length τ")
        title = "Acceptance length vs drafter depth (paper Fig. 3)"
    benches = list(dict.fromkeys(p.benchmark for p in sweep.points))
    tau = {(p.label, p.benchmark): p.tau for p in sweep.points}
    rows = [
        [v.label, *(f"{tau.get((v.label, b), float('nan')):.2f}" for b in benches)] for v in sweep.variants
    ]
    text = "\n\n".join(
        [
            f"# {title}",
            f"Every variant trained with the same budget ({meta.get('training', '') if meta else ''}); "
            "evaluated on the same prompts and seeds. Full evaluation: [eval/report.md](eval/report.md).",
            md_table(["variant", *benches], rows),
            f"![{title}]({figure})",
        ]
    )
    path = out / "report.md"
    path.write_text(text + "\n")
    return path


def drafter_fields(config) -> dict[str, Any]:
    """The config of a variant as JSON-ready fields (nested objective included)."""
    return {
        k: v for k, v in dataclasses.asdict(config).items() if isinstance(v, int | float | str | bool | None)
    }
