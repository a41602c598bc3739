"""The prepared GPU check's CPU-side logic (issue 14): arguments, the time budget, fail-soft
sections, the JSON it writes, and a real dry run of two sections on the CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def test_arguments_default_to_every_section_and_out(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    ns = gpu_check.parse_args([])
    assert ns.sections == list(gpu_check.CAPS) and ns.out == tmp_path / "gpu_check.json"
    assert ns.budget_s <= 480  # the check must fit 8 minutes with start-up


@pytest.mark.parametrize("argv", [["--sections", "env,nope"], ["--sections", ","], ["--budget-s", "0"]])
def test_bad_arguments_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_check.parse_args(argv)
    assert e.value.code == 2 and "gpu_check: error:" in capsys.readouterr().err


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_sections_share_the_budget_fail_soft_and_are_all_recorded():
    clock, calls, written = FakeClock(), [], []

    def runner(name: str, limit: float) -> dict:
        calls.append((name, limit))
        clock.now += {"env": 5, "gpu_tests": 100, "train_qwen3_4b": 75}.get(name, 0)
        if name == "gpu_tests":
            raise RuntimeError("boom")
        if name == "train_qwen3_4b":
            return {"status": "timeout"}
        return {"status": "ok", "result": {"x": 1}}

    names = ["env", "gpu_tests", "train_qwen3_4b", "train_qwen3_8b", "campaign"]
    report = gpu_check.run_sections(
        names, 185.0, runner, dry_run=False, write=lambda r: written.append(json.dumps(r)), clock=clock
    )
    sections = report["sections"]
    assert list(sections) == names  # every section has a record, in order
    assert [c[0] for c in calls] == ["env", "gpu_tests", "train_qwen3_4b"]
    assert calls[0][1] == gpu_check.CAPS["env"]  # its own cap while the budget is ample
    assert calls[2][1] == 80  # min(its cap 90, the 80 s left)
    assert sections["gpu_tests"]["status"] == "error" and "boom" in sections["gpu_tests"]["stderr"]
    assert sections["train_qwen3_4b"]["status"] == "timeout"
    for name in ("train_qwen3_8b", "campaign"):  # 5 s left: under MIN_START_S, not started
        assert sections[name] == {"status": "skipped", "reason": "time budget spent"}
    assert sections["env"]["seconds"] == 5 and sections["env"]["result"] == {"x": 1}
    assert len(written) == len(calls) + 1  # the JSON is rewritten after every section run
    clock.now = 0.0
    report = gpu_check.run_sections(["env", "campaign"], 9.0, runner, dry_run=False, clock=clock)
    assert report["sections"]["env"] == {"status": "skipped", "reason": "time budget spent"}


def test_a_section_past_its_limit_is_killed_and_recorded_as_timeout(tmp_path, monkeypatch):
    ns = gpu_check.parse_args(["--dry-run", "--out", str(tmp_path / "x.json")])
    monkeypatch.setattr(gpu_check.sys, "executable", _sleeper(tmp_path))
    record = gpu_check.run_child(ns)("env", 1.0)
    assert record["status"] == "timeout"


def _sleeper(tmp_path: Path) -> str:
    """An 'interpreter' that sleeps longer than any limit given in these tests."""
    path = tmp_path / "sleepy"
    path.write_text("#!/bin/sh\nsleep 30\n")
    path.chmod(0o755)
    return str(path)


def test_dry_run_on_the_cpu_writes_one_json_with_every_requested_section(tmp_path):
    out = tmp_path / "check.json"
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(SCRIPT.parents[1] / "src")}
    cmd = [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--budget-s", "240"]
    cmd += ["--sections", "env,train_qwen3_8b,sps_qwen3_8b,campaign"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert report["dry_run"] is True
    sections = report["sections"]
    assert list(sections) == ["env", "train_qwen3_8b", "sps_qwen3_8b", "campaign"]
    assert all(s["status"] == "ok" for s in sections.values()), sections
    rows = sections["train_qwen3_8b"]["result"]["rows"]
    assert [(r["activation_checkpointing"], r["attention"]) for r in rows] == [
        (False, "auto"),
        (True, "auto"),
        (False, "packed"),
    ]
    assert all(r["tokens_per_s"] > 0 and "error" not in r for r in rows)
    assert sections["sps_qwen3_8b"]["result"]["sps"]  # an SPS table, however small
    assert sections["campaign"]["result"] == {"skipped": "dry run"}
