"""Where a batch-1 round's time goes: target, drafter backbone, sequential loop, sampling, bookkeeping.

``dspark bench round``. Two measurements, both greedy at batch 1:

* a micro-timing on one real state after its prompt's prefill: the target's 1-token
  decode step and its (k+1)-token verification forward, the target-side sampling
  (processing the verification logits and :func:`~dspark.sampling.rejection.verify`),
  the drafter's backbone (context sync, draft layers, LM head) and its sequential loop —
  today's and :func:`per_step_loop`, the loop as it was before it was vectorised, timed side by
  side in the same process;
* whole batch-1 engine decodes of the prompts, whose :class:`~dspark.engine.EngineStats`
  split each step into the target forward, ``propose``, ``update`` (the drafter absorbing
  the verified tokens' features) and the engine's own bookkeeping (everything else:
  scheduling, gathering rows, verification, commit).

Medians of ``repeats`` timings; the machine is shared, so the ratios are what to compare.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from dspark.bench.overhead import median_time
from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
from dspark.drafters.request_state import sample_tokens
from dspark.engine import Engine, EngineConfig
from dspark.heads import scale_confidence_logits
from dspark.protocols import SamplingParams, SequenceState
from dspark.sampling.probs import batch_probs
from dspark.sampling.rejection import verify
from dspark.targets import TargetAdapter

GREEDY = SamplingParams(temperature=0.0)


def per_step_loop(drafter, h, base, prev, sampling: list[SamplingParams], generators):
    """DSpark's sequential loop before it was vectorised (the reference of the speed-up and of its test).

    Given the backbone's ``h [R, K, H]``, base logits ``[R, K, V]`` and anchors ``[R]``,
    every step processes ``U_k + B_k`` through ``batch_probs``, draws with ``sample_tokens``
    and computes that step's confidence logit. Returns tokens ``[R, K]``, probs ``[R, K, V]``
    and confidences ``[R, K]`` as ``propose`` reports them.
    """
    head = drafter.markov_head
    state = head.initial_state(h.shape[0], h) if head is not None else None
    tokens, probs, conf = [], [], []
    for k in range(h.shape[1]):
        logits_k, emb = base[:, k], None
        if head is not None:
            bias, emb, state = head.step(prev, h[:, k], state)
            logits_k = logits_k + bias.float()
        p_k = batch_probs(logits_k.unsqueeze(1), sampling).squeeze(1)  # [R, V]
        prev = sample_tokens(p_k, sampling, generators)
        if drafter.confidence_head is not None:
            conf.append(drafter._confidence_logits(h[:, k], emb))
        tokens.append(prev)
        probs.append(p_k)
    confidences = None
    if conf:
        scaled = scale_confidence_logits(torch.stack(conf, -1).float(), drafter.config.sts_temperatures)
        confidences = torch.sigmoid(scaled)
    return torch.stack(tokens, -1), torch.stack(probs, 1), confidences


@dataclass(frozen=True, kw_only=True)
class RoundBreakdown:
    """Seconds per part of a batch-1 round (micro-timings) and per engine step (whole decodes)."""

    dtype: str
    block_size: int
    decode_step_s: float  # target forward of 1 token
    verify_s: float  # target forward of the anchor + k drafts, with features
    sampling_s: float  # target-side: logits → probs, verification
    backbone_s: float  # drafter: context sync + draft layers + LM head
    loop_s: float  # drafter: today's sequential loop (greedy)
    loop_before_s: float  # drafter: the per-step loop before it was vectorised
    propose_s: float  # drafter.propose as a whole
    engine_steps: int
    engine_forward_s: float  # per engine step
    engine_draft_s: float  # per engine step: propose
    engine_update_s: float  # per engine step: drafter.update (the new features into its context)
    engine_bookkeeping_s: float  # per engine step: all but the forward, propose and update
    engine_tokens_per_s: float

    @property
    def loop_speedup(self) -> float:
        return self.loop_before_s / self.loop_s if self.loop_s else 0.0

    def as_dict(self) -> dict:
        return asdict(self) | {"loop_speedup": round(self.loop_speedup, 3)}


def _state(target: TargetAdapter, drafter, ids: list[int]) -> SequenceState:
    out = target.forward(
        torch.tensor([ids[:-1]], device=target.device), target.new_cache(), layer_ids=drafter.target_layer_ids
    )
    return SequenceState(0, list(ids), len(ids), features=out.features[0])


def round_breakdown(
    target: TargetAdapter,
    drafter,
    prompts: list[list[int]],
    *,
    block_size: int = 7,
    max_tokens: int = 64,
    repeats: int = 20,
) -> RoundBreakdown:
    """Time the parts of a greedy batch-1 round (see the module docstring)."""
    assert getattr(drafter, "markov_head", None) is not None, "needs a drafter with a sequential head"
    ids = prompts[0]
    state = _state(target, drafter, ids)
    K = min(block_size, drafter.block_size)
    drafter.backbone.prepare([state], [GREEDY])
    h = drafter.backbone.block_hidden_infer([state])[:, :K]  # [1, K, H]
    base = drafter.backbone.logits(h)
    anchor = torch.tensor([ids[-1]], device=target.device)

    def loop():
        tokens, embs = drafter._greedy_loop(h, base, anchor)
        drafter._block_confidences(h, embs)
        return tokens

    cache = target.new_cache()
    target.forward(torch.tensor([ids[:-1]], device=target.device), cache, with_features=False)
    length = cache.length
    block = torch.tensor([[ids[-1], *loop()[0].tolist()]], device=target.device)  # [1, K+1]

    def forward(n: int):
        def run():
            out = target.forward(block[:, :n], cache, with_features=True, layer_ids=drafter.target_layer_ids)
            target.rollback(cache, length)
            return out

        return run

    logits = forward(K + 1)().logits  # [1, K+1, V]
    draft_probs = torch.zeros(1, K, target.vocab_size).scatter_(-1, block[:, 1:, None], 1.0)

    def sampling():
        p = batch_probs(logits, [GREEDY])
        verify(
            block[:, 1:], torch.tensor([K]), draft_probs, p, greedy=torch.tensor([True]), generators=[None]
        )

    def backbone():
        drafter.backbone.logits(drafter.backbone.block_hidden_infer([state])[:, :K])

    def loop_before():
        per_step_loop(drafter, h, base, anchor, [GREEDY], [None])

    with torch.no_grad():
        times = {
            "decode_step_s": median_time(forward(1), repeats),
            "verify_s": median_time(forward(K + 1), repeats),
            "sampling_s": median_time(sampling, repeats),
            "backbone_s": median_time(backbone, repeats),
            "loop_s": median_time(loop, repeats),
            "loop_before_s": median_time(loop_before, repeats),
            "propose_s": median_time(lambda: drafter.propose([state], K, [GREEDY]), repeats),
        }
    context = min(1024, target.max_context)
    engine = Engine(
        target,
        drafter,
        EngineConfig(payoff=False, block_size=K, policy="fixed", max_batch=1, max_seq_len=context),
    )
    engine.generate([prompts[0][:8]], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    engine.stats = type(engine.stats)()
    started = time.perf_counter()
    for p in prompts:
        engine.generate([p], SamplingParams(temperature=0.0, max_tokens=max_tokens))
    seconds = time.perf_counter() - started
    s = engine.stats
    steps = max(s.steps, 1)
    return RoundBreakdown(
        dtype=str(target.dtype).removeprefix("torch."),
        block_size=K,
        **times,
        engine_steps=s.steps,
        engine_forward_s=s.forward_s / steps,
        engine_draft_s=s.draft_s / steps,
        engine_update_s=s.update_s / steps,
        engine_bookkeeping_s=(s.step_s - s.forward_s - s.draft_s - s.update_s) / steps,
        engine_tokens_per_s=s.emitted / seconds if seconds else 0.0,
    )


def untrained_dspark(target, block_size: int):
    """A seeded random-init DSpark drafter for ``target``, shaped as the shipped tiny one."""
    torch.manual_seed(0)
    mask = target.tokenizer.pad_token_id if target.tokenizer is not None else None
    config = DSparkConfig(num_layers=2, block_size=block_size, markov_rank=64, mask_token_id=mask or 0)
    return DSparkDrafter.from_target(target, config).eval()
