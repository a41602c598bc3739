"""Acceptance in a request's first round against the rest, per drafter (issue 16's prompt-end anchors).

Greedy decoding through the engine (tiny target by default, fp32, one thread, batch 1,
``fixed`` policy, γ = 7, no payoff control), every round drafted — the first round after
the prompt included, whatever the drafter's ``drafts_after_prompt`` says — so that the
drafters are compared on the same rounds. Deterministic: no wall clock. Prints per drafter
and prompt set the drafts accepted in round 0 (the block anchored at the prompt's last
token), per later round, and τ (tokens per round) with round 0 asked and with it decoded
plainly (as the engine does for a drafter not trained there).

    python scripts/first_round.py PROMPTS.jsonl[,...] DRAFTER [DRAFTER ...] [--limit N] [--max-tokens N]

A DRAFTER is a name (``dspark``: the shipped one) or a drafter folder.
"""

import argparse
from pathlib import Path

import torch

from dspark.commands.loading import load_inference_target
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.engine import Engine, EngineConfig
from dspark.formats.build import build_drafter
from dspark.protocols import SamplingParams, drafts_after_prompt

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("prompts", help="comma-separated prompt sets (JSONL paths or built-in names)")
p.add_argument("drafters", nargs="+")
p.add_argument("--limit", type=int, default=12, help="prompts per set")
p.add_argument("--max-tokens", type=int, default=96)
args = p.parse_args()
torch.set_num_threads(1)
target = load_inference_target(None, "float32")
print(f"{'drafter':<28} {'set':<10} {'round 0':>8} {'later':>7} {'tau (asked)':>12} {'tau (plain 0)':>14}")
for spec in args.drafters:
    drafter = build_drafter(spec, target)
    path = Path(spec)  # a run folder's drafter/ is named by its run
    label = (path.parent.name if path.name == "drafter" else path.name) if path.is_dir() else spec
    label += " *" if drafts_after_prompt(drafter) else ""
    for prompt_set in args.prompts.split(","):
        ids = [prompt_ids(target.tokenizer, q) for q in load_prompts(prompt_set, args.limit)]
        engine = Engine(
            target,
            drafter,
            EngineConfig(payoff=False, block_size=7, policy="fixed", max_batch=1, max_seq_len=1024),
        )
        engine._drafts._after_prompt = True  # ask every drafter in round 0 (a benchmark aid)
        results = engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
        first = [r.rounds[0].accepted for r in results if r.rounds and r.rounds[0].proposed]
        later = [rd.accepted for r in results for rd in r.rounds[1:] if rd.proposed]
        tokens = sum(len(r.token_ids) for r in results)
        rounds = sum(len(r.rounds) for r in results)
        # round 0 decoded plainly instead: the same later rounds, round 0 emits one token
        plain0 = sum(len(r.token_ids) - r.rounds[0].emitted + 1 for r in results if r.rounds)
        print(
            f"{label:<28} {Path(prompt_set).stem:<10} {sum(first) / max(len(first), 1):8.2f} "
            f"{sum(later) / max(len(later), 1):7.2f} {tokens / rounds:12.3f} {plain0 / rounds:14.3f}"
        )
print("round 0 / later: drafts accepted (of 7) per round; * = the drafter asks to draft round 0")
