"""``dspark serve`` as a real process: SIGTERM drains (the running stream completes), then exit 0."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def test_sigterm_finishes_the_running_stream_refuses_new_work_and_exits_0(tmp_path):
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    target = build_tiny_chat_target(tmp_path / "target", max_position=1024)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "dspark", "--threads", "1", "serve", "--target", str(target), "--port", "0"]
    cmd += ["--drafter", "ngram", "--scheduler", "fixed", "--max-batch", "2", "--drain-timeout", "60"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()  # "dspark: serving ... at http://127.0.0.1:PORT (...)"
        match = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
        assert match, line + proc.stderr.read()
        url = match.group(1)
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
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
