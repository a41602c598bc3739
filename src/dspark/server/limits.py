"""What one request may cost the server before the engine sees it (no request stalls it).

- **Body size**: a request body above ``max_body_bytes`` is answered 413 before it is
  parsed (:class:`BodyLimitMiddleware`; a ``Content-Length`` above the limit is refused
  before a byte is read).
- **Prompt bytes**: a prompt of B bytes needs at least ``B / max_token_bytes`` tokens
  (no token of the vocabulary spells more bytes), so a prompt longer than
  ``capacity · max_token_bytes`` bytes cannot fit the context and is refused before
  it is tokenized (:func:`prompt_byte_limit`).
- **Chat template**: ``chat_template_kwargs`` are variables *for* the target's template;
  keys that would replace the template or change how it is applied (``chat_template``,
  ``tokenize``, ``sanitize_control_tokens``, ...) never reach it: the request is refused with a
  400 naming them (:func:`template_variables`), before anything is rendered.
- **Time**: rendering and tokenizing run on a small thread pool, off the event loop,
  and a request whose preparation takes longer than ``prepare_timeout_s`` is answered
  503 (:class:`Preparer`); ``/health`` and the streams keep being served meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dspark.server.errors import ApiError, error_response

T = TypeVar("T")

MIN_MAX_BODY_BYTES = 1 << 20  # 1 MiB: room for the sampling fields of any prompt that fits
JSON_EXPANSION = 6  # a character escaped as \uXXXX takes 6 bytes of JSON
DEFAULT_PREPARE_TIMEOUT_S = 10.0
PREPARE_THREADS = 2
# apply_chat_template's own parameters: passed as "template variables" they would swap the
# template (a client's own Jinja), or change what the call returns.
TEMPLATE_CONTROL_KEYS = frozenset(
    {
        "chat_template",
        "conversation",
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "processor_kwargs",
    }
)


def max_token_bytes(tokenizer) -> int:
    """The most UTF-8 bytes one vocabulary entry spells (an upper bound on the bytes a token covers)."""
    return max((len(t.encode("utf-8", "surrogatepass")) for t in tokenizer.get_vocab()), default=1)


def prompt_byte_limit(tokenizer, capacity: int) -> int:
    """Prompts longer than this many bytes cannot fit ``capacity`` tokens (module docstring)."""
    return capacity * max(max_token_bytes(tokenizer), 1)


def default_max_body_bytes(prompt_bytes: int) -> int:
    """A body limit that admits every prompt that can fit, however it is escaped in JSON."""
    return max(MIN_MAX_BODY_BYTES, JSON_EXPANSION * prompt_bytes + (64 << 10))


def template_variables(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """``chat_template_kwargs``, refused (400) if a key would control the template (module docstring)."""
    control = sorted(set(kwargs or {}) & TEMPLATE_CONTROL_KEYS)
    if control:
        raise ApiError(
            400,
            f"chat_template_kwargs may not set {', '.join(map(repr, control))}: they control the chat "
            "template instead of passing variables to it",
        )
    return dict(kwargs or {})


class Preparer:
    """Runs request preparation (template, tokenizer) on its own threads, with a time limit."""

    def __init__(self, timeout_s: float = DEFAULT_PREPARE_TIMEOUT_S, threads: int = PREPARE_THREADS) -> None:
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dspark-prepare")

    async def run(self, fn: Callable[[], T]) -> T:
        future = asyncio.get_running_loop().run_in_executor(self._pool, fn)
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            raise ApiError(
                503,
                f"preparing the prompt (chat template, tokenizer) took longer than {self.timeout_s:g} s",
                headers={"Retry-After": "1"},
            ) from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class BodyLimitMiddleware:
    """413 for a request body above ``max_bytes``; the body is read (bounded) before the app runs."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the request body is larger than this server's limit of {self.max_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(self._too_large())(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await error_response(self._too_large())(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then: the disconnect, as the app expects

        await self.app(scope, replay, send)
