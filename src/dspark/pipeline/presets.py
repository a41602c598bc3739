"""Every preset of the pipeline, in one table: :data:`PRESETS`.

Two commands run the same stages (regenerate → train → calibrate → evaluate → report) at
different budgets. ``dspark quickstart`` counts its budget in optimizer steps on fixed
prompt counts and ends with a serving sweep (:class:`QuickstartPlan`: ``tiny_fast`` with
``--fast``, else ``tiny``); ``dspark campaign`` counts epochs over a feature cache and stops
a drafter when its expected τ plateaus (:class:`CampaignPlan`: one preset per ``--target``).
Each plan is a frozen dataclass; a stage's resume key is the part of the plan it reads
(``part``), so a stage reruns exactly when its numbers change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

METHODS = ("dflash", "dspark", "eagle3")  # trained with equal budgets, in this order
DOMAINS = ("math", "code", "chat")  # the built-in prompt sets


class _Parts:
    def part(self, *names: str) -> dict[str, Any]:
        """The fields a stage depends on (its resume key)."""
        values = dataclasses.asdict(self)
        return {n: list(values[n]) if isinstance(values[n], tuple) else values[n] for n in names}


@dataclass(frozen=True, kw_only=True)
class QuickstartPlan(_Parts):
    """A quickstart run on the embedded tiny target: step budgets, then a serving sweep."""

    # regenerate: the target answers this many of its own training prompts (balanced over domains)
    train_prompts: int = 240
    regen_max_tokens: int = 128
    regen_temperature: float = 1.0
    # train: every method gets exactly this budget (its tiny preset's architecture)
    train_steps: int = 150
    batch_size: int = 8
    micro_batch_size: int = 4
    num_anchors: int = 64
    max_length: int = 256
    lr: float = 1e-3
    # calibrate DSpark on the built-in prompts after the evaluation ones (disjoint sets)
    calib_prompts: int = 12  # per domain
    # evaluate on the first prompts of each built-in set, temperature 1 (the paper's setting)
    eval_prompts: int = 8  # per domain
    eval_max_tokens: int = 96
    temperature: float = 1.0
    # validation set: the target's answers to the built-in prompts after the calibration ones
    # (per domain); every drafter's expected τ is measured on it (quickstart/validation.py)
    val_prompts: int = 8
    # serving sweep with the calibrated DSpark drafter behind the real HTTP server
    serve_policies: tuple[str, ...] = ("none", "fixed:1", "fixed", "prefix")
    serve_concurrency: tuple[int, ...] = (1, 4, 16)
    serve_max_tokens: int = 48
    block_size: int = 7  # γ of every drafter
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class CampaignPlan(_Parts):
    """One target's campaign: epoch budgets over a feature cache, plateau stops, sweeps."""

    target: str  # a target name of dspark.presets (tiny, smollm2) or a model folder
    presets: tuple[str, ...]  # drafter preset functions, one per method of METHODS
    prompt_source: str = "tiny-corpus"  # tiny-corpus (the target's own) | synthetic (campaign/prompts.py)
    # regenerate: the target answers its training prompts (its own distribution, DESIGN §7)
    prompts: int | None = None  # None = all
    regen_max_tokens: int = 256
    regen_temperature: float = 1.0
    regen_batch: int = 16
    # feature cache: the target forward paid once for every drafter and epoch
    cache_dtype: str = "bf16"
    max_length: int = 512
    # train: equal budgets; each stops at `epochs` or when expected τ stops rising
    epochs: float = 10.0
    batch_size: int = 8
    micro_batch_size: int = 4
    num_anchors: int = 64
    lr: float = 1e-3
    save_every: int = 200
    log_every: int = 20
    plateau_tail: float = 0.2  # compare expected τ now with 20 % of the steps ago ...
    plateau_gain: float = 0.01  # ... and stop below a 1 % rise
    plateau_min_epochs: float = 2.0
    # evaluate: built-in prompt sets (never trained on), temperature 1, DeepSpec's γ
    eval_sets: tuple[str, ...] = DOMAINS
    eval_prompts: int = 20
    eval_max_tokens: int = 128
    temperature: float = 1.0
    seed: int = 0
    # N: every drafter proposes from the N most frequent tokens of the regenerated data
    # ; None = each preset's own choice. In the train stage's key only when set.
    draft_vocab: int | None = None
    # sweeps (campaign/sweeps.py, `--sweeps`): the paper's Figs. 3 and 4 at this budget
    sweep_epochs: float | None = None  # None = `epochs` (the campaign's drafters are reused)
    depth_layers: tuple[int, ...] = (1, 2, 5)  # DSpark depths (Fig. 3) ...
    depth_baseline_layers: int = 5  # ... against a DFlash this deep
    block_lengths: tuple[int, ...] = (4, 8, 12, 16)  # draft lengths γ + 1 (Fig. 4)

    def steps(self, samples: int) -> int:
        """Optimizer steps of ``epochs`` passes over ``samples`` at this batch size."""
        return max(1, round(self.epochs * samples / self.batch_size))


PRESETS: dict[str, QuickstartPlan | CampaignPlan] = {
    # `dspark quickstart --fast`: a smoke run of every stage (< 3 min on 2 cores)
    "tiny_fast": QuickstartPlan(
        train_prompts=24,
        regen_max_tokens=48,
        train_steps=6,
        batch_size=4,
        micro_batch_size=4,
        num_anchors=16,
        max_length=128,
        calib_prompts=3,
        eval_prompts=2,
        eval_max_tokens=32,
        val_prompts=2,
        serve_policies=("none", "prefix"),
        serve_concurrency=(1, 4),
        serve_max_tokens=24,
    ),
    # `dspark quickstart`: the whole pipeline on the tiny target (< 20 min on 2 cores)
    "tiny": QuickstartPlan(),
    # `dspark campaign --target tiny`: the tiny target's drafters trained to a plateau
    "tiny_converged": CampaignPlan(target="tiny", presets=("dflash_tiny", "dspark_tiny", "eagle3_tiny")),
    # `dspark campaign --target smollm2`. Prompts composed offline, never the benchmark sets.
    # Every drafter proposes from the 8,192 most frequent tokens of the regenerated answers:
    # 2.2× the training tokens per CPU-second and 0.32× the drafting time of the full 49,152
    # (BENCHMARKS.md, "Reduced draft vocabulary"), and DSpark's folder fits 25 MB only then;
    # 32 answers per regeneration batch.
    "smollm2_converged": CampaignPlan(
        target="smollm2",
        presets=("dflash_smollm2", "dspark_smollm2", "eagle3_smollm2"),
        prompt_source="synthetic",
        prompts=3000,
        max_length=768,
        regen_batch=32,
        draft_vocab=8192,
    ),
}


def quickstart_plan(fast: bool) -> QuickstartPlan:
    """The plan ``dspark quickstart`` runs: ``tiny_fast`` with ``--fast``, else ``tiny``."""
    plan = PRESETS["tiny_fast" if fast else "tiny"]
    assert isinstance(plan, QuickstartPlan)
    return plan


def campaign_plans() -> dict[str, CampaignPlan]:
    """The campaign presets by target: what ``dspark campaign --target`` chooses from."""
    return {p.target: p for p in PRESETS.values() if isinstance(p, CampaignPlan)}
