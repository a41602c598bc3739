"""``dspark quickstart --fast`` end to end on the embedded tiny target, then a resumed rerun."""

from __future__ import annotations

import json

import pytest

from dspark.cli import main
from dspark.quickstart.pipeline import REFERENCES
from dspark.quickstart.plan import FAST, METHODS
from dspark.quickstart.stages import Stages

STAGES = ["regenerate", *(f"train-{m}" for m in METHODS), "calibrate", "eval", "serve"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("quickstart")
    assert main(["quickstart", "--fast", "--no-progress", "--out", str(out)]) == 0
    return out


def _stage(out, name):
    return json.loads(Stages(out).marker(name).read_text())["summary"]


def test_report_and_plots_are_written(run):
    report = (run / "report.md").read_text()
    for heading in (
        "## Training (equal budgets)",
        "## Acceptance length τ",
        "## Calibration",
        "## Serving sweep",
    ):
        assert heading in report
    for plot in (
        "eval/conditional_acceptance.png",
        "calibration/reliability.png",
        "serve/throughput_vs_per_user.png",
    ):
        assert (run / plot).stat().st_size > 1000
        assert plot in report


def test_figures_come_from_the_run(run):
    rows = _stage(run, "eval")["rows"]
    plain = {r["domain"]: r for r in rows if r["drafter"] == "none"}
    drafted = [r for r in rows if r["drafter"] != "none"]
    assert {r["drafter"] for r in drafted} == set(METHODS) | set(REFERENCES)
    for r in drafted:
        assert 1.0 <= r["tau"] <= FAST.block_size + 1
        assert r["tau"] == pytest.approx((r["tokens"]) / r["num_rounds"], rel=1e-6)
        # speedup = measured tokens/s over plain decoding's on the same prompts
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / plain[r["domain"]]["tokens_per_s"], rel=1e-6)
    summary = json.loads((run / "summary.json").read_text())
    for m in METHODS:
        assert summary["eval_means"][m]["tau"] == pytest.approx(
            sum(r["tau"] for r in drafted if r["drafter"] == m) / 3
        )
    points = _stage(run, "serve")["points"]
    assert {(p["policy"], p["concurrency"]) for p in points} == {
        (p, c) for p in FAST.serve_policies for c in FAST.serve_concurrency
    }
    for p in points:
        assert p["throughput"] == pytest.approx(p["tokens"] / p["seconds"], rel=1e-2)
    assert f"{summary['eval_means']['dspark']['tau']:.2f}" in (run / "report.md").read_text()


def test_drafters_were_trained_with_equal_budgets_and_dspark_calibrated(run):
    trained = [_stage(run, f"train-{m}") for m in METHODS]
    assert {t["steps"] for t in trained} == {FAST.train_steps}
    assert len({t["samples"] for t in trained}) == 1
    config = json.loads((run / "drafters" / "dspark-sts" / "config.json").read_text())
    calibration = _stage(run, "calibrate")
    if calibration["improved"]:
        assert config["sts_temperatures"] == calibration["temperatures"]
    else:  # no temperature lowered held-out ECE: none written, and the report says so
        assert config.get("sts_temperatures") is None
        assert "Calibration did not improve held-out ECE" in (run / "report.md").read_text()
    assert "sts_temperatures" not in json.loads(
        (run / "drafters" / "dspark" / "config.json").read_text()
    ) or (json.loads((run / "drafters" / "dspark" / "config.json").read_text())["sts_temperatures"] is None)


def test_report_records_threads_dtype_and_load(run):
    import torch

    summary = json.loads((run / "summary.json").read_text())
    conditions = summary["conditions"]
    assert conditions["threads"] == torch.get_num_threads() and conditions["dtype"] == "float32"
    assert conditions["device"] == "cpu" and conditions["cpus"] >= 1
    assert conditions["load_start"] is not None and conditions["load_end"] is not None
    assert set(summary["stage_loads"]) == set(STAGES)
    report = (run / "report.md").read_text()
    line = next(x for x in report.splitlines() if x.startswith("Run conditions:"))
    threads = conditions["threads"]
    assert f"{threads} thread{'s' if threads != 1 else ''}, float32 on cpu" in line
    assert f"load average {conditions['load_start']:.2f} → {conditions['load_end']:.2f}" in line
    # The report warns for the whole run, or else for the stages that ran while it was busy.
    from dspark.conditions import machine_busy

    busy_stage = any(
        a is not None and machine_busy(conditions["cpus"], threads, a, b)
        for a, b in summary["stage_loads"].values()
    )
    assert ("> **Warning:** the machine was busy" in report) == (conditions["busy"] or busy_stage)
    assert "**Two plain-decoding speeds.**" in report


def test_rerun_resumes_every_stage_and_prints_the_headline(run, capsys):
    assert main(["quickstart", "--fast", "--no-progress", "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed"] == STAGES
    out = capsys.readouterr()
    assert "skipped" in out.err
    shipped = summary["headline"]["shipped_math_tau"]
    assert f"shipped DSpark on math: τ {shipped:.2f}" in out.out
    assert out.out.rstrip().splitlines()[-1] == f"report: {run / 'report.md'}"
