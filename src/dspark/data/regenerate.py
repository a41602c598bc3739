"""Regeneration: the target answers every prompt, turn by turn (DESIGN §7.2).

A drafter learns the distribution of the target, so its training answers should be the
target's own. Each prompt is replayed turn by turn: turn ``t`` is asked with the
target's previous answers in the history, through the tokenizer's chat template with the
same template kwargs (``enable_thinking=False``, ...) and system message that training
and evaluation use (DESIGN §7.4).

The answering is done by an :class:`AnswerBackend`: one async call per chat turn. That
one contract covers the in-process target (:class:`InProcessBackend`: the batched
engine of DESIGN §10, batching whatever calls are in flight), and any OpenAI-compatible
server (:mod:`dspark.data.http_backend`, e.g. ``dspark serve``).

Output: one JSONL record per prompt (the shape :mod:`dspark.data.samples` reads),
appended atomically as soon as the prompt is done (:mod:`dspark.data.records`)::

    {"id", "source", "domain", "system"?, "turns": [...], "answers": [...],
     "finish_reasons": [...], "num_tokens": [...], "sampling": {...},
     "template_kwargs": {...}, "backend": "...",
     "token_ids": "exact" | "text-only", "prompt_ids"?: [[...]], "answer_ids"?: [[...]]}

``prompt_ids[t]`` / ``answer_ids[t]`` are the token ids the target was given and
produced at turn t (in-process: the engine's; over HTTP: the server's where it returns
them); ``"token_ids": "text-only"`` marks a record whose backend gave text only.

Failures (after the backend's retries) go to the error file as ``{"id", "source",
"turn", "reason", "retryable"}``. A rerun skips the prompts already in the output and
the permanent failures, and retries the rest.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from tqdm.auto import tqdm

from dspark.data.chat import Messages, chat_prompt_ids
from dspark.data.prompts import Prompt, dedup_prompts
from dspark.data.records import Claims, JsonlAppender, LogTail, WriterLock, read_jsonl
from dspark.engine.engine import Engine, EngineConfig
from dspark.engine.worker import EngineDeadError, EngineWorker
from dspark.errors import DsparkError
from dspark.protocols import SamplingParams

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    """One assistant turn as a backend produced it."""

    text: str
    finish_reason: str  # "stop" | "length" (whatever the server reports)
    num_tokens: int | None = None  # completion tokens, when known
    reasoning: str | None = None  # a server's separate reasoning_content, if it splits it off
    # What the target really saw and produced, when the backend knows (token-faithful data):
    prompt_ids: list[int] | None = None  # the rendered chat prompt of this turn
    token_ids: list[int] | None = None  # the generated tokens (EOS included when generated)


class AnswerError(Exception):
    """A turn that could not be answered; ``retryable`` failures are retried by a rerun."""

    def __init__(self, reason: str, *, retryable: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable
        self.turn: int | None = None  # set by the caller that knows which turn failed


class AnswerBackend(Protocol):
    """Answers one chat turn. Calls may be in flight concurrently (up to ``max_concurrency``)."""

    name: str  # recorded in every output record, e.g. "inprocess:/models/qwen3" or "http:qwen3"
    max_concurrency: int | None  # None = as many as the caller likes
    template_kwargs: Mapping[str, Any]  # chat template kwargs the prompts are rendered with

    async def answer(self, messages: Messages, params: SamplingParams) -> Answer: ...

    async def aclose(self) -> None: ...


# -- in-process backend -------------------------------------------------------------------------


class InProcessBackend:
    """The target itself, in this process, through the batched engine (DESIGN §10).

    Turns in flight at once (up to ``max_batch``, the engine's KV slots) are decoded
    together: an :class:`~dspark.engine.worker.EngineWorker` steps the engine on its own
    thread while the event loop keeps writing records. Decoding is lossless, so
    ``drafter`` and ``policy`` only change the speed. The worker starts with the first
    answer and stops in :meth:`aclose`.
    """

    def __init__(
        self,
        target,
        *,
        drafter=None,
        template_kwargs: Mapping[str, Any] | None = None,
        block_size: int = 7,
        name: str | None = None,
        max_batch: int = 8,
        policy: str = "fixed",
        max_seq_len: int | None = None,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.template_kwargs = dict(template_kwargs or {})
        self.max_concurrency = max_batch
        # prompt + answer per KV slot; None = the engine's default (min(context, 4096))
        self.config = EngineConfig(
            payoff=False, block_size=block_size, policy=policy, max_batch=max_batch, max_seq_len=max_seq_len
        )
        self.name = name or f"inprocess:{getattr(target.config, '_name_or_path', '') or 'target'}"
        self._worker: EngineWorker | None = None

    def _running_worker(self) -> EngineWorker:
        if self._worker is None:
            self._worker = EngineWorker(Engine(self.target, self.drafter, self.config))
        return self._worker

    async def answer(self, messages: Messages, params: SamplingParams) -> Answer:
        prompt_ids = chat_prompt_ids(self.target.tokenizer, messages, self.template_kwargs)
        try:
            result = await self._running_worker().generate(prompt_ids, params)
        except DsparkError as e:  # e.g. the prompt no longer fits the context: retrying will not help
            raise AnswerError(str(e), retryable=False) from None
        except EngineDeadError as e:
            raise AnswerError(f"the engine failed: {e}", retryable=True) from None
        return Answer(
            result.text,
            result.finish_reason,
            len(result.token_ids),
            prompt_ids=list(prompt_ids),
            token_ids=list(result.token_ids),
        )

    async def aclose(self) -> None:
        if self._worker is not None:
            worker, self._worker = self._worker, None
            await asyncio.to_thread(worker.close)


# -- the run ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RegenerateConfig:
    """How prompts are replayed (the backend decides how each turn is answered)."""

    concurrency: int = 1  # prompts in flight at once (capped by the backend's max_concurrency)
    system: str | None = None  # system message for prompts that have none
    progress: bool = True
    # Several runs (processes) answer the same prompts into the same output together,
    # each prompt once. A run that waits returns only when every prompt is settled; one
    # that does not returns when none is left that another run is not answering.
    shared: bool = False
    wait_for_others: bool = True
    poll_s: float = 2.0  # shared, waiting: how often to look again


@dataclass
class RegenerateSummary:
    total: int  # prompts in the set (after dedup)
    resumed: int  # already in the output when the run started
    done: int  # answered in this run
    failed: int  # failed in this run (see the error file)
    skipped: int  # permanent failures of earlier runs, not retried
    completion_tokens: int  # tokens generated in this run (as reported by the backend)
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0


def record_seed(seed: int | None, key: str) -> int | None:
    """Each prompt's own seed: reproducible, independent of the order prompts are served in."""
    if seed is None:
        return None
    return int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:8], 16)


def _sampling_record(params: SamplingParams, seed: int | None) -> dict[str, Any]:
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "max_tokens": params.max_tokens,
        "stop": list(params.stop),
        "seed": seed,  # turn t is sampled with seed + t
    }


async def answer_prompt(
    backend: AnswerBackend, prompt: Prompt, params: SamplingParams, config: RegenerateConfig
) -> dict[str, Any]:
    """Replay one prompt turn by turn; the output record. Raises :class:`AnswerError`."""
    system = prompt.system or config.system
    messages: Messages = [{"role": "system", "content": system}] if system else []
    seed = record_seed(params.seed, prompt.key)
    answers: list[Answer] = []
    for t, user in enumerate(prompt.turns):
        messages.append({"role": "user", "content": user})
        turn_params = replace(params, seed=None if seed is None else seed + t)
        try:
            answer = await backend.answer(list(messages), turn_params)
        except AnswerError as e:
            e.turn = t
            raise
        answers.append(answer)
        messages.append({"role": "assistant", "content": answer.text})
    record: dict[str, Any] = {"id": prompt.key, "source": prompt.source, "domain": prompt.domain}
    if system:
        record["system"] = system
    record |= {
        "turns": list(prompt.turns),
        "answers": [a.text for a in answers],
        "finish_reasons": [a.finish_reason for a in answers],
        "num_tokens": [a.num_tokens for a in answers],
        "sampling": _sampling_record(params, seed),
        "template_kwargs": dict(backend.template_kwargs),
        "backend": backend.name,
    }
    if any(a.reasoning for a in answers):
        record["reasoning"] = [a.reasoning for a in answers]
    # Token-faithful data: training uses these ids instead of re-tokenizing the text,
    # which can differ (a space after the template, multi-byte characters split across
    # tokens). Only when every turn has them; else the record says it is text only.
    if all(a.prompt_ids is not None and a.token_ids is not None for a in answers):
        record["prompt_ids"] = [a.prompt_ids for a in answers]
        record["answer_ids"] = [a.token_ids for a in answers]
        record["token_ids"] = "exact"
    else:
        record["token_ids"] = "text-only"
    return record


async def regenerate_async(
    prompts: Sequence[Prompt],
    backend: AnswerBackend,
    out_path: str | Path,
    errors_path: str | Path,
    params: SamplingParams,
    config: RegenerateConfig = RegenerateConfig(),
) -> RegenerateSummary:
    """Answer every prompt not yet in ``out_path``; append records and failures as they come.

    One run at a time per ``out_path``: a second one refuses (:class:`WriterLock`), else
    both would answer every prompt and write it twice. With ``config.shared`` several
    runs answer one prompt set together, each prompt once (:class:`_Cooperation`).
    """
    lock = WriterLock(out_path, "another regeneration", shared=config.shared)
    try:
        lock.__enter__()
    except DsparkError:
        await backend.aclose()
        raise
    try:
        if config.shared and lock.alone:  # no other writer: a dead one's cut line can go
            read_jsonl(out_path, log=True)
            read_jsonl(errors_path, log=True)
        return await _regenerate_locked(
            dedup_prompts(prompts), backend, out_path, errors_path, params, config
        )
    finally:
        lock.__exit__()


class _Cooperation:
    """What the other runs sharing one output do: their records, failures and claims.

    A prompt is *settled* for this run when it is answered, failed permanently before the
    run, or failed in any run since this one started (failures are retried by a rerun,
    as in an exclusive run). A run answers a prompt only while it holds its claim.
    """

    def __init__(self, out_path: Path, errors_path: Path) -> None:
        self.answers, self.errors = LogTail(out_path), LogTail(errors_path)
        self.claims = Claims(out_path.with_name(out_path.name + ".claims"))
        self.done: set[str] = {r.get("id") for r in self.answers.read()}
        failures = self.errors.read()
        self.permanent = {e.get("id") for e in failures if not e.get("retryable", True)} - self.done
        self.failed_since: set[str] = set()

    def refresh(self) -> None:
        """Read what every run appended since the last look."""
        self.done |= {r.get("id") for r in self.answers.read()}
        self.failed_since |= {e.get("id") for e in self.errors.read()}

    def settled(self, key: str) -> bool:
        return key in self.done or key in self.permanent or key in self.failed_since

    def claim(self, key: str) -> bool:
        """Take ``key`` to answer it: False when it is settled or another run is on it."""
        if self.settled(key) or not self.claims.take(key):
            return False
        self.refresh()  # its last holder writes before it lets go: this sees that record
        if self.settled(key):
            self.claims.release(key)
            return False
        return True


async def _regenerate_locked(
    prompts: list[Prompt],
    backend: AnswerBackend,
    out_path: str | Path,
    errors_path: str | Path,
    params: SamplingParams,
    config: RegenerateConfig,
) -> RegenerateSummary:
    shared = _Cooperation(Path(out_path), Path(errors_path)) if config.shared else None
    if shared is None:
        done_ids = {r.get("id") for r in read_jsonl(out_path, log=True)}
        errors = read_jsonl(errors_path, log=True)
        permanent = {e.get("id") for e in errors if not e.get("retryable", True)} - done_ids
    else:
        done_ids, permanent = shared.done, shared.permanent
    todo = [p for p in prompts if p.key not in done_ids and p.key not in permanent]
    resumed = sum(p.key in done_ids for p in prompts)
    skipped = sum(p.key in permanent for p in prompts)
    if resumed or skipped:
        log.info("resuming: %d prompts already answered, %d permanent failures skipped", resumed, skipped)

    workers = max(1, min(config.concurrency, backend.max_concurrency or config.concurrency))
    queue: asyncio.Queue[Prompt] = asyncio.Queue()
    for p in todo:
        queue.put_nowait(p)
    counts = {"done": 0, "failed": 0, "tokens": 0, "claimed": 0}
    keys = {p.key for p in prompts}
    bar = tqdm(total=len(prompts), initial=resumed + skipped, unit="prompt", disable=not config.progress)
    started = time.perf_counter()

    async def worker(out: JsonlAppender, errors: JsonlAppender) -> None:
        while not queue.empty():
            prompt = queue.get_nowait()
            if shared is not None:
                if not shared.claim(prompt.key):
                    continue
                counts["claimed"] += 1
            try:
                record = await answer_prompt(backend, prompt, params, config)
            except AnswerError as e:
                errors.append(
                    {
                        "id": prompt.key,
                        "source": prompt.source,
                        "turn": e.turn,
                        "reason": e.reason,
                        "retryable": e.retryable,
                        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    }
                )
                counts["failed"] += 1
            else:
                out.append(record)
                counts["done"] += 1
                counts["tokens"] += sum(n or 0 for n in record["num_tokens"])
            finally:
                if shared is not None:
                    shared.claims.release(prompt.key)
            if shared is None:
                bar.update(1)
            else:  # every run's answers count
                shared.refresh()
                bar.update(sum(shared.settled(k) for k in keys) - bar.n)
            bar.set_postfix(failed=counts["failed"], refresh=False)

    try:
        with JsonlAppender(out_path) as out, JsonlAppender(errors_path) as errors:
            while True:
                claimed_before = counts["claimed"]
                await asyncio.gather(*(worker(out, errors) for _ in range(workers)))
                if shared is None:
                    break
                # The queue is empty. Prompts other runs held may be free again now (a
                # killed run's claims are), or still being answered.
                shared.refresh()
                left = [p for p in prompts if not shared.settled(p.key)]
                if not left:
                    break
                if counts["claimed"] == claimed_before:  # this pass found every one held
                    if not config.wait_for_others:
                        break
                    await asyncio.sleep(config.poll_s)
                for p in left:
                    queue.put_nowait(p)
    finally:
        bar.close()
        await backend.aclose()
        if shared is not None:
            shared.claims.close()
    return RegenerateSummary(
        total=len(prompts),
        resumed=resumed,
        done=counts["done"],
        failed=counts["failed"],
        skipped=skipped,
        completion_tokens=counts["tokens"],
        seconds=time.perf_counter() - started,
    )


def regenerate(
    prompts: Sequence[Prompt],
    backend: AnswerBackend,
    out_path: str | Path,
    errors_path: str | Path,
    params: SamplingParams,
    config: RegenerateConfig = RegenerateConfig(),
) -> RegenerateSummary:
    """Synchronous :func:`regenerate_async`."""
    return asyncio.run(regenerate_async(prompts, backend, out_path, errors_path, params, config))
