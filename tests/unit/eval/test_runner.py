"""Benchmark loading (caps, domains, bad lines), macro averages and drafter labels of ``dspark eval``."""

from __future__ import annotations

import json
import logging

import pytest

from dspark.commands.loading import parse_drafter_specs
from dspark.errors import DsparkError
from dspark.eval.benchmarks import load_benchmark
from dspark.eval.runner import EvalRow, domain_rows


def _write(path, n, bad_at=()):
    with open(path, "w") as f:
        for i in range(n):
            f.write("{oops\n" if i in bad_at else json.dumps({"turns": [f"question {i}"]}) + "\n")
    return path


def test_known_benchmarks_get_deepspec_caps_and_the_paper_domain(tmp_path):
    bench = load_benchmark(str(_write(tmp_path / "aime25.jsonl", 40)))
    assert bench.name == "aime25" and bench.domain == "math" and len(bench.prompts) == 30  # DeepSpec cap
    assert len(load_benchmark(str(tmp_path / "aime25.jsonl"), limit=5).prompts) == 5
    other = load_benchmark(str(_write(tmp_path / "mine.jsonl", 3)))
    assert other.domain == "mine" and len(other.prompts) == 3  # no cap, the set's own tag


def test_bad_line_is_named_and_stops_or_is_skipped(tmp_path, caplog):
    path = _write(tmp_path / "b.jsonl", 4, bad_at={2})
    with pytest.raises(DsparkError, match=r"b\.jsonl:3: not valid JSON"):
        load_benchmark(str(path))
    with caplog.at_level(logging.WARNING):
        bench = load_benchmark(str(path), on_bad_line="skip", limit=3)
    assert [p.turns[0] for p in bench.prompts] == ["question 0", "question 1", "question 3"]
    assert "b.jsonl:3" in caplog.text


def _row(drafter, bench, domain, tau, cond, speedup):
    return EvalRow(
        drafter, bench, domain, 1, len(cond), tau, 10, 10, 1.0, 10.0, speedup, [0] * (len(cond) + 1),
        cond, cond, 0.5, 1.0,
    )  # fmt: skip


def test_domain_rows_are_macro_averages():
    rows = [
        _row("d", "gsm8k", "math", 5.0, [0.9, None], 2.0),
        _row("d", "aime25", "math", 3.0, [0.7, 0.5], None),
        _row("d", "mt-bench", "chat", 2.0, [0.6, 0.4], 1.5),
    ]
    math_row, chat_row = domain_rows(rows)
    assert (math_row.domain, math_row.benchmarks) == ("math", ["gsm8k", "aime25"])
    assert math_row.tau == pytest.approx(4.0)  # each benchmark weighs the same
    assert math_row.conditional_acceptance == pytest.approx([0.8, 0.5])
    assert math_row.speedup == pytest.approx(2.0) and chat_row.tau == 2.0


def test_drafter_labels():
    assert parse_drafter_specs("dspark, eagle3") == {"dspark": "dspark", "eagle3": "eagle3"}
    assert parse_drafter_specs("runs/a/drafter,x=runs/b/drafter,/p/my_drafter") == {
        "a": "runs/a/drafter",
        "x": "runs/b/drafter",
        "my_drafter": "/p/my_drafter",
    }
    with pytest.raises(DsparkError, match="labelled"):
        parse_drafter_specs("runs/a/drafter,other/a/drafter")
