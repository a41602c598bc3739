"""The OpenAI-compatible HTTP server over one engine (DESIGN §10).

``create_app(worker, model_name)`` builds a FastAPI app around an
:class:`~dspark.engine.worker.EngineWorker`, whose thread steps the engine; every HTTP
request is one engine request, batched with whatever else is running (continuous
batching). A request's path through the app:

1. API key (every route but ``/health``) → 401; body size (:mod:`dspark.server.limits`) → 413;
2. schema validation (:mod:`dspark.server.schemas`) → 400;
3. engine alive and not draining → 503; model name → 404;
4. tokenize and check against the context (:mod:`dspark.server.prepare`) → 400, on a
   thread pool with a time limit (→ 503), never on the event loop;
5. admission: at most ``max_batch + max_queue`` requests in the engine → 429;
6. generate; a client that disconnects cancels its engine request (its KV slot is freed
   at the next step) and gives its place back; ``/metrics`` counts it, like a client that
   hangs up while still uploading its body, as 499, not as a server error. A request the
   engine fails alone (a drafter's non-finite probabilities) is a 500 for that request;
   the engine serves on.

SIGTERM handling (stop accepting, finish what runs) lives with uvicorn in
:mod:`dspark.server.uvicorn_runner`; the app only answers 503 once ``state.draining`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dspark.engine.requests import RequestFailedError
from dspark.engine.worker import EngineDeadError, EngineWorker
from dspark.errors import DsparkError
from dspark.server.errors import ApiError, error_response, install_error_handlers
from dspark.server.limits import (
    DEFAULT_PREPARE_TIMEOUT_S,
    BodyLimitMiddleware,
    Preparer,
    default_max_body_bytes,
    prompt_byte_limit,
)
from dspark.server.metrics import EngineCollector, ServerMetrics
from dspark.server.prepare import Prepared, prepare_chat, prepare_completion
from dspark.server.responses import DONE, EventStream, Reply, finish_reason
from dspark.server.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    Health,
    ModelCard,
    ModelList,
)
from dspark.server.textstream import TextStream

DEFAULT_MAX_QUEUE = 128
CLIENT_CLOSED = 499  # nginx's status for a request whose client left before the answer
GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")
ROUTES = (*GENERATION_ROUTES, "/v1/models", "/health", "/metrics")
# One Server-Sent Event (OpenAPI < 3.2: the media type's schema describes each event).
SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a JSON chunk; the last event is [DONE]"}},
}


class Admission:
    """At most ``limit`` requests in the engine at once (running or queued); past it, 429.

    Only the event loop touches it, so a plain counter is enough.
    """

    def __init__(self, limit: int) -> None:
        self.limit, self.count = limit, 0

    def acquire(self) -> Callable[[], None]:
        """Take a place; returns its (idempotent) release."""
        if self.count >= self.limit:
            raise ApiError(
                429,
                f"the server is at capacity ({self.limit} requests); retry later",
                headers={"Retry-After": "1"},
            )
        self.count += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.count -= 1

        return release


@dataclass
class ServerState:
    worker: EngineWorker
    model_name: str
    admission: Admission
    metrics: ServerMetrics
    created: int
    draining: bool = False  # set on SIGTERM: finish what runs, refuse what comes


def create_app(
    worker: EngineWorker,
    model_name: str,
    *,
    api_key: str | None = None,
    max_queue: int = DEFAULT_MAX_QUEUE,
    max_body_bytes: int | None = None,
    prepare_timeout_s: float = DEFAULT_PREPARE_TIMEOUT_S,
) -> FastAPI:
    """An OpenAI-compatible app serving ``worker``'s engine as ``model_name``.

    ``max_queue`` requests may wait for a KV slot beyond the engine's ``max_batch``
    running ones; more are refused with 429. Bodies above ``max_body_bytes`` (default:
    room for the longest prompt that fits the context) get 413; preparing a prompt may
    take ``prepare_timeout_s`` (:mod:`dspark.server.limits`). The app registers itself as
    the worker's ``on_finish`` observer (for the speculation metrics).
    """
    engine = worker.engine
    tokenizer = engine.target.tokenizer
    if tokenizer is None:
        raise DsparkError("serving needs a target with a tokenizer")
    if api_key is not None and not api_key.strip():
        raise DsparkError("the API key is empty: it would turn authentication off; give a real key or none")
    if api_key is not None and api_key != api_key.strip():  # the client's token is stripped: no match ever
        raise DsparkError("the API key starts or ends with whitespace: no client could send it")
    capacity, vocab_size = engine.kv.capacity, engine.target.vocab_size
    max_prompt_bytes = prompt_byte_limit(tokenizer, capacity)
    preparer = Preparer(prepare_timeout_s)
    metrics = ServerMetrics(block_size=engine.config.block_size)
    admission = Admission(engine.config.max_batch + max_queue)
    metrics.watch(EngineCollector(worker, lambda: admission.count))
    worker.on_finish = metrics.observe_result
    state = ServerState(worker, model_name, admission, metrics, created=int(time.time()))

    # No /docs or /redoc: their pages load scripts from a CDN (broken offline); /openapi.json stays.
    app = FastAPI(
        title="dspark",
        summary="Lossless speculative decoding, OpenAI-compatible",
        version="1",
        docs_url=None,
        redoc_url=None,
    )
    app.state.server = state
    install_error_handlers(app)
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=max_body_bytes or default_max_body_bytes(max_prompt_bytes)
    )
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
    errors = {code: {"model": ErrorResponse} for code in (400, 401, 404, 429, 503)}
    sse = {"content": {"text/event-stream": {"schema": SSE_EVENT}}, "description": "JSON; with stream, SSE"}

    def check_ready() -> None:
        if not worker.alive:
            raise ApiError(503, f"the engine is not running: {worker.error!r}")
        if state.draining:
            raise ApiError(503, "the server is shutting down", headers={"Connection": "close"})

    @app.head("/health", include_in_schema=False)  # load balancers probe with HEAD
    @app.get("/health", response_model=Health, responses={503: {"model": ErrorResponse}})
    async def health() -> Health:
        """200 while the engine runs; 503 once it died or the server is draining."""
        check_ready()
        return Health()

    @app.get("/v1/models", response_model=ModelList, responses={401: errors[401]})
    async def models() -> ModelList:
        card = ModelCard(id=model_name, created=state.created, max_model_len=capacity)
        return ModelList(data=[card])

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}, 401: errors[401]},
    )
    async def prometheus() -> Response:
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def generate(request: Request, body, prepare, chat: bool):
        check_ready()
        if body.model not in (None, model_name):
            raise ApiError(404, f"the model {body.model!r} does not exist; this server serves {model_name!r}")
        prepared = await preparer.run(
            lambda: prepare(
                body, tokenizer, capacity=capacity, vocab_size=vocab_size, max_prompt_bytes=max_prompt_bytes
            )
        )
        check_ready()  # preparing took a while: the engine may have gone meanwhile
        release = admission.acquire()
        metrics.prompt_tokens.inc(len(prepared.prompt_ids))
        reply = Reply(model=model_name, chat=chat, prompt_tokens=len(prepared.prompt_ids))
        if body.stream:
            events = _events(
                worker, prepared, reply, tokenizer, metrics, body.include_usage, request.url.path
            )
            return EventStream(events, on_close=release)
        try:
            result = await _unless_disconnected(
                request, worker.generate(prepared.prompt_ids, prepared.params)
            )
        except EngineDeadError as e:
            raise ApiError(503, f"the engine failed: {e}") from None
        except RequestFailedError as e:  # the server's fault (e.g. the drafter), this request only
            raise ApiError(500, str(e), type="server_error") from None
        except DsparkError as e:
            raise ApiError(400, str(e)) from None
        finally:
            release()
        if result is None:  # the client is gone; nobody reads this
            return Response(status_code=CLIENT_CLOSED)
        return reply.body(result)

    @app.post("/v1/completions", response_model=CompletionResponse, responses={200: sse, **errors})
    async def completions(body: CompletionRequest, request: Request):
        """Continue a prompt (text or token ids); ``stream: true`` for Server-Sent Events."""
        return await generate(request, body, prepare_completion, chat=False)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses={200: sse, **errors})
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        """Answer a conversation through the target's chat template; ``stream: true`` for SSE."""
        return await generate(request, body, prepare_chat, chat=True)

    _document(app, api_key is not None)
    return app


async def _events(
    worker: EngineWorker,
    prepared: Prepared,
    reply: Reply,
    tokenizer,
    metrics: ServerMetrics,
    include_usage: bool,
    endpoint: str,
) -> AsyncIterator[str]:
    """The SSE events of one streamed request, ending with ``data: [DONE]``."""
    started = time.perf_counter()
    text = TextStream(lambda ids: tokenizer.decode(ids, skip_special_tokens=True), prepared.params.stop)
    done = []
    try:
        if reply.chat:
            yield reply.chunk(None, role=True)
        async with contextlib.aclosing(
            worker.stream(prepared.prompt_ids, prepared.params, on_done=done.append)
        ) as s:
            async for tokens in s:
                if not text.tokens:
                    metrics.ttft.labels(endpoint).observe(time.perf_counter() - started)
                if delta := text.push(tokens):
                    yield reply.chunk(delta)
        (result,) = done
        tail = text.finish(result.text)
        if tail:
            yield reply.chunk(tail)
        yield reply.chunk(None, finish_reason(result))
        if include_usage:
            yield reply.usage_chunk(len(result.token_ids))
    except EngineDeadError as e:
        yield Reply.error_event(f"the engine failed: {e}", "service_unavailable")
    except RequestFailedError as e:
        yield Reply.error_event(str(e), "server_error")
    except DsparkError as e:
        yield Reply.error_event(str(e), "invalid_request_error")
    yield DONE


async def _unless_disconnected(request: Request, work):
    """Await ``work`` unless the client disconnects first: then cancel it and return None."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request.receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler itself is cancelled
        gone.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    with contextlib.suppress(asyncio.CancelledError):
        await task  # lets the worker send the engine its cancel
    return None


async def _disconnect(receive: Receive) -> None:
    """Returns when the client has gone (the request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class ApiKeyMiddleware:
    """``Authorization: Bearer <key>`` on every route but ``/health``; else 401."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self.key = app, api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            auth = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), self.key):
                error = ApiError(401, "missing or invalid API key", headers={"WWW-Authenticate": "Bearer"})
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class RequestMetricsMiddleware:
    """Counts every answer by endpoint and status; times the generation endpoints to the last byte.

    A request that got no answer because its client hung up first (while uploading its
    body, say) is counted as 499, nginx's "client closed request", not as a 500: a 5xx
    means the server failed, and pages an operator. An exception that escapes the app is
    a 500 whether the client stayed or not.
    """

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status, client_gone = time.perf_counter(), [None], [False]

        async def watching_receive() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                client_gone[0] = True
            return message

        async def recording_send(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        failed = True
        try:
            await self.app(scope, watching_receive, recording_send)
            failed = False
        finally:
            code = status[0] or (CLIENT_CLOSED if client_gone[0] and not failed else 500)
            endpoint = scope["path"] if scope["path"] in ROUTES else "other"
            self.metrics.requests.labels(endpoint, str(code)).inc()
            if endpoint in GENERATION_ROUTES and code == 200:
                self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)


def _document(app: FastAPI, with_api_key: bool) -> None:
    """OpenAPI as the server behaves: 400 (not FastAPI's 422) for bad input; the bearer key."""

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = FastAPI.openapi(app)
        for path, ops in schema.get("paths", {}).items():
            for op in ops.values():
                op.get("responses", {}).pop("422", None)
                if with_api_key and path != "/health":
                    op["security"] = [{"bearer": []}]
        components = schema.setdefault("components", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.get("schemas", {}).pop(name, None)
        if with_api_key:
            components.setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi
