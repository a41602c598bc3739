"""Is the payoff controller's geometric acceptance model biased over all rounds? (issue 17)

Decodes greedy requests with every round drafted (``fixed`` policy, γ = 7, no payoff
control; tiny target, fp32, one thread, 8 requests at once, 96 tokens) and compares the
mean drafts accepted per 7-draft round with the geometric model ``E = e Σ_{k<7} q^k`` at
the pooled first-draft rate ``e`` and conditional later rate ``q`` (the controller's
``AcceptanceRecord`` counts, undecayed), and prints the per-position hazards (the
Kaplan–Meier conditional acceptance) the geometric model collapses into one ``q``.

    python scripts/acceptance_model_check.py dspark,dflash,eagle3 PROMPTS.jsonl[,...]
"""

# ruff: noqa: E501 (report lines)
import sys
from pathlib import Path

import numpy as np
import torch

from dspark.commands.loading import load_inference_target
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.drafters.registry import build_drafter
from dspark.engine import Engine, EngineConfig
from dspark.protocols import SamplingParams

torch.set_num_threads(1)
target = load_inference_target(None, "float32")
for name in sys.argv[1].split(","):
    drafter = build_drafter(name, target)
    for prompt_set in sys.argv[2].split(","):
        ids = [prompt_ids(target.tokenizer, p) for p in load_prompts(prompt_set, 8)]
        config = EngineConfig(block_size=7, policy="fixed", max_batch=8, max_seq_len=600, payoff=False)
        results = Engine(target, drafter, config).generate(
            ids, SamplingParams(temperature=0.0, max_tokens=96)
        )
        acc = np.array([rd.accepted for r in results for rd in r.rounds if rd.proposed == 7])
        e = np.mean(acc > 0)
        later_tested = sum(min(a + 1, 7) - 1 for a in acc)
        q = sum(max(a - 1, 0) for a in acc) / max(later_tested, 1)
        geometric = e * sum(q**k for k in range(7))
        survival = [np.mean(acc >= k) for k in range(1, 8)]
        hazards = [survival[0]] + [
            survival[k] / survival[k - 1] if survival[k - 1] else 0.0 for k in range(1, 7)
        ]
        print(
            f"{name} {Path(prompt_set).stem}: {len(acc)} rounds, accepted {acc.mean():.2f}, geometric {geometric:.2f} "
            f"(e {e:.2f}, q {q:.2f}); hazards {np.round(hazards, 2).tolist()}"
        )
