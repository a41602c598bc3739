"""Token-faithful data (DESIGN §7.2): a drafter trains on exactly the tokens the target generated.

Regenerated records carry each turn's prompt and answer ids; training uses them instead
of re-tokenizing the answer text. The check is against an independent decode: the
batch-1 loop's greedy output for the same chat prompt.
"""

from __future__ import annotations

import pytest
import torch

from dspark.data.chat import chat_prompt_ids
from dspark.data.http_backend import _parse_answer
from dspark.data.prompts import Prompt
from dspark.data.records import read_jsonl
from dspark.data.regenerate import InProcessBackend, RegenerateConfig, regenerate
from dspark.data.samples import tokenize_records
from dspark.decoding import speculative_generate
from dspark.protocols import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=24)
PROMPTS = [
    Prompt(("question one",)),
    Prompt(("def add(a, b):", "and now subtract")),
    Prompt(("Explain hash tables.",)),
    Prompt(("quick brown fox", "lazy dog", "again")),
]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from dspark.targets import TargetAdapter
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    return TargetAdapter.from_pretrained(build_tiny_chat_target(tmp_path_factory.mktemp("t")))


@pytest.fixture(scope="module")
def records(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("regen")
    backend = InProcessBackend(target, max_batch=2)
    config = RegenerateConfig(concurrency=2, progress=False)
    regenerate(PROMPTS, backend, out / "data.jsonl", out / "errors.jsonl", PARAMS, config)
    return read_jsonl(out / "data.jsonl", log=True)


def test_trained_on_tokens_equal_the_generated_ids(target, records):
    tok = target.tokenizer
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    samples = list(tokenize_records(records, tok, max_length=4096))
    expected = []  # (prompt ids, generated ids) per turn, from the batch-1 loop
    for record in records:
        assert record["token_ids"] == "exact"
        messages = []
        for user, answer in zip(record["turns"], record["answers"]):
            messages.append({"role": "user", "content": user})
            ids = chat_prompt_ids(tok, messages, {})
            expected.append((ids, speculative_generate(target, None, ids, PARAMS, decode=decode).token_ids))
            messages.append({"role": "assistant", "content": answer})
    assert len(samples) == len(expected) == sum(len(p.turns) for p in PROMPTS)
    matched = 0
    for sample, (prompt_ids, generated) in zip(samples, expected):
        mask = sample.loss_mask
        assert sample.input_ids[~mask].tolist() == prompt_ids
        matched += sample.input_ids[mask].tolist() == generated
    assert matched == len(expected)  # 100 %


def test_text_only_records_still_train_and_are_marked(target, records):
    """Without the ids the record falls back to the text; the text path re-tokenizes it."""
    stripped = [{k: v for k, v in r.items() if k not in ("prompt_ids", "answer_ids")} for r in records]
    samples = tokenize_records(stripped, target.tokenizer, max_length=4096)
    assert len(samples) == len(records)  # one sample per conversation, as before


def test_http_answers_keep_the_server_ids_when_given():
    body = {
        "prompt_token_ids": [1, 2, 3],
        "choices": [{"message": {"content": "hi"}, "finish_reason": "stop", "token_ids": [7, 8]}],
    }
    answer = _parse_answer(body)
    assert (answer.prompt_ids, answer.token_ids) == ([1, 2, 3], [7, 8])
    logprobs = {"content": [{"token": "token_id:7"}, {"token": "token_id:9"}]}
    answer = _parse_answer({"choices": [{"message": {"content": "x"}, "logprobs": logprobs}]})
    assert answer.token_ids == [7, 9] and answer.prompt_ids is None  # no prompt ids: text only
    answer = _parse_answer({"choices": [{"message": {"content": "x"}}]})
    assert (answer.prompt_ids, answer.token_ids) == (None, None)


def test_exact_samples_are_cut_to_max_length(records, target):
    shortest = min(len(p) for r in records for p in r["prompt_ids"])
    samples = tokenize_records(records, target.tokenizer, max_length=shortest + 2)
    assert all(s.input_ids.numel() <= shortest + 2 for s in samples)
    assert any(int(s.loss_mask.sum()) == 2 for s in samples)  # the shortest turn kept 2 answer tokens
    assert all(s.loss_mask.dtype == torch.bool for s in samples)
