"""``dspark quickstart --fast`` end to end on the embedded tiny target, then a resumed rerun.

The run compares with shipped drafters from a tmp folder (``--shipped``): copies of the
package's DFlash and DSpark, with a SHIPPED.json that records DFlash with a hand-made
learning curve and DSpark without one.
"""

from __future__ import annotations

import json
import shutil

import pytest

from dspark.cli import main
from dspark.formats.shipped import shipped_root
from dspark.formats.shipped_record import MEASURE, RECORD, ShippedCurve, ShippedRecord
from dspark.pipeline.presets import METHODS, quickstart_plan
from dspark.pipeline.quickstart.pipeline import REFERENCES
from dspark.pipeline.stages import Stages

FAST = quickstart_plan(fast=True)

STAGES = ["regenerate", *(f"train-{m}" for m in METHODS), "calibrate", "validation", "eval", "serve"]
CURVE = ShippedCurve(
    measure=MEASURE, tokens_per_step=1000.0, steps=(100, 1000, 4000), expected_tau=(1.01, 2.0, 3.0)
)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    root = tmp_path_factory.mktemp("shipped")
    for method in ("dflash", "dspark"):
        shutil.copytree(shipped_root() / "tiny" / method, root / "tiny" / method)
    records = {
        "dflash": ShippedRecord(steps=4000, epochs=4.0, training_tokens=4_000_000, curve=CURVE).as_json(),
        "dspark": ShippedRecord(steps=300, epochs=0.3, training_tokens=300_000).as_json(),
    }
    (root / "tiny" / RECORD).write_text(json.dumps(records))
    return root


@pytest.fixture(scope="module")
def run(tmp_path_factory, shipped):
    out = tmp_path_factory.mktemp("quickstart")
    assert main(["quickstart", "--fast", "--no-progress", "--out", str(out), "--shipped", str(shipped)]) == 0
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
    assert {r["drafter"] for r in drafted} == set(METHODS) | set(REFERENCES) | {"dflash-shipped"}
    for r in drafted:
        assert 1.0 <= r["tau"] <= FAST.block_size + 1
        # τ = mean(accepted + 1) over rounds; an answer's last round may be cut at EOS or
        # max_tokens (≤ γ tokens lost, one round per single-turn answer), so tokens ≤ τ · rounds
        drafted_tokens = r["tau"] * r["num_rounds"]
        assert drafted_tokens - FAST.block_size * FAST.eval_prompts <= r["tokens"] <= drafted_tokens + 1e-6
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


def test_the_shipped_drafters_are_compared_on_the_same_validation_set(run):
    evaluated = _stage(run, "eval")
    val = evaluated["validation"]
    assert val["samples"] == 3 * FAST.val_prompts and val["tokens"] > 0
    names = {*METHODS, "dflash-shipped", "dspark-shipped"}
    assert set(val["expected_tau"]) == names
    for tau in val["expected_tau"].values():
        assert 1.0 <= tau <= FAST.block_size + 1
    # the trained DFlash and the shipped one differ (other weights), so their expected τ do too
    assert val["expected_tau"]["dflash"] != val["expected_tau"]["dflash-shipped"]
    report = (run / "report.md").read_text()
    section = report.split("## Beside the shipped drafters")[1].split("\n## ")[0]
    dflash = next(line for line in section.splitlines() if line.startswith("| **dflash**"))
    assert "4,000 steps, 4.0 epochs, 4.00 M tokens" in dflash
    assert f"| {val['expected_tau']['dflash']:.2f} |" in dflash
    assert f"| {val['expected_tau']['dflash-shipped']:.2f} |" in dflash
    assert "of the shipped run" in dflash or "already at or above" in dflash
    dspark = next(line for line in section.splitlines() if line.startswith("| **dspark**"))
    assert "no learning curve" in dspark or "already at or above" in dspark
    assert (run / "eval" / "shipped_curves.png").stat().st_size > 1000


def test_a_missing_shipped_folder_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["quickstart", "--fast", "--out", str(tmp_path), "--shipped", str(tmp_path / "nope")])
    assert e.value.code == 2
    assert "dspark: error: --shipped" in capsys.readouterr().err


def test_rerun_resumes_every_stage_and_prints_the_headline(run, shipped, capsys):
    assert main(["quickstart", "--fast", "--no-progress", "--out", str(run), "--shipped", str(shipped)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed"] == STAGES
    out = capsys.readouterr()
    assert "skipped" in out.err
    shipped_tau = summary["headline"]["shipped_math_tau"]
    assert f"shipped DSpark on math: τ {shipped_tau:.2f}" in out.out
    assert "dflash vs shipped: expected τ" in out.out
    assert out.out.rstrip().splitlines()[-1] == f"report: {run / 'report.md'}"
