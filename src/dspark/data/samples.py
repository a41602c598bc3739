"""Training records → token ids + loss mask, and the order they are trained in (DESIGN §6, §7).

A record is one conversation, in either JSONL shape of DESIGN §7:

- ``{"conversations": [{"role": ..., "content": ...}, ...]}`` (ShareGPT's
  ``{"from": "human"|"gpt", "value": ...}`` is accepted too), or
- ``{"turns": [user, ...], "answers": [assistant, ...]}`` (``"responses"`` also), the
  regenerated form; an optional ``"system"`` string becomes the system message.

It is rendered with the tokenizer's own chat template (DESIGN §7.4) and the loss mask
covers the assistant content through its end-of-turn token: the tokens the target
emitted, which are the only ones a drafter is ever asked to propose.

The order is a seeded permutation per epoch. One optimizer step consumes the next
``global_batch`` samples of that stream; they are cut into micro-batches (chunks) and
dealt to ranks, so the samples of a step — and, with a fixed micro-batch size, the
chunks — do not depend on the number of processes. The sampler's position (samples
consumed) is all a checkpoint needs to resume the exact order.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dspark.data.records import DataError

log = logging.getLogger(__name__)

_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}


@dataclass(frozen=True)
class TrainSample:
    """One tokenized conversation."""

    input_ids: Tensor  # [T] long
    loss_mask: Tensor  # [T] bool, True on assistant tokens


@dataclass(frozen=True)
class TokenBatch:
    """A right-padded micro-batch (padding is never supervised; causal attention ignores it)."""

    input_ids: Tensor  # [B, T] long
    loss_mask: Tensor  # [B, T] bool
    num_tokens: int  # real (non-padding) tokens


# -- records ------------------------------------------------------------------------------


def conversation_of(record: Mapping[str, Any], where: str = "record") -> list[dict[str, str]]:
    """The ``[{"role", "content"}, ...]`` messages of a record in either shape."""
    if "conversations" in record:
        messages = []
        if not isinstance(record["conversations"], list):
            raise DataError(f"{where}: 'conversations' must be a list of messages")
        for m in record["conversations"]:
            if not isinstance(m, Mapping):
                raise DataError(f"{where}: a message must be an object, got {m!r:.60}")
            role = m.get("role", m.get("from"))
            content = m.get("content", m.get("value"))
            if role not in _SHAREGPT_ROLES or not isinstance(content, str):
                raise DataError(f"{where}: bad message {m!r}")
            messages.append({"role": _SHAREGPT_ROLES[role], "content": content})
        return _valid_unicode(messages, where)
    answers = record.get("answers", record.get("responses"))
    if "turns" not in record or answers is None:
        raise DataError(f"{where}: expected 'conversations', or 'turns' with 'answers'/'responses'")
    turns = record["turns"]
    texts = (turns, answers)
    if not all(isinstance(t, list) and all(isinstance(x, str) for x in t) for t in texts):
        raise DataError(f"{where}: 'turns' and the answers must be lists of strings")
    if len(answers) > len(turns):
        raise DataError(f"{where}: {len(answers)} answers for {len(turns)} turns")
    messages = [{"role": "system", "content": record["system"]}] if record.get("system") else []
    for user, answer in zip(turns, answers):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return _valid_unicode(messages, where)


def _valid_unicode(messages: list[dict[str, str]], where: str) -> list[dict[str, str]]:
    """Refuse text no tokenizer can take (a lone surrogate, as JSON's ``"\\ud800"`` decodes)."""
    for m in messages:
        try:
            str(m["content"]).encode("utf-8")
        except UnicodeEncodeError as e:
            raise DataError(f"{where}: a {m['role']} message has an invalid character ({e.reason})") from None
    return messages


# -- chat template → ids + mask ------------------------------------------------------------


def _render(tokenizer, messages: list[dict], generation_prompt: bool, template_kwargs: Mapping) -> str:
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt, **template_kwargs
    )
    if not isinstance(text, str):
        raise DataError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
    return text


_PROBE = "\u2063dspark-reply\u2063"  # stands in for a reply's content while locating it


def _rendered_reply(
    tokenizer, messages: list[dict], i: int, full: str, template_kwargs: Mapping
) -> tuple[int, int]:
    """Span of reply ``i`` in ``full`` found by rendering the conversation with a probe as its content.

    What precedes and follows the probe is what precedes and follows the reply, however
    the template rewrote the reply itself.
    """
    probe = [*messages[:i], {**messages[i], "content": _PROBE}, *messages[i + 1 :]]
    rendered = _render(tokenizer, probe, False, template_kwargs)
    q = rendered.find(_PROBE)
    before, after = rendered[:q], rendered[q + len(_PROBE) :]
    if (
        q < 0
        or not full.startswith(before)
        or not full.endswith(after)
        or len(before) + len(after) > len(full)
    ):
        raise DataError(f"cannot locate assistant turn {i} in the chat template's rendering")
    start, end = len(before), len(full) - len(after)
    turn = _render(tokenizer, probe[: i + 1], False, template_kwargs)
    tail = turn[turn.find(_PROBE) + len(_PROBE) :].rstrip()  # the end-of-turn text, e.g. <|im_end|>
    return start, end + len(tail) if after.startswith(tail) else end


def assistant_spans(
    tokenizer, messages: list[dict], template_kwargs: Mapping = {}
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of each assistant reply.

    A reply spans from the end of the generation prompt that precedes it to the end of
    its own rendering, trailing whitespace excluded (so ``<|im_end|>`` is in, the
    template's newline after it is not): exactly what the target generates after that
    prompt. Templates that rewrite history (Qwen3 renders earlier replies without their
    reasoning) break that prefix property for earlier turns; those are located by
    :func:`_rendered_reply` instead.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("the tokenizer has no chat template (DESIGN §7.4 trains with the target's own)")
    full = _render(tokenizer, messages, False, template_kwargs)
    spans: list[tuple[int, int]] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = _render(tokenizer, messages[:i], True, template_kwargs)
        upto = _render(tokenizer, messages[: i + 1], False, template_kwargs)
        if upto.startswith(prompt) and full.startswith(upto):
            start, end = len(prompt), len(upto.rstrip())
        else:
            start, end = _rendered_reply(tokenizer, messages, i, full, template_kwargs)
        if spans and start < spans[-1][1]:
            raise DataError(f"assistant turn {i} overlaps the previous one in the chat template's rendering")
        spans.append((start, end))
    return full, spans


def _ids_and_mask(tokenizer, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[bool]]:
    """Token ids of ``text`` and whether each token starts inside one of ``spans``."""
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = [any(a <= s < b for a, b in spans) for s, _ in enc["offset_mapping"]]
        return list(enc["input_ids"]), mask
    # Slow tokenizers have no offsets: count the tokens of the text before each span edge.
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    mask = [False] * len(ids)
    for a, b in spans:
        first, last = (len(tokenizer(text[:c], add_special_tokens=False)["input_ids"]) for c in (a, b))
        mask[first:last] = [True] * (last - first)
    return ids, mask[: len(ids)]


def tokenize_conversation(
    tokenizer, messages: list[dict], *, max_length: int, template_kwargs: Mapping = {}
) -> TrainSample | None:
    """Ids and assistant-token loss mask of one conversation, cut to ``max_length``.

    ``None`` when nothing supervised is left (no reply, or cut off entirely).
    """
    text, spans = assistant_spans(tokenizer, messages, template_kwargs)
    ids, mask = _ids_and_mask(tokenizer, text, spans)
    ids, mask = ids[:max_length], mask[:max_length]
    if not any(mask):
        return None
    return TrainSample(torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool))


class TrainDataset(Sequence[TrainSample]):
    """Tokenized training samples with a content fingerprint (checked on resume)."""

    def __init__(self, samples: Sequence[TrainSample]) -> None:
        if not samples:
            raise DataError("no training samples (every record was empty or had no assistant reply)")
        self.samples = list(samples)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]

    @property
    def fingerprint(self) -> str:
        """sha256 over every sample's ids and mask: a changed dataset changes the training order."""
        h = hashlib.sha256()
        for s in self.samples:
            h.update(s.input_ids.numpy().astype("<i8").tobytes())
            h.update(s.loss_mask.numpy().astype(np.uint8).tobytes())
        return h.hexdigest()


def exact_turn_samples(record: Mapping[str, Any], *, max_length: int) -> list[TrainSample] | None:
    """Samples from a regenerated record's own token ids, one per turn; None if it has none.

    Turn t is ``prompt_ids[t] + answer_ids[t]``, supervised on the answer: exactly the
    tokens the target was given and generated (no re-tokenization of the text, which can
    differ). A multi-turn record repeats its history in each turn's prompt, as the
    target saw it.
    """
    prompts, answers = record.get("prompt_ids"), record.get("answer_ids")
    if not isinstance(prompts, list) or not isinstance(answers, list) or len(prompts) != len(answers):
        return None
    samples = []
    for prompt, answer in zip(prompts, answers):
        ids = (list(prompt) + list(answer))[:max_length]
        mask = ([False] * len(prompt) + [True] * len(answer))[:max_length]
        if any(mask):
            samples.append(TrainSample(torch.tensor(ids, dtype=torch.long), torch.tensor(mask)))
    return samples


def tokenize_records(
    records: Iterable[Mapping[str, Any]],
    tokenizer,
    *,
    max_length: int = 2048,
    template_kwargs: Mapping[str, Any] | None = None,
) -> TrainDataset:
    """Tokenize records with the tokenizer's chat template (``template_kwargs`` passed through,
    e.g. ``enable_thinking``); records with nothing supervised are skipped and counted.

    Regenerated records that carry their token ids (``prompt_ids`` / ``answer_ids``,
    :mod:`dspark.data.regenerate`) are used as they are, one sample per turn.
    """
    samples, skipped = [], 0
    for n, record in enumerate(records):
        exact = exact_turn_samples(record, max_length=max_length)
        if exact is not None:
            samples += exact
            skipped += not exact
            continue
        messages = conversation_of(record, where=f"record {n}")
        sample = tokenize_conversation(
            tokenizer, messages, max_length=max_length, template_kwargs=template_kwargs or {}
        )
        if sample is None:
            skipped += 1
        else:
            samples.append(sample)
    if skipped:
        log.warning("skipped %d records with no supervised tokens", skipped)
    return TrainDataset(samples)


def collate(samples: Sequence[TrainSample], pad_id: int) -> TokenBatch:
    """Right-pad samples to the longest one."""
    T = max(s.input_ids.numel() for s in samples)
    ids = torch.full((len(samples), T), pad_id, dtype=torch.long)  # [B, T]
    mask = torch.zeros(len(samples), T, dtype=torch.bool)  # [B, T]
    for b, s in enumerate(samples):
        ids[b, : s.input_ids.numel()] = s.input_ids
        mask[b, : s.loss_mask.numel()] = s.loss_mask
    return TokenBatch(ids, mask, num_tokens=sum(s.input_ids.numel() for s in samples))


# -- order -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of a step: ``chunk`` is its index among all ranks' chunks of the run."""

    chunk: int
    indices: list[int]


class ShardedSampler:
    """Deterministic, resumable, rank-sharded order over ``num_samples`` samples.

    Epoch ``e`` visits ``permutation(seed, e)``; epochs run back to back, so a step may
    span two. Step ``s`` takes the next ``global_batch`` samples, cut into
    ``global_batch / micro_batch`` chunks; rank ``r`` gets chunks ``m * world + r``.
    """

    def __init__(
        self, num_samples: int, *, global_batch: int, micro_batch: int, rank: int, world_size: int, seed: int
    ) -> None:
        if global_batch % (micro_batch * world_size):
            raise DataError(
                f"global batch {global_batch} is not a multiple of micro batch {micro_batch} x "
                f"{world_size} processes"
            )
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.micro_batch = micro_batch
        self.rank, self.world_size = rank, world_size
        self.seed = seed
        self.position = 0  # samples consumed by all ranks together
        self._perm: tuple[int, np.ndarray] | None = None

    @property
    def accumulation(self) -> int:
        """Micro-batches per rank per step."""
        return self.global_batch // (self.micro_batch * self.world_size)

    @property
    def epoch(self) -> float:
        return self.position / self.num_samples

    def permutation(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.num_samples))
        return self._perm[1]

    def _sample(self, position: int) -> int:
        epoch, offset = divmod(position, self.num_samples)
        return int(self.permutation(epoch)[offset])

    def next_step(self) -> list[MicroBatch]:
        """This rank's micro-batches of the next step; advances the position by a global batch."""
        first_chunk = self.position // self.micro_batch
        out = []
        for m in range(self.accumulation):
            chunk = first_chunk + m * self.world_size + self.rank
            start = chunk * self.micro_batch
            out.append(MicroBatch(chunk, [self._sample(p) for p in range(start, start + self.micro_batch)]))
        self.position += self.global_batch
        return out

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "num_samples": self.num_samples, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        if state["num_samples"] != self.num_samples or state["seed"] != self.seed:
            raise DataError(
                f"cannot resume the data order: saved for {state['num_samples']} samples / seed "
                f"{state['seed']}, now {self.num_samples} / {self.seed}"
            )
        self.position = int(state["position"])
