"""``dspark serve`` as a real process: SIGTERM drains (the running stream completes), then exit 0."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def _stderr_lines(proc: subprocess.Popen) -> queue.Queue:
    """The process's stderr lines, read on a thread (a blocking read would hang the test)."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _serving_url(proc: subprocess.Popen, lines: queue.Queue, timeout: float = 120.0) -> str:
    """Wait for "dspark: serving ... at http://127.0.0.1:PORT"; lines before it (a warning, a
    profile of the machine) are allowed."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        assert line is not None, "the server exited before serving:\n" + "".join(seen)
        seen.append(line)
        if match := re.search(r"serving .* at (http://127\.0\.0\.1:\d+)", line):
            return match.group(1)
    raise AssertionError("the server did not say where it serves:\n" + "".join(seen))


def _rest(lines: queue.Queue) -> str:
    out = []
    while (line := _get(lines)) is not None:
        out.append(line)
    return "".join(out)


def _get(lines: queue.Queue) -> str | None:
    try:
        return lines.get(timeout=5)
    except queue.Empty:
        return None


def test_sigterm_finishes_the_running_stream_refuses_new_work_and_exits_0(tmp_path):
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    target = build_tiny_chat_target(tmp_path / "target", max_position=1024)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "dspark", "--threads", "1", "serve", "--target", str(target), "--port", "0"]
    cmd += ["--drafter", "ngram", "--scheduler", "fixed", "--max-batch", "2", "--drain-timeout", "60"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lines = _stderr_lines(proc)
        url = _serving_url(proc, lines)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not come up"
            time.sleep(0.05)

        body = {"prompt": "def add(a, b):", "max_tokens": 1000, "temperature": 0, "stream": True}
        events, refused = [], None
        with (
            httpx.Client(timeout=60) as client,
            client.stream("POST", f"{url}/v1/completions", json=body) as r,
        ):
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line:
                    continue
                events.append(line)
                if len(events) == 1:
                    proc.send_signal(signal.SIGTERM)
                elif refused is None and len(events) >= 20:
                    try:  # a new connection: the listening socket is closed (or 503 while draining)
                        refused = httpx.get(f"{url}/health", timeout=2).status_code == 503
                    except httpx.TransportError:
                        refused = True
        assert events[-1] == "data: [DONE]"
        chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert refused, "a new request was served while draining"
        code = proc.wait(timeout=30)
        assert code == 0, _rest(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
