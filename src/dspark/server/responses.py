"""OpenAI response bodies and Server-Sent Events for both generation endpoints.

The two endpoints differ only in how a piece of text is wrapped: ``choices[0].text``
for completions, ``choices[0].message`` / ``delta`` for chat. :class:`Flavor` holds
that difference; everything else (ids, usage, the SSE framing ending with
``data: [DONE]``) is shared.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from dspark.protocols import GenerationResult
from dspark.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    Usage,
)


def finish_reason(result: GenerationResult) -> str:
    """OpenAI's reasons: EOS and stop strings are ``stop``, ``max_tokens``/context is ``length``."""
    return "length" if result.finish_reason == "length" else "stop"


@dataclass(frozen=True)
class Reply:
    """Identity of one response: every chunk of a stream carries the same id and timestamp."""

    model: str
    chat: bool
    prompt_tokens: int
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex)

    def usage(self, completion_tokens: int) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=self.prompt_tokens + completion_tokens,
        )

    def body(self, result: GenerationResult) -> CompletionResponse | ChatCompletionResponse:
        """The non-streamed response."""
        usage, reason = self.usage(len(result.token_ids)), finish_reason(result)
        if self.chat:
            choice = ChatChoice(message=AssistantMessage(content=result.text), finish_reason=reason)
            return ChatCompletionResponse(
                id=self.id, created=self.created, model=self.model, choices=[choice], usage=usage
            )
        choice = CompletionChoice(text=result.text, finish_reason=reason)
        return CompletionResponse(
            id=self.id, created=self.created, model=self.model, choices=[choice], usage=usage
        )

    def chunk(self, text: str | None, reason: str | None = None, *, role: bool = False) -> str:
        """One SSE event carrying ``text`` (and the finish reason on the last one)."""
        if self.chat:
            delta = (
                {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
            )
            choice = {"index": 0, "delta": delta, "finish_reason": reason}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": reason, "logprobs": None}
            obj = "text_completion"
        return self._event({"id": self.id, "object": obj, "created": self.created, "model": self.model,
                            "choices": [choice]})  # fmt: skip

    def usage_chunk(self, completion_tokens: int) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        usage = self.usage(completion_tokens).model_dump()
        return self._event(
            {
                "id": self.id,
                "object": obj,
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage,
            }
        )

    @staticmethod
    def error_event(message: str, type: str) -> str:
        return Reply._event({"error": {"message": message, "type": type}})

    @staticmethod
    def _event(payload: dict) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"


class EventStream(StreamingResponse):
    """``text/event-stream`` whose ``on_close`` runs however the response ends.

    A client that goes away cancels the response task: the events generator is then
    closed here (which cancels the engine request and frees its KV slot) and the
    request's place in the queue is given back, also if the stream never started.
    """

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._events, self._on_close = events, on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._events.aclose()
            finally:
                self._on_close()
