"""Issue 15's three figures, for whichever dspark is on PYTHONPATH (run it once per tree).

1. ``/health`` latency while a hostile request is handled: worst of ~100 polls/s while a
   looping chat template (``chat_template_kwargs``) and then a 10 MB prompt are sent,
   against the worst with no hostile request, measured in the same run.
2. The server's RSS under a 10 MB body: its peak RSS (VmHWM) before and after the request.
3. Time to the first record of ``dspark data regenerate --limit 3`` on a 1M-line prompt
   file, against the same command on a 3-line file (the process start + target load).

    PYTHONPATH=/path/to/tree/src python scripts/bench_hardening.py [--lines 1000000]

Issue 40's fuzz run of every drafter is ``scripts/fuzz_server.py`` (it reuses this
file's server and ``/health`` poller).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

LOOP = "{% for i in range(8000) %}{% for j in range(8000) %}{% endfor %}{% endfor %}hi"


def _status(pid: int, field: str) -> float:
    """A VmRSS / VmHWM line of /proc/PID/status, in MB."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+)", text, re.M).group(1)) / 1024


def start_server(drafter: str = "none", log: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """``dspark serve`` with its default settings but ``--drafter``, on 127.0.0.1 (any free port);
    the server's later stderr lines go to ``log`` when given."""
    cmd = [sys.executable, "-m", "dspark", "--threads", "1", "serve", "--port", "0", "--drafter", drafter]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"at (http://[\d.]+:\d+)", line)
        if m:
            drain = proc.stderr.read if log is None else lambda: log.extend(proc.stderr)
            threading.Thread(target=drain, daemon=True).start()  # keep the pipe drained
            url = m.group(1)
            break
    else:
        raise RuntimeError("the server did not start")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not answer /health")


def _poll_health(url: str, stop, out) -> None:
    """Poll ``url``/health every 10 ms until ``stop`` is set; put the figures on ``out``."""
    seconds, not_ok, errors = [], {}, 0
    with httpx.Client(timeout=120) as c:
        while not stop.is_set():
            t = time.perf_counter()
            try:
                status = c.get(f"{url}/health").status_code
            except httpx.TransportError:
                errors, status = errors + 1, None
            seconds.append(time.perf_counter() - t)
            if status != 200:
                not_ok[status] = not_ok.get(status, 0) + 1
            time.sleep(0.01)
    seconds.sort()
    quantile = lambda q: seconds[min(int(q * len(seconds)), len(seconds) - 1)] if seconds else 0.0  # noqa: E731
    out.put({"worst": quantile(1.0), "p99": quantile(0.99), "p50": quantile(0.5), "polls": len(seconds),
             "not_ok": not_ok, "errors": errors})  # fmt: skip


class HealthPoller:
    """Polls ``/health`` every 10 ms on its own connection while in use: worst latency, answers
    other than 200 (a 503 is a dead engine or a draining server), transport errors.

    From a thread of this process by default, so the worst latency includes this process's
    own delays (a client sending 10 MB); ``process=True`` polls from a process of its own.
    """

    def __init__(self, url: str, *, process: bool = False) -> None:
        self.url, self.figures = url, {}
        if process:
            ctx = multiprocessing.get_context("spawn")
            self._stop, self._out = ctx.Event(), ctx.Queue()
            self._poller = ctx.Process(target=_poll_health, args=(url, self._stop, self._out), daemon=True)
        else:
            self._stop, self._out = threading.Event(), queue.Queue()
            self._poller = threading.Thread(
                target=_poll_health, args=(url, self._stop, self._out), daemon=True
            )

    def __enter__(self) -> HealthPoller:
        self._poller.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.2)
        self._stop.set()
        self.figures = self._out.get(timeout=180)  # worst, p99, p50 (s), polls, not_ok {status: n}, errors
        self._poller.join()

    @property
    def worst(self) -> float:
        return self.figures["worst"]


def worst_health_latency(url: str, request=None, idle_s: float = 2.0) -> tuple[float, object]:
    """Worst /health latency (s) while ``request()`` runs (or for ``idle_s`` seconds)."""
    with HealthPoller(url) as poller:
        result = request() if request is not None else time.sleep(idle_s)
    return poller.worst, result


def bench_server() -> dict:
    proc, url = start_server()
    try:
        client = httpx.Client(timeout=300)
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        hostile_template = {**chat, "chat_template_kwargs": {"chat_template": LOOP}}
        big = json.dumps(
            {"prompt": "The quick brown fox jumps over the lazy dog. " * 222_222, "max_tokens": 4}
        )
        headers = {"content-type": "application/json"}

        def timed(fn):
            t = time.perf_counter()
            r = fn()
            return {"status": r.status_code, "seconds": round(time.perf_counter() - t, 3)}

        idle, _ = worst_health_latency(url)
        loop_worst, loop = worst_health_latency(
            url, lambda: timed(lambda: client.post(f"{url}/v1/chat/completions", json=hostile_template))
        )
        hwm_before = _status(proc.pid, "VmHWM")
        big_worst, big_req = worst_health_latency(
            url, lambda: timed(lambda: client.post(f"{url}/v1/completions", content=big, headers=headers))
        )
        hwm_after = _status(proc.pid, "VmHWM")
        return {
            "health_worst_idle_s": round(idle, 4),
            "health_worst_during_looping_template_s": round(loop_worst, 4),
            "looping_template_request": loop,
            "health_worst_during_10mb_body_s": round(big_worst, 4),
            "10mb_request": big_req,
            "stall_ratio_template": round(loop_worst / idle, 1),
            "stall_ratio_10mb": round(big_worst / idle, 1),
            "server_peak_rss_mb_before_10mb": round(hwm_before),
            "server_peak_rss_mb_after_10mb": round(hwm_after),
            "server_rss_growth_mb": round(hwm_after - hwm_before),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def time_to_first_record(prompts: Path, out: Path) -> float:
    cmd = [sys.executable, "-m", "dspark", "--threads", "1", "data", "regenerate", "--prompts", str(prompts)]
    cmd += ["--limit", "3", "--out", str(out), "--max-tokens", "4", "--no-progress"]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (out.is_file() and out.stat().st_size > 0):
            if proc.poll() is not None and not out.is_file():
                raise RuntimeError(f"regenerate exited with {proc.returncode} before any record")
            time.sleep(0.02)
        return time.perf_counter() - started
    finally:
        proc.wait(timeout=600)


def bench_prompts(lines: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        row = '{"turns": ["Explain prompt %d in one sentence."]}\n'
        with open(root / "big.jsonl", "w") as f:
            for start in range(0, lines, 10_000):
                f.write("".join(row % i for i in range(start, min(start + 10_000, lines))))
        (root / "small.jsonl").write_text("".join(row % i for i in range(3)))
        small = time_to_first_record(root / "small.jsonl", root / "small.out.jsonl")
        big = time_to_first_record(root / "big.jsonl", root / "big.out.jsonl")
    return {
        "first_record_3_lines_s": round(small, 2),
        f"first_record_{lines}_lines_s": round(big, 2),
        "ratio": round(big / small, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=1_000_000)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import dspark

    report = {"dspark": str(Path(dspark.__file__).parent), **bench_server(), **bench_prompts(args.lines)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
