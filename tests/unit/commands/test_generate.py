"""``dspark generate`` streams through the server's TextStream: what it prints is the answer,
cut before a stop string, never the stop string itself."""

from __future__ import annotations

import json

from dspark.cli import main

PROMPT = "Write a function that adds two numbers."


def _generate(capsys, *extra: str) -> str:
    assert main(["generate", "--prompt", PROMPT, "--max-tokens", "40", "--drafter", "none", *extra]) == 0
    return capsys.readouterr().out


def test_stop_string_is_not_printed(capsys):
    full = json.loads(_generate(capsys, "--json"))["text"]
    assert len(full) > 20
    stop = full[len(full) // 2 : len(full) // 2 + 3]  # a piece from the middle of the greedy answer
    assert stop.strip(), full
    before = full[: full.index(stop)]

    streamed = _generate(capsys, "--stop", stop)
    assert streamed == before + "\n"
    assert stop not in streamed
    assert json.loads(_generate(capsys, "--json", "--stop", stop))["text"] == before


def test_streamed_text_is_the_json_text(capsys):
    full = json.loads(_generate(capsys, "--json"))["text"]
    assert _generate(capsys) == full + "\n"
