"""The OpenAI-compatible wire format of ``dspark serve`` (DESIGN §10): requests, responses, errors.

Requests are validated strictly: ``"5"`` is not an integer, ``true`` is not a number,
``NaN``/``Infinity`` are not numbers (Python's JSON parser accepts them), so every wrong
type is a 400 before anything reaches the engine. Fields of the OpenAI API that dspark
does not implement (``logprobs``, ``presence_penalty``, ...) are ignored, as vLLM does;
``n`` must be 1. An integer field takes an integer-valued number (``1.0``), as JSON
does not tell them apart; ``developer`` messages are system messages. ``top_k`` and
``chat_template_kwargs`` are the usual extensions of vLLM and SGLang (``-1`` or ``0`` =
top-k off).

Which values the engine cannot take although the schema allows them (a prompt longer
than the context, token ids outside the vocabulary, an unknown model) is decided by
:mod:`dspark.server.prepare`, also with a 4xx.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

MAX_STOP_STRINGS = 16
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts


def _integral_float(value: Any) -> Any:
    """``1.0`` is the integer 1 (JSON has one number type; OpenAI's clients send it); ``1.5`` is not."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**64:
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral_float)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
TokenId = Annotated[Int, Field(ge=0)]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False  # one last chunk with the token counts, before [DONE]


class SamplingRequest(_Request):
    """Fields shared by both generation endpoints."""

    model: str | None = Field(None, description="the served model's id; omitted = the served model")
    max_tokens: Int | None = Field(None, ge=1, description="most tokens to generate (cut to the context)")
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False, description="nucleus mass in (0, 1]")
    top_k: Int = Field(0, ge=-1, description="keep the k most likely tokens; 0 or -1 = off")
    stop: NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=MAX_STOP_STRINGS)] | None = Field(
        None, description="stop strings: the text ends before the first one generated"
    )
    seed: Int | None = Field(None, ge=_SEED_MIN, le=_SEED_MAX, description="seed for reproducible sampling")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Int = Field(1, ge=1, le=1, description="choices per request: only 1 is supported")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``: continue a raw prompt (text, or token ids)."""

    prompt: str | Annotated[list[TokenId], Field(min_length=1)]
    max_tokens: Int | None = Field(16, ge=1, description="most tokens to generate (OpenAI's default: 16)")


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart]
    name: str | None = None

    @property
    def template_role(self) -> str:
        """The role the chat template sees: ``developer`` is OpenAI's newer name for ``system``."""
        return "system" if self.role == "developer" else self.role

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions``: answer a conversation through the target's chat template."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description='passed to the chat template, e.g. {"enable_thinking": false}'
    )


# -- responses ----------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


FinishReason = Literal["stop", "length"]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None
    logprobs: None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    """One SSE event of a streamed chat completion (``usage`` only on the optional last one)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "dspark"
    max_model_len: int  # tokens of prompt + answer one request may hold


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class ErrorBody(BaseModel):
    message: str
    type: str  # invalid_request_error | authentication_error | not_found_error | rate_limit_error | ...


class ErrorResponse(BaseModel):
    """Every 4xx/5xx body: ``{"error": {"message", "type"}}``, as OpenAI's API answers."""

    error: ErrorBody
