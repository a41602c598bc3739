"""``dspark generate`` streams through the server's TextStream: what it prints is the answer,
cut before a stop string, never the stop string itself."""

from __future__ import annotations

import json

import pytest

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


def _nan_drafter(monkeypatch):
    """``--drafter eagle3`` becomes an Eagle3 with NaN embeddings: every draft is non-finite, and the
    engine fails the request (finish_reason "error") instead of sampling from it."""
    import torch

    from dspark.commands import generate
    from dspark.drafters.eagle3 import Eagle3Config
    from dspark.drafters.kinds import KINDS

    def build(spec, target):
        torch.manual_seed(0)
        drafter = KINDS["eagle3"].drafter_cls.from_target(target, Eagle3Config(block_size=4))
        with torch.no_grad():
            drafter.embed_tokens.weight.fill_(float("nan"))
        return drafter

    monkeypatch.setattr(generate, "build_drafter", build)


SAMPLED = ["--drafter", "eagle3", "--no-payoff-control", "--no-proposer-choice", "--temperature", "1"]


@pytest.mark.parametrize("json_out", [False, True])
def test_a_failed_request_exits_non_zero(capsys, monkeypatch, json_out):
    _nan_drafter(monkeypatch)
    argv = ["--threads", "1", "generate", "--prompt", PROMPT, "--max-tokens", "8", *SAMPLED]
    code = main(argv + (["--json"] if json_out else []))
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    assert err.rstrip().splitlines()[-1].startswith("dspark: error: the request failed: the drafter")
    if json_out:
        record = json.loads(out)
        assert record["finish_reason"] == "error" and "non-finite" in record["error"]


def test_a_request_that_succeeds_exits_zero(capsys):
    """Negative control: the same sampled request with a sound drafter."""
    argv = ["--threads", "1", "generate", "--prompt", PROMPT, "--max-tokens", "8", "--json", *SAMPLED]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["finish_reason"] in ("stop", "length") and "error" not in record
