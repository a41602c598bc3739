"""Batch-1 decoding benchmark: HF ``generate`` vs our loop, with and without drafters.

Our methods run through the batch-1 reference loop (every draft verified), or, named
``drafter@policy`` (e.g. ``dspark@prefix``), through the batched engine with one KV slot
and that verification policy — the path ``dspark serve`` takes for a lone user. Every
method decodes the same prompts greedily in the same process, interleaved prompt by
prompt so that machine noise hits all of them alike; the figures that matter are the
ratios. Greedy outputs must be identical across methods (losslessness), and the report
says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm
from transformers import GenerationConfig

from dspark.data.chat import prompt_ids
from dspark.data.prompts import Prompt
from dspark.decoding import speculative_generate
from dspark.engine import Engine, EngineConfig
from dspark.errors import PromptTooLongError
from dspark.protocols import Drafter, SamplingParams
from dspark.targets import TargetAdapter

HF_METHOD = "hf-generate"
HF_PROMPT_LOOKUP = "hf-prompt-lookup"
HF_ASSISTED = "hf-assisted"


@dataclass
class MethodStats:
    tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    accepted: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tau(self) -> float:
        """Tokens per round, bonus included (DESIGN §2); 0 for HF generate (no rounds)."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0


@dataclass
class DecodeBenchResult:
    methods: dict[str, MethodStats]
    baseline: str  # method the speedups are relative to
    skipped: int = 0  # prompts that did not fit the target's context

    def speedup(self, method: str) -> float:
        return self.methods[method].tokens_per_s / self.methods[self.baseline].tokens_per_s

    def identical_outputs(self, method: str) -> bool:
        return self.methods[method].outputs == self.methods[self.baseline].outputs

    def rows(self) -> list[dict]:
        return [
            {
                "method": name,
                "tokens": s.tokens,
                "seconds": round(s.seconds, 3),
                "tokens_per_s": round(s.tokens_per_s, 2),
                "tau": round(s.tau, 3),
                "speedup": round(self.speedup(name), 3),
                "identical_to_baseline": self.identical_outputs(name),
            }
            for name, s in self.methods.items()
        ]


def batch1_engine(
    target: TargetAdapter,
    drafter: Drafter | None,
    policy: str,
    *,
    block_size: int,
    max_seq_len: int = 1024,
    payoff: bool = True,
    choose_proposer: bool = True,
) -> Engine:
    """An engine with one KV slot serving ``drafter`` under ``policy`` (SPS profile loaded or measured),
    with the payoff controller unless ``payoff`` is off."""
    config = EngineConfig(
        block_size=block_size,
        policy=policy,
        max_batch=1,
        max_seq_len=min(max_seq_len, target.max_context),
        payoff=payoff,
        choose_proposer=choose_proposer,
    )
    return Engine(target, drafter, config)


def _hf_generate(
    target: TargetAdapter, ids: list[int], max_tokens: int, temperature: float = 0.0, **assist
) -> list[int]:
    """HF ``generate``, greedy or pure sampling at ``temperature`` (no top-k/top-p);
    ``assist`` = ``prompt_lookup_num_tokens=`` or ``assistant_model=``."""
    sampled = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    config = GenerationConfig(
        **(sampled if temperature > 0 else {"do_sample": False}),
        max_new_tokens=max_tokens,
        eos_token_id=list(target.eos_token_ids),
        pad_token_id=target.tokenizer.pad_token_id if target.tokenizer else 0,
    )
    out = target.model.generate(torch.tensor([ids], device=target.device), generation_config=config, **assist)
    return out[0, len(ids) :].tolist()


def bench_decode(
    target: TargetAdapter,
    prompts: list[Prompt],
    drafters: dict[str, Drafter | None],
    *,
    max_tokens: int = 128,
    block_size: int = 7,
    include_hf: bool = True,
    baseline: str | None = None,
    hf_prompt_lookup: int = 0,
    hf_assistant=None,
    engines: dict[str, Engine] | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    strict: bool = False,
) -> DecodeBenchResult:
    """Decode every prompt greedily with each method; see the module docstring.

    ``hf_prompt_lookup > 0`` adds HF's prompt lookup with that many tokens;
    ``hf_assistant`` (a causal LM with the target's tokenizer) adds HF assisted generation.
    ``engines`` adds methods decoded by those engines (see :func:`batch1_engine`).
    ``temperature > 0`` samples (every method at that temperature, ours seeded per
    prompt); outputs then differ between methods and only the speeds compare.
    Prompts whose ids plus ``max_tokens`` do not fit the target's context are skipped
    and counted in ``result.skipped`` (``strict``: an error instead).
    """
    engines = engines or {}
    hf_assist = {}
    if include_hf and hf_prompt_lookup > 0:
        hf_assist[HF_PROMPT_LOOKUP] = {"prompt_lookup_num_tokens": hf_prompt_lookup}
    if include_hf and hf_assistant is not None:
        hf_assist[HF_ASSISTED] = {"assistant_model": hf_assistant}
    names = ([HF_METHOD] if include_hf else []) + list(hf_assist) + list(drafters) + list(engines)
    stats = {name: MethodStats() for name in names}
    skipped = 0
    for i, prompt in enumerate(tqdm(prompts, desc="decode bench", unit="prompt")):
        ids = prompt_ids(target.tokenizer, prompt)
        if len(ids) + max_tokens > target.max_context:
            if strict:
                raise PromptTooLongError(
                    f"{prompt.source}: {len(ids)} prompt tokens + {max_tokens} new ones exceed the "
                    f"target's context of {target.max_context}"
                )
            skipped += 1
            continue
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed + i)
        for name in names:
            started = time.perf_counter()
            if name == HF_METHOD or name in hf_assist:
                torch.manual_seed(seed + i)
                out = _hf_generate(target, ids, max_tokens, temperature, **hf_assist.get(name, {}))
                rounds, accepted = 0, 0
            else:
                if name in engines:
                    result = engines[name].generate([ids], params)[0]
                else:
                    result = speculative_generate(target, drafters[name], ids, params, block_size=block_size)
                out = result.token_ids
                rounds, accepted = len(result.rounds), sum(r.accepted for r in result.rounds)
            s = stats[name]
            s.seconds += time.perf_counter() - started
            s.tokens += len(out)
            s.rounds += rounds
            s.accepted += accepted
            s.outputs.append(out)
    return DecodeBenchResult(stats, baseline or names[0], skipped)


def verify_cost_ratio(target: TargetAdapter, *, context: int = 256, k: int = 8, repeats: int = 30) -> float:
    """Time of a k-token verification forward over the time of a 1-token decode step.

    Both run after a ``context``-token prefill, rolling back after each call; the
    median of ``repeats`` timings each. The batch-1 speedup ceiling is about
    (k) / ratio for a perfect drafter.
    """
    cache = target.new_cache()
    ids = torch.randint(0, target.vocab_size, (1, context + k), device=target.device)
    target.forward(ids[:, :context], cache, with_features=False)

    def timed(n: int) -> float:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            target.forward(ids[:, context : context + n], cache, with_features=False)
            times.append(time.perf_counter() - started)
            target.rollback(cache, context)
        return sorted(times)[len(times) // 2]

    timed(1), timed(k)  # warm-up
    return timed(k) / timed(1)
