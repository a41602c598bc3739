"""Prompts longer than the target's context are skipped and counted, or refused with --strict."""

from __future__ import annotations

import json
import logging

import pytest

from dspark.drafters.ngram import NgramDrafter
from dspark.errors import DsparkError
from dspark.eval.benchmarks import load_benchmark
from dspark.eval.runner import EvalConfig, run_eval


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from dspark.targets import TargetAdapter
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    return TargetAdapter.from_pretrained(
        build_tiny_chat_target(tmp_path_factory.mktemp("t"), max_position=96)
    )


def _bench(tmp_path, turns):
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in turns))
    return load_benchmark(str(path))


def test_too_long_prompts_are_skipped_and_counted(target, tmp_path, caplog):
    bench = _bench(tmp_path, ["short one", "word " * 200, "short two"])
    config = EvalConfig(temperature=0.0, max_tokens=4, baseline=False, progress=False)
    with caplog.at_level(logging.WARNING):
        result = run_eval(target, {"ngram": NgramDrafter(target.vocab_size)}, [bench], config)
    assert result.skipped == {"mine": 1}
    assert result.row("ngram", "mine").num_prompts == 2
    assert "skipped 1 of 3 prompts" in caplog.text


def test_strict_makes_a_too_long_prompt_an_error(target, tmp_path):
    bench = _bench(tmp_path, ["short one", "word " * 200])
    config = EvalConfig(temperature=0.0, max_tokens=4, baseline=False, progress=False, strict=True)
    with pytest.raises(DsparkError, match=r"mine\.jsonl:2: the prompt has \d+ tokens"):
        run_eval(target, {"ngram": NgramDrafter(target.vocab_size)}, [bench], config)
