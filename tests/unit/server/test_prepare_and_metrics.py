"""Request → engine parameters (limits the sampler can compute with), admission, speculation metrics."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from dspark.protocols import GenerationResult, RoundLog
from dspark.sampling import process_logits
from dspark.server.app import Admission
from dspark.server.errors import ApiError
from dspark.server.metrics import ServerMetrics
from dspark.server.prepare import check_fits, sampling_params
from dspark.server.schemas import ChatCompletionRequest, CompletionRequest


def test_extreme_but_valid_values_stay_computable():
    """Values the schema accepts must never give the sampler NaNs (that would kill the engine step)."""
    import torch

    req = CompletionRequest(prompt="x", temperature=1e-300, top_p=1e-300, top_k=10**30, max_tokens=10**9)
    params = sampling_params(req, prompt_len=10, capacity=64, vocab_size=100)
    assert params.temperature == 0.0 and params.top_k == 0 and params.max_tokens == 54
    hot = sampling_params(
        CompletionRequest(prompt="x", temperature=1e300, top_p=1e-300),
        prompt_len=1,
        capacity=8,
        vocab_size=100,
    )
    logits = torch.randn(2, 100) * 30
    for p in (params, hot):
        probs = process_logits(logits, p)
        assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(2))


def test_defaults_and_stop_strings():
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], stop="END")
    params = sampling_params(chat, prompt_len=5, capacity=64, vocab_size=100)
    assert params.max_tokens == 59 and params.stop == ("END",)  # chat: up to the context by default
    assert CompletionRequest(prompt=[1, 2]).max_tokens == 16  # OpenAI's completions default


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x", "max_tokens": "5"},  # strings are not numbers
        {"prompt": "x", "temperature": True},
        {"prompt": "x", "n": 2},
        {"prompt": "x", "stop": [""]},
        {"prompt": []},
        {"prompt": [-1]},
        {"prompt": "x", "seed": 2**64},
    ],
)
def test_strict_schema(body):
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate(body)


def test_prompt_must_leave_room_for_one_token():
    check_fits([1] * 63, 64)
    for ids in ([], [1] * 64):
        with pytest.raises(ApiError) as e:
            check_fits(ids, 64)
        assert e.value.status == 400


def test_admission_is_bounded_and_release_is_idempotent():
    admission = Admission(2)
    a, _ = admission.acquire(), admission.acquire()
    with pytest.raises(ApiError) as e:
        admission.acquire()
    assert e.value.status == 429
    a()
    a()
    assert admission.count == 1
    admission.acquire()


def _samples(metrics: ServerMetrics) -> dict:
    text = metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_speculation_metrics_follow_the_glossary():
    metrics = ServerMetrics(block_size=4)
    rounds = [RoundLog(4, 2, 3), RoundLog(4, 4, 5), RoundLog(0, 0, 1), RoundLog(2, 0, 1)]
    metrics.observe_result(GenerationResult([1] * 10, "", "length", rounds))
    s = _samples(metrics)
    assert s[("dspark_rounds_total", ())] == 4
    assert s[("dspark_drafts_total", ())] == 3  # rounds that verified drafts
    assert s[("dspark_draft_tokens_total", ())] == 10
    assert s[("dspark_accepted_tokens_total", ())] == 6
    survival = [s[("dspark_accepted_position_total", (("position", str(k)),))] for k in (1, 2, 3, 4)]
    assert survival == [2, 2, 1, 1]
    assert s[("dspark_mean_tau", ())] == pytest.approx((6 + 4) / 4)  # τ = (accepted + rounds) / rounds
    assert s[("dspark_verification_budget_sum", ())] == pytest.approx(10 / 4)
    assert s[("dspark_generated_tokens_total", ())] == 10
