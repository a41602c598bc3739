"""The paper's ablations at the campaign's budget (Figs. 3 and 4), from its feature cache.

``dspark sweep`` trains every variant a few hundred steps on the raw corpus, which compares
drafters early in training (the 300-step sweeps of BENCHMARKS.md). The campaign's sweeps
train each variant like the campaign's own drafters — on the cached features, to
``sweep_epochs`` or until expected τ stops rising, resumable stage by stage — so the figures
can be read at convergence:

- **depth** (Fig. 3): DSpark with ``depth_layers`` layers against a DFlash of
  ``depth_baseline_layers``, the preset's γ;
- **block-size** (Fig. 4): DSpark and DFlash at each draft length ``L`` of ``block_lengths``
  (γ = L − 1 drafts per round), the preset's depth.

A variant equal to one of the campaign's drafters (same method and configuration) reuses
it when the sweep's budget is the campaign's; otherwise it trains under its own name. The
variants are then evaluated together on the campaign's evaluation sets (same prompts, same
seeds) and reported with :func:`dspark.pipeline.sweeps.write_sweep_report`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dspark.formats.folder import load_drafter
from dspark.pipeline.presets import METHODS, CampaignPlan
from dspark.pipeline.sweeps import SweepResult, Variant, sweep_points, write_sweep_report
from dspark.presets import drafters as presets

if TYPE_CHECKING:
    from dspark.pipeline.campaign.pipeline import Campaign

SWEEP_KINDS = ("depth", "block-size")
SWEPT_METHODS = ("dspark", "dflash")  # the methods the two figures compare


@dataclass(frozen=True)
class SweepVariant:
    """One point of a sweep: a campaign method's preset with ``changes`` to its config."""

    name: str  # stage and folder name: train-<name>, drafters/<name>
    label: str  # the figure's label, as `dspark sweep` writes it
    method: str  # dspark | dflash
    value: int  # the swept quantity: layers (depth) or draft length γ + 1 (block-size)
    changes: tuple[tuple[str, int], ...]  # config fields replaced in the method's preset

    def config(self, base: Any) -> Any:
        """The variant's drafter config from the method's preset config ``base``."""
        return dataclasses.replace(base, **dict(self.changes))


def sweep_plan(plan: CampaignPlan) -> CampaignPlan:
    """The plan the variants train under: the campaign's, with the sweep's epoch budget."""
    epochs = plan.epochs if plan.sweep_epochs is None else plan.sweep_epochs
    return dataclasses.replace(plan, epochs=epochs)


def _changed(base: Any, **fields: int) -> tuple[tuple[str, int], ...]:
    """The fields that differ from ``base`` (sorted: part of a stage key)."""
    return tuple(sorted((k, v) for k, v in fields.items() if getattr(base, k) != v))


def sweep_variants(kind: str, plan: CampaignPlan, bases: dict[str, Any]) -> list[SweepVariant]:
    """The variants of one sweep; ``bases``: method -> its preset config (the campaign's)."""
    if kind == "depth":
        points = [("dspark", n) for n in plan.depth_layers] + [("dflash", plan.depth_baseline_layers)]
        return [
            SweepVariant(
                f"{m}-{n}L",
                f"{m} {n}L",
                m,
                n,
                _changed(bases[m], num_layers=n, block_size=bases["dspark"].block_size),
            )
            for m, n in points
        ]
    if kind == "block-size":
        out = []
        for m in SWEPT_METHODS:
            for length in plan.block_lengths:
                if length < 2:
                    raise ValueError(f"a draft length must be >= 2 (anchor + 1 draft), got {length}")
                changes = _changed(bases[m], block_size=length - 1)
                out.append(SweepVariant(f"{m}-L{length}", f"{m} L={length}", m, length, changes))
        return out
    raise ValueError(f"unknown sweep {kind!r}; choose from {', '.join(SWEEP_KINDS)}")


def reused_method(variant: SweepVariant, plan: CampaignPlan) -> str | None:
    """The campaign drafter a variant is, when it needs no training of its own: the same
    method with its preset unchanged, trained with the same budget."""
    same_budget = plan.sweep_epochs is None or plan.sweep_epochs == plan.epochs
    return variant.method if same_budget and not variant.changes and variant.method in METHODS else None


def training_order(kind: str, variants: list[SweepVariant]) -> list[SweepVariant]:
    """The order the variants train in: the depth sweep's deepest first (the 5-layer DSpark is
    the paper's configuration and answers its claims; the 1-layer one matters least and is
    cheapest), the block-size sweep's as listed. The report keeps the sweep's own order."""
    return sorted(variants, key=lambda v: -v.value) if kind == "depth" else list(variants)


def parse_sweeps(text: str) -> tuple[str, ...]:
    """``--sweeps depth,block-size`` -> the kinds, checked (ValueError names the bad one)."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in SWEEP_KINDS]
    if bad:
        raise ValueError(f"unknown --sweeps {', '.join(bad)}; choose from {', '.join(SWEEP_KINDS)}")
    return kinds


def run_sweep(
    campaign: Campaign, kind: str, cache: dict[str, Any], trained: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Train the variants of one sweep (each its own resumable stage), then evaluate them
    together on the evaluation sets and write ``sweeps/<kind>/report.md`` with its figure."""

    p = campaign.plan
    plan = sweep_plan(p)
    preset_of = dict(zip(METHODS, p.presets))
    bases = {m: getattr(presets, preset_of[m])() for m in SWEPT_METHODS}
    variants = sweep_variants(kind, p, bases)
    runs = {}
    for v in training_order(kind, variants):
        reuse = reused_method(v, p)
        if reuse is not None:
            runs[v.name] = trained.get(reuse) or campaign.train(reuse, preset_of[reuse], cache)
        else:
            runs[v.name] = campaign.train(
                v.method, preset_of[v.method], cache, name=v.name, changes=v.changes, plan=plan
            )
    key = {name: r["drafter_id"] for name, r in runs.items()} | p.part(*campaign.EVAL_FIELDS)

    def run() -> dict[str, Any]:

        drafters = {
            v.label: load_drafter(campaign.out / runs[v.name]["drafter"], campaign.target) for v in variants
        }
        result = campaign.decode_eval(drafters, baseline=False)
        chosen = [Variant(v.label, v.method, v.value, v.config(bases[v.method])) for v in variants]
        swept = SweepResult(kind, chosen, sweep_points(chosen, result), result)
        meta = {
            "target": p.target,
            "campaign": str(campaign.out),
            "training": f"{plan.epochs:g} epochs or plateau",
        }
        report = write_sweep_report(swept, campaign.out / "sweeps" / kind, meta)
        return {
            "variants": {
                v.label: {k: runs[v.name][k] for k in ("drafter", "steps", "epochs")} for v in variants
            },
            "points": [dataclasses.asdict(pt) for pt in swept.points],
            "report": str(report.relative_to(campaign.out)),
        }

    return campaign.stages.run(f"sweep-{kind}", key, run)
