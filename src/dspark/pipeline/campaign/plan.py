"""What a campaign does for each target: data, the equal training budget, the evaluation."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

METHODS = ("dflash", "dspark", "eagle3")  # trained with equal budgets, in this order


@dataclass(frozen=True, kw_only=True)
class CampaignPlan:
    """One target's campaign; a stage reruns when its part of the plan changes."""

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
    eval_sets: tuple[str, ...] = ("math", "code", "chat")
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

    def part(self, *names: str) -> dict[str, Any]:
        """The fields a stage depends on (its resume key)."""
        values = dataclasses.asdict(self)
        return {n: list(values[n]) if isinstance(values[n], tuple) else values[n] for n in names}

    def steps(self, samples: int) -> int:
        """Optimizer steps of ``epochs`` passes over ``samples`` at this batch size."""
        return max(1, round(self.epochs * samples / self.batch_size))


PLANS: dict[str, CampaignPlan] = {
    "tiny": CampaignPlan(target="tiny", presets=("dflash_tiny", "dspark_tiny", "eagle3_tiny")),
    # Prompts composed offline, never the benchmark sets. Every drafter proposes from the
    # 8,192 most frequent tokens of the regenerated answers: 2.2× the training tokens per
    # CPU-second and 0.32× the drafting time of the full 49,152 (BENCHMARKS.md, "Reduced draft
    # vocabulary"), and DSpark's folder fits 25 MB only then; 32 answers per regeneration batch.
    "smollm2": CampaignPlan(
        target="smollm2",
        presets=("dflash_smollm2", "dspark_smollm2", "eagle3_smollm2"),
        prompt_source="synthetic",
        prompts=3000,
        max_length=768,
        regen_batch=32,
        draft_vocab=8192,
    ),
}
