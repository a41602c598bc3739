"""From a validated request to what the engine runs: prompt token ids and :class:`SamplingParams`.

Everything here is checked before a request takes a place in the queue, so a request
the engine cannot serve is a 4xx at once: a prompt that leaves no room for one new
token in the engine's context, token ids outside the vocabulary, a chat template that
fails on the given messages or ``chat_template_kwargs``. Limits that keep one request
from stalling the server (prompt bytes, template-controlling kwargs) are in
:mod:`dspark.server.limits`.

Values the schema allows but the sampler cannot compute with are mapped to their
limits rather than refused (one bad request would otherwise kill the engine step for
every request in the batch): temperatures below 1e-5 are greedy (``logits / T``
overflows to inf, as vLLM also treats them), ``top_p`` below 1e-6 keeps only the most
likely token (it would round to 0 in fp32), ``top_k`` at or beyond the vocabulary is off.
"""

from __future__ import annotations

from dataclasses import dataclass

from dspark.data.chat import chat_prompt_ids
from dspark.errors import DsparkError
from dspark.protocols import SamplingParams
from dspark.server.errors import ApiError
from dspark.server.limits import template_variables
from dspark.server.schemas import ChatCompletionRequest, CompletionRequest, SamplingRequest

GREEDY_BELOW = 1e-5
MIN_TOP_P = 1e-6


@dataclass(frozen=True)
class Prepared:
    """A request ready for the engine."""

    prompt_ids: list[int]
    params: SamplingParams


def sampling_params(
    req: SamplingRequest, *, prompt_len: int, capacity: int, vocab_size: int
) -> SamplingParams:
    """The engine's parameters; ``max_tokens`` is cut to what the context leaves (at least 1)."""
    room = capacity - prompt_len
    return SamplingParams(
        temperature=0.0 if req.temperature < GREEDY_BELOW else req.temperature,
        top_k=req.top_k if 0 < req.top_k < vocab_size else 0,
        top_p=max(req.top_p, MIN_TOP_P),
        max_tokens=min(req.max_tokens or room, room),
        stop=req.stop_strings,
        seed=req.seed,
    )


def check_fits(prompt_ids: list[int], capacity: int) -> None:
    if not prompt_ids:
        raise ApiError(400, "the prompt is empty")
    if len(prompt_ids) + 1 > capacity:
        raise ApiError(
            400,
            f"the prompt has {len(prompt_ids)} tokens; this model's context is {capacity} tokens "
            "(prompt and at least one generated token)",
        )


def check_prompt_bytes(num_bytes: int, max_prompt_bytes: int | None, capacity: int) -> None:
    """Refuse, before tokenizing, a prompt too long in bytes to fit the context in any tokenization."""
    if max_prompt_bytes is not None and num_bytes > max_prompt_bytes:
        raise ApiError(
            400,
            f"the prompt has {num_bytes} bytes: more than fit this model's context of {capacity} tokens "
            f"(at most {max_prompt_bytes} bytes)",
        )


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def prepare_completion(
    req: CompletionRequest, tokenizer, *, capacity: int, vocab_size: int, max_prompt_bytes: int | None = None
) -> Prepared:
    if isinstance(req.prompt, str):
        check_prompt_bytes(_utf8_len(req.prompt), max_prompt_bytes, capacity)
        try:
            ids = list(tokenizer(req.prompt)["input_ids"])
        except Exception as e:  # e.g. unpaired surrogates the tokenizer cannot encode
            raise ApiError(400, f"the prompt cannot be tokenized: {e}") from None
    else:
        ids = list(req.prompt)
        bad = [t for t in ids if t >= vocab_size]
        if bad:
            raise ApiError(400, f"token id {bad[0]} is outside the vocabulary (size {vocab_size})")
    check_fits(ids, capacity)
    return Prepared(ids, sampling_params(req, prompt_len=len(ids), capacity=capacity, vocab_size=vocab_size))


def prepare_chat(
    req: ChatCompletionRequest,
    tokenizer,
    *,
    capacity: int,
    vocab_size: int,
    max_prompt_bytes: int | None = None,
) -> Prepared:
    """The conversation through the target's chat template, exactly as regeneration renders it.

    ``chat_template_kwargs`` reach the template as variables only (:func:`template_variables`).
    """
    messages = [{"role": m.template_role, "content": m.text()} for m in req.messages]
    check_prompt_bytes(sum(_utf8_len(m["content"]) for m in messages), max_prompt_bytes, capacity)
    variables = template_variables(req.chat_template_kwargs)
    try:
        ids = chat_prompt_ids(tokenizer, messages, variables)
    except DsparkError as e:  # no chat template
        raise ApiError(400, str(e)) from None
    except Exception as e:  # the template (Jinja) or its kwargs failed on this input
        raise ApiError(400, f"the chat template failed on these messages: {type(e).__name__}: {e}") from None
    check_fits(ids, capacity)
    return Prepared(ids, sampling_params(req, prompt_len=len(ids), capacity=capacity, vocab_size=vocab_size))
