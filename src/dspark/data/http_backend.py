"""Regeneration over any OpenAI-compatible server: vLLM, SGLang, ``dspark serve`` (DESIGN §7.2).

``POST {base_url}/v1/chat/completions`` per chat turn. The server applies the target's
chat template; ``template_kwargs`` travel as ``chat_template_kwargs``, which vLLM and
SGLang pass to the template (``{"enable_thinking": false}`` for Qwen3).

Requests go round-robin over ``base_urls``, one URL per attempt, so a retry lands on the
next server. Connection errors, timeouts, HTTP 408/409/429 and 5xx are retried with
exponential backoff and jitter (``Retry-After`` honoured, capped); other 4xx mean the
request itself is wrong and fail at once, as permanent failures.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from dspark.data.regenerate import Answer, AnswerError, Messages
from dspark.errors import DsparkError
from dspark.protocols import SamplingParams

_RETRYABLE_STATUS = frozenset({408, 409, 429})


@dataclass(frozen=True, kw_only=True)
class HttpConfig:
    base_urls: Sequence[str]  # e.g. ("http://10.0.0.1:8000", "http://10.0.0.2:8000"); "/v1" optional
    model: str | None = None  # None = the first model the first server lists at /v1/models
    api_key: str | None = None
    timeout_s: float = 600.0  # whole request, connect to last byte
    max_retries: int = 3  # attempts = 1 + max_retries
    backoff_s: float = 1.0  # first retry waits ~backoff_s, doubling per attempt
    backoff_max_s: float = 30.0
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)


def _api_root(base_url: str) -> str:
    root = base_url.rstrip("/")
    return root if root.endswith("/v1") else root + "/v1"


def _error_text(response: httpx.Response) -> str:
    """The server's error message: OpenAI's ``{"error": {"message"}}``, FastAPI's ``detail``, or the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err)[:200]
    return str(body)[:200]


def _id_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return list(value)
    return None


def _logprob_ids(choice: Mapping[str, Any]) -> list[int] | None:
    """Generated ids from logprobs tokens written ``"token_id:N"`` (vLLM's ``return_tokens_as_token_ids``)."""
    content = (
        (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    )
    if not content:
        return None
    ids = []
    for entry in content:
        token = entry.get("token") if isinstance(entry, dict) else None
        if not isinstance(token, str) or not token.startswith("token_id:"):
            return None
        try:
            ids.append(int(token.removeprefix("token_id:")))
        except ValueError:
            return None
    return ids


def _parse_answer(body: Any) -> Answer:
    """The answer; its prompt and generated token ids too where the server returns them
    (vLLM with ``return_token_ids``: ``prompt_token_ids`` and the choice's ``token_ids``)."""
    try:
        choice = body["choices"][0]
        message = choice["message"]
        text = message.get("content") or ""
        usage = body.get("usage") or {}
        return Answer(
            text=text,
            finish_reason=choice.get("finish_reason") or "stop",
            num_tokens=usage.get("completion_tokens"),
            reasoning=message.get("reasoning_content") or message.get("reasoning"),
            prompt_ids=_id_list(body.get("prompt_token_ids") or choice.get("prompt_token_ids")),
            token_ids=_id_list(choice.get("token_ids")) or _logprob_ids(choice),
        )
    except (KeyError, IndexError, TypeError, AttributeError):
        raise AnswerError(f"malformed response: {json.dumps(body)[:200]}", retryable=True) from None


class HttpBackend:
    """An :class:`~dspark.data.regenerate.AnswerBackend` over OpenAI-compatible servers."""

    max_concurrency = None

    def __init__(self, config: HttpConfig) -> None:
        if not config.base_urls:
            raise DsparkError("no --base-url given")
        self.config = config
        self.template_kwargs = dict(config.template_kwargs)
        self._roots = [_api_root(u) for u in config.base_urls]
        self._next_root = itertools.cycle(range(len(self._roots)))
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        # The number of workers bounds the connections; no pool limit to time out on.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self._client = httpx.AsyncClient(headers=headers, timeout=config.timeout_s, limits=limits)
        self._model = config.model
        self._model_lock = asyncio.Lock()

    @property
    def name(self) -> str:
        return f"http:{self._model or '?'}"

    async def model(self) -> str:
        """The model name sent with each request (asked once from ``/v1/models`` if not given)."""
        async with self._model_lock:
            if self._model is None:
                root = self._roots[0]
                try:
                    response = await self._client.get(f"{root}/models")
                    response.raise_for_status()
                    self._model = response.json()["data"][0]["id"]
                except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
                    raise DsparkError(
                        f"cannot list the models at {root}/models ({e}); pass --model"
                    ) from None
        return self._model

    def _body(self, model: str, messages: Messages, params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stream": False,
            # Ask for the token ids (vLLM >= 0.10 returns them; servers that do not know the
            # field ignore it, and the record is then marked text-only).
            "return_token_ids": True,
        }
        if params.top_k > 0:
            body["top_k"] = params.top_k  # vLLM/SGLang extension; off unless asked
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        if self.template_kwargs:
            body["chat_template_kwargs"] = self.template_kwargs
        return body

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        cap = self.config.backoff_max_s
        if retry_after is not None:
            try:
                return min(max(float(retry_after), 0.0), cap)
            except ValueError:
                pass
        # Full jitter keeps many workers that failed together from retrying together.
        return random.uniform(0.5, 1.0) * min(cap, self.config.backoff_s * 2**attempt)

    async def answer(self, messages: Messages, params: SamplingParams) -> Answer:
        body = self._body(await self.model(), messages, params)
        reason = "no attempt"
        for attempt in range(self.config.max_retries + 1):
            root = self._roots[next(self._next_root)]
            retry_after = None
            try:
                response = await asyncio.wait_for(
                    self._client.post(f"{root}/chat/completions", json=body), self.config.timeout_s
                )
            except (TimeoutError, httpx.TimeoutException):
                reason = f"{root}: timed out after {self.config.timeout_s:g} s"
            except httpx.TransportError as e:
                reason = f"{root}: {type(e).__name__}: {e}"
            else:
                if response.status_code == 200:
                    try:
                        return _parse_answer(response.json())
                    except ValueError:
                        reason = f"{root}: response is not JSON: {response.text[:200]!r}"
                    except AnswerError as e:
                        reason = f"{root}: {e.reason}"
                else:
                    reason = f"{root}: HTTP {response.status_code}: {_error_text(response)}"
                    status = response.status_code
                    if status < 500 and status not in _RETRYABLE_STATUS:
                        raise AnswerError(reason, retryable=False)
                    retry_after = response.headers.get("retry-after")
            if attempt < self.config.max_retries:
                await asyncio.sleep(self._backoff(attempt, retry_after))
        raise AnswerError(f"{reason} (after {self.config.max_retries + 1} attempts)", retryable=True)

    async def aclose(self) -> None:
        await self._client.aclose()
