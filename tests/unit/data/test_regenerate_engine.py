"""In-process regeneration runs through the engine: concurrent turns share its steps."""

from __future__ import annotations

import asyncio

import pytest

from dspark.data.regenerate import InProcessBackend, chat_prompt_ids
from dspark.decoding import speculative_generate
from dspark.drafters.ngram import NgramDrafter
from dspark.protocols import SamplingParams


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from dspark.targets import TargetAdapter
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    return TargetAdapter.from_pretrained(build_tiny_chat_target(tmp_path_factory.mktemp("t")))


def test_concurrent_answers_are_batched_and_equal_the_loop(target):
    backend = InProcessBackend(target, drafter=NgramDrafter(target.vocab_size), max_batch=4)
    conversations = [[{"role": "user", "content": f"question {i}"}] for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=16)

    async def main():
        answers = await asyncio.gather(*(backend.answer(m, params) for m in conversations))
        steps = backend._running_worker().engine.stats.steps
        await backend.aclose()
        return answers, steps

    answers, steps = asyncio.run(main())
    tok = target.tokenizer
    for messages, answer in zip(conversations, answers):
        ids = chat_prompt_ids(tok, messages, {})
        loop = speculative_generate(
            target, None, ids, params, decode=lambda x: tok.decode(x, skip_special_tokens=True)
        )
        assert (answer.text, answer.num_tokens) == (loop.text, len(loop.token_ids))
    assert steps < 6 * 16 / 2  # 6 answers of 16 tokens through 4 slots: far fewer steps than one by one
    assert backend.max_concurrency == 4 and backend._worker is None  # closed, restarts on the next answer
