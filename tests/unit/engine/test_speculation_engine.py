"""The speculation controller and per-request proposer choice inside the engine: lossless, and it
stops drafting where drafting does not pay and resumes where it does.

Timing is hand-made: the engine's SPS table is the fixture's (a step of B tokens takes
1 + B/12 time units) and drafting costs are fixed per proposer (``draft_costs``), so the
controller's decisions, and these assertions, never read a wall clock.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from scipy.stats import chi2_contingency
from transformers import Qwen3Config, Qwen3ForCausalLM

from dspark.drafters.ngram import NgramDrafter
from dspark.engine import Engine, EngineConfig
from dspark.engine.speculation import MODEL, Speculation
from dspark.protocols import DraftBlock, DrafterTraits, SamplingParams
from dspark.scheduler import ControllerConfig
from dspark.targets import TargetAdapter
from tests.conftest import TINY_DIMS

from .conftest import VOCAB, greedy_references, make_prompts
from .drafters import NoisyOracleDrafter, SeededRandomDrafter
from .test_engine_greedy import cases, expected, run_engine  # noqa: F401  (cases: a fixture)

CHEAP = (("model", 0.05), ("ngram", 0.0))  # time units per drafting request (a step is ~1.1)


def payoff_config(batch: int, policy: str = "fixed", costs=CHEAP, **kw) -> EngineConfig:
    return EngineConfig(policy=policy, max_batch=batch, block_size=7, payoff=True, draft_costs=costs, **kw)


@pytest.mark.parametrize("policy", ["fixed", "prefix"])
@pytest.mark.parametrize("batch,num_requests", [(1, 3), (4, 8), (16, 16)])
def test_greedy_equals_plain_greedy_with_payoff_and_proposer_choice(
    target, sps, request, policy, batch, num_requests
):
    prompts, refs, max_tokens = request.getfixturevalue("cases")
    prompts, max_tokens = prompts[:num_requests], max_tokens[:num_requests]
    engine = Engine(target, NoisyOracleDrafter(refs, VOCAB), payoff_config(batch, policy), sps=sps)
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in max_tokens]
    results = run_engine(engine, prompts, params, join_after=3)
    for prompt, m, result in zip(prompts, max_tokens, results):
        assert result.token_ids == expected(refs[tuple(prompt)], m, None)
    s = engine.stats
    assert s.accepted > 0
    assert s.model_rounds > 0 and s.ngram_rounds > 0, "both proposers should be chosen somewhere"


def test_ngram_drafter_alone_is_lossless_under_payoff(target, sps, request):
    prompts, refs, max_tokens = request.getfixturevalue("cases")
    engine = Engine(target, NgramDrafter(VOCAB), payoff_config(4), sps=sps)
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in max_tokens[:8]]
    results = run_engine(engine, prompts[:8], params, join_after=2)
    for prompt, m, result in zip(prompts, max_tokens, results):
        assert result.token_ids == expected(refs[tuple(prompt)], m, None)
    assert engine.stats.ngram_rounds > 0 and engine.stats.model_rounds == 0


def _samples(target, sps, drafter, prompt, n: int, batch: int, index: int, payoff: bool) -> torch.Tensor:
    """Token ``index`` of ``n`` seeded sampled answers to ``prompt``."""
    config = payoff_config(batch) if payoff else EngineConfig(policy="fixed", max_batch=batch)
    engine = Engine(target, drafter if payoff else None, config, sps=sps)
    params = [SamplingParams(temperature=1.0, max_tokens=index + 1, seed=5000 + i) for i in range(n)]
    results = engine.generate([prompt] * n, params)
    if payoff:
        s = engine.stats
        assert s.verified > 0 and s.plain_rounds > 0, "the controller should both draft and skip"
    return torch.tensor([r.token_ids[index] for r in results])


@pytest.mark.parametrize("batch,n", [(1, 240), (16, 480)])
def test_sampled_tokens_keep_the_target_distribution(target, sps, batch, n):
    """Token 6 of seeded sampled answers, with the controller choosing between a sampling model
    drafter and the n-gram per request, against plain sampling (two-sample chi-square)."""
    prompt = make_prompts(1, seed=21, min_len=20)[0]
    drafter = SeededRandomDrafter(VOCAB, sharpness=1.0)
    ours = _samples(target, sps, drafter, prompt, n, batch, 6, payoff=True)
    plain = _samples(target, sps, None, prompt, 2 * n, 64, 6, payoff=False)
    # Buckets of about equal plain frequency: the 7 most frequent tokens, then the rest.
    top = torch.bincount(plain, minlength=VOCAB).argsort(descending=True)[:7]
    bucket = torch.full((VOCAB,), 7, dtype=torch.long)
    bucket[top] = torch.arange(7)
    table = torch.stack([torch.bincount(bucket[x], minlength=8) for x in (ours, plain)]).numpy()
    assert chi2_contingency(table).pvalue > 1e-3


def config_probe_max() -> int:
    return ControllerConfig().probe_max


class PhaseDrafter(NoisyOracleDrafter):
    """Rejected drafts (token 0) for the first ``switch`` generated tokens, the exact greedy
    continuation afterwards: a drafter that is useless until the text turns predictable."""

    def __init__(self, references, vocab_size: int, switch: int) -> None:
        super().__init__(references, vocab_size, error=0.0)
        self.switch = switch

    def propose(self, states, max_len, sampling) -> DraftBlock:
        block = super().propose(states, max_len, sampling)
        for r, s in enumerate(states):
            if len(s.token_ids) - s.prompt_len < self.switch:
                block.tokens[r] = 0
        probs = torch.nn.functional.one_hot(block.tokens, self.vocab_size).float()
        return DraftBlock(tokens=block.tokens, lengths=block.lengths, probs=probs)


def test_falls_back_when_unprofitable_and_resumes_when_predictable(target, sps):
    """A costly drafter (half a step per request) that is always rejected: the request decodes
    plainly with sparse short probes; once its drafts become right, it drafts full blocks again."""
    prompt = make_prompts(1, seed=31, min_len=12)[0]
    n, switch = 120, 40
    ref = greedy_references(target, [prompt], n)[0][0]
    drafter = PhaseDrafter({tuple(prompt): ref}, VOCAB, switch)
    costly = (("model", 0.5), ("ngram", 0.0))
    config = payoff_config(1, costs=costly, choose_proposer=False)
    engine = Engine(target, drafter, config, sps=sps)
    result = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=n))[0]
    assert result.token_ids == ref
    position, before, after = 0, [], []
    for r in result.rounds:
        (before if position < switch else after).append(r)
        position += r.emitted
    settled = before[4:]  # after the first rejections taught it
    assert sum(r.proposed == 0 for r in settled) >= 0.8 * len(settled)
    assert all(r.proposed <= 2 for r in settled)  # probes are short
    assert sum(r.proposed > 0 for r in settled) >= 1  # ... but it does probe
    picked_up = next(i for i, r in enumerate(after) if r.accepted > 0)  # the first probe that succeeds
    assert picked_up <= config_probe_max()  # within one probe interval
    late = after[picked_up + 1 : -1]  # from then on full blocks (the last round is cut by max_tokens)
    assert len(late) >= 5 and all(r.proposed >= 5 and r.accepted == r.proposed for r in late)
    assert len(result.rounds) < 0.7 * n  # speculation came back


def _cycle_target() -> tuple[TargetAdapter, list[int]]:
    """A target whose greedy next token is ``perm[x]``: tokens 3..12 form a 10-cycle (repetitive
    text), 13..127 a 115-cycle (nothing repeats within 120 tokens). Built from a random Qwen3
    with every attention and MLP output zeroed, so the residual stream is the token's
    embedding, and the LM head holding row ``E[x]`` at ``perm[x]``."""
    torch.manual_seed(0)
    t = TargetAdapter(Qwen3ForCausalLM(Qwen3Config(**TINY_DIMS)).eval())
    t.eos_token_ids = ()
    perm = list(range(VOCAB))
    for cycle in (list(range(3, 13)), list(range(13, VOCAB))):
        for a, b in zip(cycle, cycle[1:] + cycle[:1]):
            perm[a] = b
    perm[0] = perm[1] = perm[2] = 13
    model = t.model.model
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        E = model.embed_tokens.weight
        head = torch.zeros_like(t.model.lm_head.weight)
        for x in range(3, VOCAB):
            head[perm[x]] += 4.0 * E[x] / E[x].norm()
        t.model.lm_head.weight.copy_(head)
    return t, perm


def test_proposer_choice_follows_the_text(sps):
    """A perfect model drafter costing about a step next to the free n-gram lookup: on repetitive text
    the lookup is chosen, on text where its continuations are wrong the model is."""
    target, perm = _cycle_target()

    def continuation(prompt, n):
        out, x = [], prompt[-1]
        for _ in range(n):
            x = perm[x]
            out.append(x)
        return out

    loop = [60, 61, 5]  # then 6 7 ... 12 3 4 ... 12 3 ...
    free = [45, 3, 50, 9, 40]  # then 41 42 ...: at 45 the lookup proposes 3 50 9 40, all wrong
    refs = {tuple(p): continuation(p, 120) for p in (loop, free)}
    costs = (("model", 1.0), ("ngram", 0.0))  # the model drafter costs about a step
    stats = {}
    for name, prompt in (("loop", loop), ("free", free)):
        engine = Engine(
            target, NoisyOracleDrafter(refs, VOCAB, error=0.0), payoff_config(1, costs=costs), sps=sps
        )
        res = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=120))[0]
        assert res.token_ids == refs[tuple(prompt)]
        stats[name] = engine.stats
    # repetitive: the lookup. The model drafts the first rounds, before the text has repeated,
    # and a few later ones where its perfect record beats a short lookup by more than its cost
    assert stats["loop"].ngram_rounds > 1.5 * stats["loop"].model_rounds
    assert stats["free"].model_rounds > 3 * stats["free"].ngram_rounds  # free text: the model
    assert stats["free"].model_rounds > 0


@pytest.mark.parametrize("name", ["dflash", "dspark", "eagle3"])
def test_feature_drafters_catch_up_after_rounds_they_did_not_draft(target, sps, name):
    """Under the controller a lazy model drafter is told only about its own rounds and catches up
    from ``state.features`` when it next drafts: output unchanged, drafted and skipped rounds."""
    from .test_engine_drafters import build

    prompts = make_prompts(6, seed=21)
    refs = greedy_references(target, prompts, 24)
    costs = (("model", 0.3), ("ngram", 0.0))
    config = EngineConfig(policy="fixed", max_batch=4, block_size=4, payoff=True, draft_costs=costs)
    engine = Engine(target, build(name, target), config, sps=sps)
    greedy = [SamplingParams(temperature=0.0, max_tokens=24)] * 6
    results = run_engine(engine, prompts, greedy, join_after=2)
    for (ref, gap), result in zip(refs, results):
        if gap > 1e-3:  # a near-tie may flip under batched rounding
            assert result.token_ids == ref
    s = engine.stats
    assert s.model_rounds > 0 and s.plain_rounds > 0  # drafted, and skipped rounds


def test_the_engine_reports_its_decode_steps_to_the_prices_unless_timing_is_fixed(target, sps):
    """Measured costs: every engine step without prefill reaches the step-cost fit the
    controller prices with, and the drafter's calls are timed; hand-made timing
    (``draft_costs``) reads no clock."""
    from .test_engine_drafters import build

    prompts = make_prompts(2, seed=5)
    greedy = [SamplingParams(temperature=0.0, max_tokens=12)] * 2
    measured = Engine(target, build("dflash", target), EngineConfig(max_batch=2, block_size=4), sps=sps)
    run_engine(measured, prompts, greedy, join_after=2)
    steps = measured.speculation.steps.steps
    assert steps.weight > 0 and 1 <= steps.mean(1) <= 2  # mean requests of the observed steps
    assert measured.speculation.calls[MODEL].observed  # the drafter's calls were timed
    fixed = Engine(target, build("dflash", target), payoff_config(2), sps=sps)
    run_engine(fixed, prompts, greedy, join_after=2)
    assert fixed.speculation.steps.steps.weight == 0 and not fixed.speculation.calls[MODEL].observed


def test_drafting_inside_an_unobserved_step_does_not_reach_the_next_steps_price(target, sps):
    """A step with prefill is not a point of the step-cost fit; the drafting seconds spent inside
    it (a new request's catch-up, say) must not be subtracted from the next observed step
    (they made its seconds negative and bent the fit for a whole run)."""
    from .test_engine_drafters import build

    spec = Speculation(build("dflash", target), VOCAB, 4, sps)
    spec.start_step()
    spec.drafting_s += 0.25  # drafting inside a step with prefill, which is not observed
    spec.start_step()
    spec.drafting_s += 0.002  # this step's own drafting
    spec.observe_step(2, 2, 0.012)
    assert spec.steps.steps.mean(3) == pytest.approx(0.010)  # the step's own seconds, less its own drafting


def test_a_lazy_drafters_first_proposal_absorbs_the_prompt_apart(target, sps):
    """DFlash, DSpark and Eagle3 are lazy (``DrafterTraits.lazy``): told only about their own
    rounds. A request's first model proposal absorbs its whole prompt before the call, so the
    call itself is timed clean for the drafting-cost fit."""
    from .test_engine_drafters import build

    for name in ("dflash", "dspark", "eagle3"):
        assert build(name, target).traits.lazy, name
    prompts = make_prompts(3, seed=9)
    engine = Engine(target, build("dflash", target), EngineConfig(max_batch=3, block_size=4), sps=sps)
    proposer = engine.speculation.proposers[MODEL]
    absorbed, catch_up = [], proposer.catch_up

    def recorded(states, params):
        absorbed.append(proposer.pending(states[0]))
        return catch_up(states, params)

    proposer.catch_up = recorded
    run_engine(engine, prompts, [SamplingParams(temperature=0.0, max_tokens=10)] * 3, join_after=3)
    assert engine.speculation.calls[MODEL].observed
    assert max(absorbed) >= min(len(p) for p in prompts) - 1  # a whole prompt, before the call


class BlindAfterPromptOracle(NoisyOracleDrafter):
    """Right on every draft except in a request's first round, where it never is: a drafter
    trained on response anchors only (DESIGN §6), as the shipped ones are."""

    def __init__(self, references, vocab_size: int, *, drafts_after_prompt: bool) -> None:
        super().__init__(references, vocab_size, error=0.0)
        self.traits = DrafterTraits(after_prompt=drafts_after_prompt)
        self.first_round_calls = 0

    def propose(self, states, max_len, sampling):
        block = super().propose(states, max_len, sampling)
        for r, s in enumerate(states):
            if len(s.token_ids) == s.prompt_len:
                self.first_round_calls += 1
                block.tokens[r] = (block.tokens[r] + 1) % self.vocab_size  # every draft wrong
                block.probs[r] = torch.nn.functional.one_hot(block.tokens[r], self.vocab_size).float()
        return block


@pytest.mark.parametrize("payoff", [True, False])
def test_a_drafter_that_cannot_draft_after_the_prompt_is_not_asked_there(target, sps, payoff):
    """Its first-round drafts would all be rejected: that round decodes plainly, output unchanged.
    Asked there anyway (a drafter that says it drafts there), under the controller the
    rejections reach no acceptance record: pooled, they taught the controller that the model
    never pays, and it stopped drafting."""
    prompts = make_prompts(8, seed=17, min_len=10)
    refs = greedy_references(target, prompts, 40)
    references = {tuple(p): r for p, (r, _) in zip(prompts, refs)}
    # drafting priced free: an untried model is tried at once, in some request's first round
    config = payoff_config(8, costs=(("model", 0.0), ("ngram", 0.0)), choose_proposer=False)
    config = config if payoff else dataclasses.replace(config, payoff=False)
    stats = {}
    for skips in (True, False):
        drafter = BlindAfterPromptOracle(references, VOCAB, drafts_after_prompt=not skips)
        engine = Engine(target, drafter, config, sps=sps)
        results = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=40))
        assert [r.token_ids for r in results] == [r for r, _ in refs]
        stats[skips] = (engine.stats, drafter.first_round_calls)
    (skipped, calls), (asked, asked_calls) = stats[True], stats[False]
    assert calls == 0 and asked_calls > 0
    assert asked_calls == len(prompts)  # each request once, in its first round
    if payoff:
        # not held back by those misses: a first round's outcome prices no later round (pooled,
        # it cut the model rounds and took 1.4x the steps)
        assert asked.model_probes == skipped.model_probes == 0
        assert asked.model_rounds >= skipped.model_rounds and asked.steps <= skipped.steps
    else:
        assert skipped.steps <= asked.steps


def test_the_decoding_loop_does_not_ask_it_after_the_prompt_either(target):
    from dspark.decoding import speculative_generate

    prompt = make_prompts(1, seed=23, min_len=10)[0]
    ref = greedy_references(target, [prompt], 30)[0][0]
    for asked in (False, True):
        drafter = BlindAfterPromptOracle({tuple(prompt): ref}, VOCAB, drafts_after_prompt=asked)
        result = speculative_generate(target, drafter, prompt, SamplingParams(temperature=0.0, max_tokens=30))
        assert result.token_ids == ref
        assert drafter.first_round_calls == int(asked)
        first = result.rounds[0]
        assert (first.proposed, first.accepted, first.emitted) == ((7, 0, 1) if asked else (0, 0, 1))
