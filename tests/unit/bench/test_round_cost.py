"""``dspark bench round``: the batch-1 round split into its parts, per dtype (issue 17)."""

from __future__ import annotations

import json

import pytest

from dspark.cli import main

ARGS = ["bench", "round", "--limit", "1", "--max-tokens", "6", "--repeats", "2", "--json"]


def test_every_part_is_timed_in_each_dtype(capsys):
    assert main([*ARGS, "--dtypes", "float32,bfloat16"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["rows"]
    assert [r["dtype"] for r in rows] == ["float32", "bfloat16"]
    parts = ("decode_step_s", "verify_s", "sampling_s", "backbone_s", "loop_s", "loop_before_s", "propose_s")
    for r in rows:
        assert all(r[p] > 0 for p in parts), r
        assert r["engine_steps"] > 0 and r["engine_forward_s"] > 0 and r["engine_draft_s"] > 0
        assert r["engine_update_s"] >= 0 and r["engine_bookkeeping_s"] > 0
        assert r["loop_speedup"] == pytest.approx(r["loop_before_s"] / r["loop_s"], rel=1e-2)
    assert out["conditions"]["dtype"] == "float32"


def test_a_bad_dtype_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*ARGS, "--dtypes", "float16"])
    assert exit_info.value.code == 2
    assert "dspark: error: --dtypes takes float32, bfloat16" in capsys.readouterr().err
