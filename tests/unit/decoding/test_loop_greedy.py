"""Greedy speculative decoding equals plain greedy decoding token for token (DESIGN §3)."""

from __future__ import annotations

import dataclasses

import pytest

from dspark.decoding import speculative_generate
from dspark.drafters.ngram import NgramDrafter
from dspark.protocols import SamplingParams

from .conftest import hf_greedy
from .drafters_for_tests import OracleDrafter, RandomDrafter

GREEDY = SamplingParams(temperature=0.0, max_tokens=300)


@pytest.fixture(scope="module")
def reference(no_eos, prompt) -> list[int]:
    return hf_greedy(no_eos, prompt, GREEDY.max_tokens)


@pytest.mark.parametrize("drafter_name", ["none", "ngram", "random"])
def test_greedy_equals_hf_generate(no_eos, prompt, reference, drafter_name):
    drafter = {"none": None, "ngram": NgramDrafter(128), "random": RandomDrafter(128)}[drafter_name]
    result = speculative_generate(no_eos, drafter, prompt, GREEDY)
    assert result.token_ids == reference
    assert result.finish_reason == "length"
    if drafter_name == "none":
        assert result.tau == 1.0


def test_oracle_drafter_accepts_everything(no_eos, prompt, reference):
    result = speculative_generate(
        no_eos, OracleDrafter(len(prompt), reference, 128), prompt, GREEDY, block_size=7
    )
    assert result.token_ids == reference
    full = [r for r in result.rounds if r.proposed == 7]
    assert full and all(r.accepted == 7 for r in full)
    assert result.tau > 7.5  # every full round emits 7 accepted + 1 bonus


@pytest.mark.parametrize("max_tokens", range(1, 16))  # 1 .. 2K+1 for K = 7
def test_max_tokens_cuts_exactly(no_eos, prompt, reference, max_tokens):
    params = dataclasses.replace(GREEDY, max_tokens=max_tokens)
    result = speculative_generate(no_eos, OracleDrafter(len(prompt), reference, 128), prompt, params)
    assert result.token_ids == reference[:max_tokens]
    assert result.finish_reason == "length"


def test_long_max_tokens_with_ngram(no_eos, prompt, reference):
    params = dataclasses.replace(GREEDY, max_tokens=257)
    result = speculative_generate(no_eos, NgramDrafter(128), prompt, params)
    assert result.token_ids == reference[:257]


@pytest.mark.parametrize("eos_at", range(0, 9))
def test_eos_inside_accepted_block_ends_sequence(long_qwen3, prompt, reference, eos_at):
    """Make the token at each offset of the first blocks the EOS: nothing after it is emitted."""
    eos = reference[eos_at]
    first = reference.index(eos)  # the sequence must stop at the first occurrence
    long_qwen3.eos_token_ids = (eos,)
    try:
        result = speculative_generate(long_qwen3, OracleDrafter(len(prompt), reference, 128), prompt, GREEDY)
    finally:
        long_qwen3.eos_token_ids = ()
    assert result.token_ids == reference[: first + 1]
    assert result.finish_reason == "stop"


def test_stop_string_cuts_inside_block(no_eos, prompt, reference):
    def decode(ids):
        return "".join(chr(65 + i % 26) for i in ids)

    text = decode(reference)
    stop = text[10:13]
    at = text.index(stop)
    params = dataclasses.replace(GREEDY, stop=(stop,))
    result = speculative_generate(
        no_eos, OracleDrafter(len(prompt), reference, 128), prompt, params, decode=decode
    )
    assert result.text == text[:at]
    assert result.token_ids == reference[: at + len(stop)]  # tokens up to the one completing the stop
    assert result.finish_reason == "stop"


def test_prompt_too_long_is_a_clear_error(no_eos):
    from dspark.errors import PromptTooLongError

    with pytest.raises(PromptTooLongError, match="context"):
        speculative_generate(no_eos, None, [5] * 1024, GREEDY)
