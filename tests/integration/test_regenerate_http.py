"""Regeneration against a real OpenAI-compatible HTTP server on loopback (DESIGN §7.2).

Until ``dspark serve`` exists, the server is the small FastAPI app below: it serves a
tiny random Qwen3 (``/v1/models``, ``/v1/chat/completions``) through the target's chat
template and our decoding loop, with knobs to delay, fail every n-th request, or fail
prompts that contain a marker. It is also the server of the regeneration benchmark::

    python tests/integration/test_regenerate_http.py --target DIR --port 8123
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from dspark.data.http_backend import HttpBackend, HttpConfig
from dspark.data.prompts import Prompt, write_prompts
from dspark.data.records import read_jsonl
from dspark.data.regenerate import InProcessBackend, RegenerateConfig, chat_prompt_ids, regenerate
from dspark.decoding import speculative_generate
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter

REPO = Path(__file__).resolve().parents[2]
POISON = "POISON"  # prompts with this marker always get HTTP 500
BAD_REQUEST = "BADREQ"  # ... and with this one HTTP 400


class InFlight:
    """Requests in flight now and at most, over every app that shares it."""

    def __init__(self) -> None:
        self.now = self.max = 0
        self._lock = threading.Lock()  # apps run in their own server threads

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.max = max(self.max, self.now)

    def __exit__(self, *exc) -> None:
        with self._lock:
            self.now -= 1


def make_app(
    target,
    *,
    delay_s: float = 0.0,
    fail_every: int = 0,
    model: str = "tiny",
    in_flight: InFlight | None = None,
) -> FastAPI:
    """An OpenAI-compatible chat server over ``target`` (one generation at a time)."""
    app = FastAPI()
    lock = threading.Lock()  # the target runs one request at a time
    app.state.requests = []  # (messages, chat_template_kwargs) of every request, in arrival order
    app.state.in_flight = in_flight or InFlight()
    app.state.count = 0
    tok = target.tokenizer

    def generate(messages, kwargs, params):
        with lock:
            ids = chat_prompt_ids(tok, messages, kwargs)
            decode = lambda x: tok.decode(x, skip_special_tokens=True)  # noqa: E731
            return speculative_generate(target, None, ids, params, decode=decode)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model, "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        app.state.count += 1
        number = app.state.count
        with app.state.in_flight:
            app.state.requests.append((body["messages"], body.get("chat_template_kwargs")))
            await asyncio.sleep(delay_s)
            text = json.dumps(body["messages"])
            if BAD_REQUEST in text:
                return JSONResponse({"error": {"message": "bad prompt", "type": "invalid_request"}}, 400)
            if POISON in text or (fail_every and number % fail_every == 0):
                return JSONResponse({"error": {"message": "injected failure", "type": "server_error"}}, 500)
            params = SamplingParams(
                temperature=body.get("temperature", 1.0),
                top_p=body.get("top_p", 1.0),
                top_k=body.get("top_k", 0),
                max_tokens=body["max_tokens"],
                seed=body.get("seed"),
            )
            kwargs = body.get("chat_template_kwargs") or {}
            result = await asyncio.to_thread(generate, body["messages"], kwargs, params)
            return {
                "id": f"chatcmpl-{number}",
                "object": "chat.completion",
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": result.text},
                        "finish_reason": result.finish_reason,
                    }
                ],
                "usage": {"completion_tokens": len(result.token_ids)},
            }

    return app


@contextlib.contextmanager
def serve(app: FastAPI, port: int = 0):
    """Run ``app`` on 127.0.0.1 in a thread; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    return build_tiny_chat_target(tmp_path_factory.mktemp("tiny_chat"))


@pytest.fixture(scope="module")
def target(target_dir):
    return TargetAdapter.from_pretrained(target_dir)


def _prompts(n: int, turns: int = 1) -> list[Prompt]:
    return [Prompt(tuple(f"question {i} part {t}" for t in range(turns)), domain="chat") for i in range(n)]


GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


def _http(urls, **kw) -> HttpBackend:
    return HttpBackend(HttpConfig(base_urls=tuple(urls), backoff_s=0.01, backoff_max_s=0.05, **kw))


# -- tests ------------------------------------------------------------------------------------


def test_http_equals_in_process_and_replays_turns_in_order(target, tmp_path):
    """Greedy answers over HTTP equal in-process ones; turn t's request carries answers < t."""
    prompts = _prompts(3, turns=3)
    kwargs = {"enable_thinking": False}
    app = make_app(target)
    with serve(app) as url:
        regenerate(
            prompts,
            _http([url], template_kwargs=kwargs),
            tmp_path / "http.jsonl",
            tmp_path / "http.err",
            GREEDY,
            RegenerateConfig(concurrency=3, progress=False),
        )
    regenerate(
        prompts,
        InProcessBackend(target, template_kwargs=kwargs),
        tmp_path / "local.jsonl",
        tmp_path / "local.err",
        GREEDY,
        RegenerateConfig(progress=False),
    )
    by_id = lambda path: {r["id"]: r for r in read_jsonl(path, log=True)}  # noqa: E731
    http, local = by_id(tmp_path / "http.jsonl"), by_id(tmp_path / "local.jsonl")
    assert set(http) == set(local) == {p.key for p in prompts}
    for key, record in http.items():
        assert record["answers"] == local[key]["answers"]
        assert record["template_kwargs"] == kwargs and record["backend"] == "http:tiny"
        assert record["sampling"]["temperature"] == 0.0 and record["sampling"]["max_tokens"] == 6

    # Every request of a prompt extends the previous one by (its answer, the next user turn).
    assert all(k == kwargs for _, k in app.state.requests)
    answers = {tuple(r["turns"]): r["answers"] for r in http.values()}
    for messages, _ in app.state.requests:
        turns = tuple(m["content"] for m in messages if m["role"] == "user")
        full = next(t for t in answers if t[: len(turns)] == turns)
        expected = []
        for t, user in enumerate(turns):
            expected.append({"role": "user", "content": user})
            if t < len(turns) - 1:
                expected.append({"role": "assistant", "content": answers[full][t]})
        assert messages == expected


def test_concurrency_and_round_robin(target, tmp_path):
    in_flight = InFlight()
    apps = [make_app(target, delay_s=0.05, in_flight=in_flight) for _ in range(2)]
    with serve(apps[0]) as url_a, serve(apps[1]) as url_b:
        summary = regenerate(
            _prompts(16),
            _http([url_a, url_b], model="tiny"),
            tmp_path / "out.jsonl",
            tmp_path / "err.jsonl",
            GREEDY,
            RegenerateConfig(concurrency=4, progress=False),
        )
    assert summary.done == 16 and summary.failed == 0
    assert [len(a.state.requests) for a in apps] == [8, 8]  # strict alternation
    assert in_flight.max == 4  # the concurrency is used, and never exceeded


def test_failing_server_retries_then_error_file(target, tmp_path):
    """Every 5th request fails (20%): retried and answered. Poisoned prompts exhaust their
    retries and land in the error file; a 400 fails at once and is not retried on rerun."""
    prompts = _prompts(12) + [Prompt((f"{POISON} {i}",)) for i in range(2)] + [Prompt((f"{BAD_REQUEST}",))]
    app = make_app(target, fail_every=5)
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    with serve(app) as url:
        first = regenerate(
            prompts,
            _http([url], max_retries=2),
            out,
            err,
            GREEDY,
            RegenerateConfig(concurrency=4, progress=False),
        )
        assert (first.done, first.failed) == (12, 3)
        errors = {e["id"]: e for e in read_jsonl(err, log=True)}
        assert set(errors) == {p.key for p in prompts[12:]}
        for p in prompts[12:14]:
            assert errors[p.key]["retryable"] and "HTTP 500" in errors[p.key]["reason"]
            assert "after 3 attempts" in errors[p.key]["reason"]
        bad = errors[prompts[14].key]
        assert not bad["retryable"] and "HTTP 400: bad prompt" in bad["reason"]
        assert sum(BAD_REQUEST in json.dumps(m) for m, _ in app.state.requests) == 1  # no retry of a 400

        # Rerun: only the retryable failures are tried again.
        before = len(app.state.requests)
        second = regenerate(
            prompts, _http([url], max_retries=0), out, err, GREEDY, RegenerateConfig(progress=False)
        )
    assert (second.resumed, second.skipped, second.done, second.failed) == (12, 1, 0, 2)
    assert len(app.state.requests) - before == 2
    assert len(read_jsonl(out, log=True)) == 12


def test_kill_and_resume_has_no_duplicate_and_no_loss(target, tmp_path, capsys):
    """SIGKILL the CLI mid-run, run the same command again: every prompt exactly once."""
    from dspark.cli import main

    prompts = _prompts(40)
    prompts_file, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    write_prompts(prompts, prompts_file)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    with serve(make_app(target, delay_s=0.03)) as url:
        args = ["data", "regenerate", "--prompts", str(prompts_file), "--out", str(out), "--base-url", url]
        args += ["--concurrency", "4", "--max-tokens", "6", "--no-progress"]
        cmd = [sys.executable, "-m", "dspark", *args]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not (out.exists() and out.read_bytes().count(b"\n") >= 8):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed_at = len(read_jsonl(out, log=True, repair=False))
        assert 8 <= killed_at < len(prompts)
        capsys.readouterr()
        assert main(args) == 0  # the rerun, in this process (saves a second interpreter start)
    report = json.loads(capsys.readouterr().out)
    assert report["resumed"] == killed_at and report["done"] == len(prompts) - killed_at
    ids = [r["id"] for r in read_jsonl(out, log=True)]
    assert len(ids) == len(set(ids)) == len(prompts)
    assert set(ids) == {p.key for p in prompts}


def _main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="serve a target with the test's OpenAI-compatible app")
    parser.add_argument("--target", required=True)
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args()
    torch.set_num_threads(1)
    app = make_app(TargetAdapter.from_pretrained(args.target))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    _main()
