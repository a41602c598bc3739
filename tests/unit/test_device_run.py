"""The prepared device run (issue 36): transfers planned to fit a call, files split and joined
with their digests, sections in priority order that wait for their needs and resume across
calls and sessions. tests/integration/test_device_run_dry.py runs the whole chain."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVICE = ROOT / "scripts" / "device"
sys.path.insert(0, str(DEVICE))

import collect  # noqa: E402
import payload  # noqa: E402
import plan  # noqa: E402
import run  # noqa: E402

MB = 10**6


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_section_past_its_limit_is_killed_and_recorded_as_timeout(tmp_path):
    sleepy = tmp_path / "sleepy"
    sleepy.write_text("#!/bin/sh\nsleep 30\n")
    sleepy.chmod(0o755)
    assert run.run_process([str(sleepy)], 1.0, dict(os.environ))["status"] == "timeout"
    ok = run.run_process([sys.executable, "-c", "print('{\"a\": 1}')"], 30.0, dict(os.environ))
    assert ok == {"status": "ok", "result": {"a": 1}}


def test_the_gguf_crosses_in_two_calls_with_a_sparse_tree(tmp_path):
    """Today's sizes: the GGUF 98.4 MB; the tree 37.7 MB, of which the sparse checkout leaves
    behind 21 MB tiny target, 11 MB drafters' weights and 2.6 MB docs; the first call also
    carries two wheels (13 MB) and earlier results (~3 MB)."""
    gguf, tree, extra = 98_362_432, int(37.7 * MB), 16 * MB
    sparse_tree = tree - 21 * MB - 11 * MB - int(2.6 * MB)
    sparse = plan.plan_calls(gguf_bytes=gguf, tree=sparse_tree, first_extra=extra)
    assert len(sparse) == 2 and sum(sparse) == gguf
    assert sparse[0] + sparse_tree + extra <= plan.CALL_LIMIT - plan.MARGIN
    assert len(plan.plan_calls(gguf_bytes=gguf, tree=tree, first_extra=extra)) == 5  # --no-sparse
    with pytest.raises(SystemExit, match="too big"):
        plan.plan_calls(gguf_bytes=gguf, tree=63 * 2**20, first_extra=0)
    assert plan.needs_gguf(tmp_path)  # no earlier results: SmolLM2's sections are to do
    done = {"sections": {"smollm2_campaign": {"status": "ok"}, "speed": {"status": "ok"}}}
    (tmp_path / "results.json").write_text(json.dumps(done))
    assert not plan.needs_gguf(tmp_path)  # then the tiny target travels instead


def test_split_join_checks_every_piece_and_the_whole(tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(10_000))
    split = payload.split_file(src, payload.split_sizes(10_000, [4_000, 4_000, 4_000]), tmp_path / "p")
    assert [p.size for p in split.pieces] == [4_000, 4_000, 2_000]
    assert payload.Split.from_json(json.loads(json.dumps(split.as_json()))) == split
    joined = payload.join_file(split, tmp_path / "p", tmp_path / "out.bin")
    assert joined.read_bytes() == src.read_bytes()
    (tmp_path / "p" / split.pieces[1].name).write_bytes(b"x" * 4_000)  # same size, other bytes
    with pytest.raises(ValueError, match="part-01 has the wrong sha256"):
        payload.join_file(split, tmp_path / "p", tmp_path / "out2.bin")
    (tmp_path / "p" / split.pieces[2].name).unlink()
    assert payload.missing_pieces(split, tmp_path / "p") == [split.pieces[2].name]
    with pytest.raises(ValueError, match="do not fit"):
        payload.split_sizes(10, [4, 4])


def test_sections_run_by_priority_wait_for_their_needs_and_are_not_run_twice():
    clock, calls, published = FakeClock(), [], []

    def runner(name: str, limit: float) -> dict:
        calls.append((name, limit))
        clock.now += 100
        if name == "smollm2_campaign":  # ran out of time: its finished stages are kept
            return {"status": "ok", "result": {"done": False}}
        return {"status": "ok"} if name != "speed" else {"status": "timeout"}

    state = {"sections": {"env": {"status": "ok"}}}  # from an earlier call
    names = list(run.CAPS)
    blocked = {"smollm2_campaign": "the GGUF is not joined yet"}
    run.run_sections(
        names, state, 250, runner, dry_run=False, blocked=blocked.get, publish=published.append, clock=clock
    )
    # env done, the campaign waits; with 50 s left the last two (least 60 s) wait too
    assert [c[0] for c in calls] == ["cuda_tests", "speed"]
    assert [c[1] for c in calls] == [run.CAPS["cuda_tests"][1], run.CAPS["speed"][1]]
    sections = state["sections"]
    assert sections["smollm2_campaign"] == {"status": "pending", "waiting": "the GGUF is not joined yet"}
    assert sections["tiny_sweeps"]["waiting"] == "time budget spent"  # 50 s left: its turn was gone
    assert sections["train_shapes"]["waiting"] == "time budget spent"
    assert len(published) == 2  # after every section run
    calls.clear()
    run.run_sections(names, state, 1000, runner, dry_run=False, redo={"env"}, clock=clock)
    assert [c[0] for c in calls] == ["env", "smollm2_campaign", "speed", "tiny_sweeps", "train_shapes"]
    assert sections["smollm2_campaign"]["status"] == "partial"  # not ok: the next call goes on


def test_collected_results_keep_an_ok_record_over_a_later_worse_one():
    old = {"sections": {"a": {"status": "ok", "n": 1}, "b": {"status": "timeout"}}, "calls": [1]}
    new = {"sections": {"a": {"status": "error"}, "b": {"status": "ok", "n": 2}}, "calls": [1, 2]}
    merged = collect.merge_results(old, new)
    assert merged["sections"] == {"a": {"status": "ok", "n": 1}, "b": {"status": "ok", "n": 2}}
    assert merged["calls"] == [1, 2]
