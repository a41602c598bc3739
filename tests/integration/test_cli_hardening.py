"""Hostile inputs through the CLI (issue 15): one-line errors instead of tracebacks, a lock on a
regeneration's --out, prompt files read only as far as --limit needs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from dspark.cli import main
from dspark.data.prompts import load_prompts
from dspark.presets.tiny import tiny_target_dir


def _run(capsys, *argv) -> tuple[int, str]:
    try:
        code = main(["--threads", "1", *map(str, argv)])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def _one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2 and err.startswith("dspark: error: ") and err.count("\n") == 1, err
    assert all(n in err for n in needles), err


PROMPT_FILES = {
    "not UTF-8": (b'{"turns": ["caf\xe9"]}\n', "not UTF-8"),
    "messages not objects": (b'{"messages": ["hi", "there"]}\n', "must be an object"),
    "messages not a list": (b'{"messages": "hi"}\n', "must be a list"),
    "a lone surrogate": (b'{"turns": ["\\ud800 hi"]}\n', "invalid character"),
    "turns a string": (b'{"turns": "hi"}\n', "non-empty list of strings"),
}


@pytest.mark.parametrize("case", PROMPT_FILES)
def test_bad_prompt_files_are_one_line_errors(tmp_path, capsys, case):
    content, needle = PROMPT_FILES[case]
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"turns": ["fine"]}\n' + content)
    code, err = _run(capsys, "data", "prompts", "--set", path, "--out", tmp_path / "out.jsonl")
    _one_line(code, err, f"{path}:2", needle)


@pytest.mark.parametrize(
    "content,needle",
    [
        (b'{"conversations": [{"role": "user", "content": "\xff"}]}\n', "not UTF-8"),
        (b'{"conversations": ["hi"]}\n', "must be an object"),
        (b"[1, 2]\n", "expected a JSON object"),
        (b'{"turns": ["\\udfff"], "answers": ["ok"]}\n', "invalid character"),
    ],
)
def test_bad_training_data_is_a_one_line_error(tmp_path, capsys, content, needle):
    path = tmp_path / "train.jsonl"
    path.write_bytes(content)
    code, err = _run(
        capsys, "train", "--drafter", "dflash", "--data", path, "--out", tmp_path / "run", "--steps", "1"
    )
    _one_line(code, err, needle)


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"num_attention_heads": 0}, "ZeroDivisionError"),
        ({"num_hidden_layers": "two"}, "malformed"),
    ],
)
def test_a_malformed_target_config_is_a_one_line_error(tmp_path, capsys, change, needle):
    folder = tmp_path / "target"
    shutil.copytree(tiny_target_dir(), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | change))
    code, err = _run(capsys, "generate", "--target", folder, "--prompt", "Hi", "--max-tokens", "2")
    _one_line(code, err, "cannot load target", needle)


def _million_line_file(path, lines: int = 1_000_000) -> None:
    row = '{"turns": ["Explain prompt %d in one sentence."]}\n'
    with open(path, "w") as f:
        for start in range(0, lines, 10_000):
            f.write("".join(row % i for i in range(start, min(start + 10_000, lines))))


def test_a_limit_reads_only_the_head_of_a_huge_prompt_file(tmp_path):
    path = tmp_path / "big.jsonl"
    _million_line_file(path)
    started = time.perf_counter()
    prompts = load_prompts(str(path), limit=3)
    assert time.perf_counter() - started < 1.0 and [p.source for p in prompts] == [
        f"{path}:{n}" for n in (1, 2, 3)
    ]


def test_regenerate_with_limit_on_a_million_line_file_starts_at_once(tmp_path):
    """As fast as on a 3-line file (the same command first, as the baseline): nothing but the
    first lines is read. Before, the whole file was parsed first (72 s and +1 GB on 1M lines)."""

    def regenerate(prompts, out) -> float:
        argv = ["--threads", "1", "data", "regenerate", "--prompts", str(prompts), "--limit", "3"]
        argv += ["--out", str(out), "--max-tokens", "4", "--no-progress"]
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "dspark", *argv], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        assert len(out.read_text().splitlines()) == 3
        return time.perf_counter() - started

    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    _million_line_file(small, lines=3)
    _million_line_file(big)
    baseline = regenerate(small, tmp_path / "small.out.jsonl")
    seconds = regenerate(big, tmp_path / "big.out.jsonl")
    assert seconds - baseline < 8.0, (seconds, baseline)


def test_two_regenerations_on_one_out_one_refuses(tmp_path, capsys):
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [f"Tell me about {i}."]}) + "\n" for i in range(400)))
    argv = ["--threads", "1", "data", "regenerate", "--prompts", str(prompts), "--out", str(out)]
    argv += ["--max-tokens", "48", "--no-progress"]
    first = subprocess.Popen([sys.executable, "-m", "dspark", *argv], stderr=subprocess.PIPE, text=True)
    try:
        lock = tmp_path / "out.jsonl.lock"
        deadline = time.monotonic() + 120
        while not (lock.is_file() and lock.read_text().strip() == str(first.pid)):
            assert first.poll() is None and time.monotonic() < deadline, "the first run did not start"
            time.sleep(0.1)
        code, err = _run(capsys, *argv[2:])
        _one_line(code, err, "another regeneration", f"pid {first.pid}")
    finally:
        first.terminate()
        first.wait(timeout=60)
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()] if out.exists() else []
    assert len(ids) == len(set(ids))  # nothing answered twice
    assert os.path.exists(lock)
