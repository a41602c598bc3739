"""Resumable quickstart stages: skip when finished with the same key, start over with another."""

from __future__ import annotations

import json

import pytest

from dspark.pipeline.presets import quickstart_plan
from dspark.pipeline.stages import Stages


def _stages(tmp_path):
    return Stages(tmp_path, announce=lambda line: None)


def test_finished_stage_is_skipped_with_the_same_key(tmp_path):
    calls = []
    stages = _stages(tmp_path)
    assert stages.run("a", {"n": 1}, lambda: calls.append(1) or {"x": 1}) == {"x": 1}
    again = _stages(tmp_path)
    assert again.run("a", {"n": 1}, lambda: calls.append(2) or {"x": 2}) == {"x": 1}
    assert calls == [1]
    assert again.log.resumed == ["a"] and again.log.ran == []


def test_another_key_reruns_and_clears_the_outputs(tmp_path):
    out = tmp_path / "data.jsonl"
    stages = _stages(tmp_path)
    stages.run("a", {"n": 1}, lambda: out.write_text("old\n") and {"x": 1}, outputs=(out,))

    def rerun():
        assert not out.exists()  # the other plan's output is gone before the stage runs
        out.write_text("new\n")
        return {"x": 2}

    assert _stages(tmp_path).run("a", {"n": 2}, rerun, outputs=(out,)) == {"x": 2}
    assert out.read_text() == "new\n"


def test_an_interrupted_stage_keeps_its_partial_outputs_for_the_same_key(tmp_path):
    out = tmp_path / "partial"
    out.mkdir()

    def crash():
        (out / "part-1").write_text("done")
        raise KeyboardInterrupt

    stages = _stages(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        stages.run("train", {"steps": 3}, crash, outputs=(out,))
    assert not stages.marker("train").exists()  # not finished
    seen = []
    _stages(tmp_path).run(
        "train", {"steps": 3}, lambda: seen.append(sorted(p.name for p in out.iterdir())) or {}
    )
    assert seen == [["part-1"]]  # resumed from what the interrupted run left


def test_a_corrupt_marker_means_not_done(tmp_path):
    stages = _stages(tmp_path)
    stages.run("a", {"n": 1}, lambda: {"x": 1})
    stages.marker("a").write_text("{not json")
    assert _stages(tmp_path).run("a", {"n": 1}, lambda: {"x": 3}) == {"x": 3}
    assert json.loads(stages.marker("a").read_text())["summary"] == {"x": 3}


def test_plans_differ_in_every_stage_key():
    for fields in (("train_prompts",), ("train_steps", "batch_size"), ("eval_prompts",), ("serve_policies",)):
        assert quickstart_plan(fast=True).part(*fields) != quickstart_plan(fast=False).part(*fields)
    full = quickstart_plan(fast=False)
    assert full.part("serve_policies") == {"serve_policies": list(full.serve_policies)}


def _slow_stage(root, started, release):
    """Run stage "a" in another process; it signals once inside and waits for ``release``."""

    def fn():
        started.set()
        release.wait(30)
        return {"by": "first"}

    Stages(root, announce=lambda line: None).run("a", {"n": 1}, fn)


def test_a_second_process_waits_for_a_running_stage_and_then_skips_it(tmp_path):
    import multiprocessing
    import threading

    ctx = multiprocessing.get_context("fork")
    started, release = ctx.Event(), ctx.Event()
    first = ctx.Process(target=_slow_stage, args=(tmp_path, started, release))
    first.start()
    assert started.wait(30)
    lines, calls, result = [], [], {}

    def second():
        stages = Stages(tmp_path, announce=lines.append)
        result["summary"] = stages.run("a", {"n": 1}, lambda: calls.append(1) or {"by": "second"})

    waiter = threading.Thread(target=second)
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive()  # blocked on the lock while the first process runs the stage
    assert any("another process" in line for line in lines)
    release.set()
    first.join(30)
    waiter.join(30)
    assert first.exitcode == 0
    assert result["summary"] == {"by": "first"} and calls == []  # found done, not run twice


def test_running_with_sees_another_process_running_the_same_stage(tmp_path):
    seen = []
    stages, other = _stages(tmp_path), _stages(tmp_path)
    assert not other.running_with("a", {"n": 1})  # never started
    stages.run("a", {"n": 1}, lambda: seen.append(
        (other.running_with("a", {"n": 1}), other.running_with("a", {"n": 2}))
    ) or {})  # fmt: skip
    assert seen == [(True, False)]  # running, and only with the key it was started with
    assert not other.running_with("a", {"n": 1})  # finished: nobody holds it


def test_running_with_waits_for_the_holders_started_marker(tmp_path):
    """The holder takes the lock a moment before it writes its marker: a process looking in
    between still sees the stage running (the race that once left a helper only waiting)."""
    import threading
    import time

    stages = _stages(tmp_path)
    seen = []
    with stages._lock("a"):
        looking = threading.Thread(target=lambda: seen.append(_stages(tmp_path).running_with("a", {"n": 1})))
        looking.start()
        time.sleep(0.5)  # the marker comes after the lock
        stages.marker("a").with_suffix(".started.json").write_text(json.dumps({"n": 1}))
        looking.join(timeout=10)
    assert seen == [True]
    with stages._lock("a"):  # held under another key: not for this one, once the wait is over
        assert not _stages(tmp_path).running_with("a", {"n": 2}, settle_s=0.3)


def test_a_shared_stage_helps_a_holder_that_took_the_lock_after_the_first_look(tmp_path):
    """The race that left a campaign process waiting beside the feature cache: the other
    process took the stage's lock just after this one looked. It still helps, then finds
    the stage done."""
    import threading

    holder, helper = _stages(tmp_path), _stages(tmp_path)
    finish, started = threading.Event(), threading.Event()

    def hold():
        def work():
            started.set()
            finish.wait(timeout=30)
            return {"by": "holder"}

        holder.run("a", {"n": 1}, work)

    first_look = helper.running_with
    looks = []

    def running_with(name, key, **kw):
        if not looks:  # the first look: nobody holds it yet; the holder takes it right after
            looks.append("first")
            thread.start()
            started.wait(timeout=30)
            return False
        looks.append("again")
        return first_look(name, key, **kw)

    thread = threading.Thread(target=hold)
    helper.running_with = running_with
    helped = []
    summary = helper.run_shared(
        "a", {"n": 1}, lambda: {"by": "helper"}, lambda: helped.append(1) or finish.set(), "helping"
    )
    thread.join(timeout=30)
    assert looks == ["first", "again"] and helped == [1]
    assert summary == {"by": "holder"}  # done by the holder, not run again
