"""The engine behind asyncio: one background thread steps it, callers await or stream.

In-process regeneration (DESIGN §7.2) and the HTTP server (DESIGN §10) serve many
concurrent callers from one engine. The engine is not thread-safe, so every call into
it happens on the worker thread; callers hand it commands (submit, cancel) through a
queue and receive their tokens through an asyncio queue of their own. Requests that
arrive while a step runs join the batch at the next step (continuous batching).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from dspark.engine.engine import Engine
from dspark.engine.requests import RequestFailedError
from dspark.protocols import GenerationResult, SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine's step loop failed; no request can be served any more."""


@dataclass(eq=False)
class _Sink:
    """Where one request's tokens go: an asyncio queue on the caller's event loop."""

    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    request_id: int | None = None

    def put(self, kind: str, value) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


OnResult = Callable[[GenerationResult], None]


class EngineWorker:
    """Steps an :class:`Engine` on a daemon thread while it has work; ``await generate``, ``stream``.

    ``on_finish`` (e.g. the server's metrics) is called on the worker thread with the
    result of every request that leaves the engine, finished or cancelled.
    """

    def __init__(
        self, engine: Engine, *, idle_wait_s: float = 0.05, on_finish: OnResult | None = None
    ) -> None:
        self.engine = engine
        self.on_finish = on_finish
        self.error: BaseException | None = None  # set when the step loop died
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle_wait_s = idle_wait_s
        self._sinks: dict[int, _Sink] = {}
        self._thread = threading.Thread(target=self._run, name="dspark-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def close(self, timeout: float | None = None) -> None:
        """Stop after the current step; requests still running are cancelled."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    async def stream(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, on_done: OnResult | None = None
    ) -> AsyncIterator[list[int]]:
        """Yield each step's new tokens; leaving early (or being cancelled) cancels the request.

        ``on_done`` receives the final result (finish reason, text cut at a stop string)
        just before the stream ends.
        """
        sink = await self._submit(prompt_ids, params)
        finished = False
        try:
            while True:
                kind, value = await sink.events.get()
                if kind == "tokens":
                    yield value
                elif kind == "done":
                    finished = True
                    if on_done is not None:
                        on_done(value)
                    return
                else:
                    finished = True
                    raise value
        finally:
            if not finished:
                self._send("cancel", sink)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationResult:
        """Run one request to completion and return its result."""
        sink = await self._submit(prompt_ids, params)
        try:
            while True:
                kind, value = await sink.events.get()
                if kind == "done":
                    return value
                if kind == "error":
                    raise value
        except asyncio.CancelledError:
            self._send("cancel", sink)
            raise

    # -- worker side ----------------------------------------------------------------

    async def _submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> _Sink:
        if not self.alive:
            raise EngineDeadError("the engine is not running") from self.error
        sink = _Sink(asyncio.get_running_loop())
        self._send("submit", (sink, list(prompt_ids), params))
        return sink

    def _send(self, kind: str, payload) -> None:
        self._commands.put((kind, payload))
        self._wake.set()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._apply_commands()
                if self.engine.has_work():
                    for event in self.engine.step():
                        self._deliver(event)
                else:
                    self._wake.wait(self._idle_wait_s)
                    self._wake.clear()
        except BaseException as e:  # the loop is dead: tell every caller, keep the cause
            logger.exception("engine step loop failed")
            self.error = e
            for sink in self._sinks.values():
                sink.put("error", EngineDeadError(f"engine failed: {e!r}"))
            self._sinks.clear()
        for rid in list(self._sinks):  # closed while requests were running
            self.engine.cancel(rid)
            self._sinks.pop(rid).put("error", EngineDeadError("the engine was closed"))

    def _apply_commands(self) -> None:
        while True:
            try:
                kind, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                sink, prompt_ids, params = payload
                try:
                    sink.request_id = self.engine.submit(prompt_ids, params)
                except Exception as e:  # a bad request fails alone
                    sink.put("error", e)
                    continue
                self._sinks[sink.request_id] = sink
            elif kind == "cancel" and payload.request_id in self._sinks:
                self.engine.cancel(payload.request_id)
                del self._sinks[payload.request_id]
                self._finished(self.engine.pop_result(payload.request_id))

    def _deliver(self, event) -> None:
        sink = self._sinks.get(event.request_id)
        if sink is None:
            return
        if event.tokens:
            sink.put("tokens", event.tokens)
        if event.finish_reason is not None:
            del self._sinks[event.request_id]
            result = self.engine.pop_result(event.request_id)
            self._finished(result)
            if event.finish_reason == "error":  # this request alone failed; the loop serves on
                sink.put("error", RequestFailedError(result.error or "the engine failed this request"))
            else:
                sink.put("done", result)

    def _finished(self, result: GenerationResult) -> None:
        if self.on_finish is not None:
            try:
                self.on_finish(result)
            except Exception:  # an observer's bug must not kill the engine
                logger.exception("on_finish hook failed")
