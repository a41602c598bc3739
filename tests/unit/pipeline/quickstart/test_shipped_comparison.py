"""The quickstart's report beside the shipped drafters: the references found in a (tmp)
shipped folder, and the report's rows and estimate from an eval summary that has them."""

from __future__ import annotations

import json
import shutil

from dspark.formats.shipped import shipped_root
from dspark.formats.shipped_record import MEASURE, RECORD, ShippedCurve, ShippedRecord
from dspark.pipeline.presets import DOMAINS, METHODS, quickstart_plan
from dspark.pipeline.quickstart.references import shipped_references
from dspark.pipeline.quickstart.report import headline_lines, write_report
from dspark.pipeline.stages import StageLog

FAST = quickstart_plan(fast=True)

CURVE = ShippedCurve(
    measure=MEASURE, tokens_per_step=1000.0, steps=(100, 200, 400, 800), expected_tau=(1.5, 2.0, 2.5, 3.0)
)
WITH_CURVE = ShippedRecord(steps=800, epochs=4.0, training_tokens=800_000, val_expected_tau=3.0, curve=CURVE)
OLD = ShippedRecord(steps=300, epochs=0.3, training_tokens=300_000)  # a record from before curves


def test_references_come_from_the_given_shipped_folder(tmp_path):
    from dspark.presets.tiny import resolve_target
    from dspark.targets import TargetAdapter

    tiny = TargetAdapter.from_pretrained(resolve_target("tiny"))
    for method in ("dflash", "dspark"):
        shutil.copytree(shipped_root() / "tiny" / method, tmp_path / "tiny" / method)
    assert [(r.row, r.record) for r in shipped_references(tiny, tmp_path)] == [("dspark-shipped", None)]
    (tmp_path / "tiny" / RECORD).write_text(json.dumps({"dflash": WITH_CURVE.as_json()}))
    refs = shipped_references(tiny, tmp_path)
    assert [r.row for r in refs] == ["dflash-shipped", "dspark-shipped"]  # eagle3: no folder there
    assert refs[0].folder == tmp_path / "tiny" / "dflash" and refs[0].record == WITH_CURVE
    assert refs[1].record is None  # dspark is always a reference, compared only with a record
    assert shipped_references(tiny, tmp_path / "empty") == []


def _rows():
    taus = {"none": 1.0, "ngram": 1.2, "dspark-shipped": 3.4, "dflash-shipped": 2.8}
    taus |= {"dflash": 1.8, "dspark": 1.9, "eagle3": 2.0}
    return [
        {"drafter": d, "benchmark": dom, "domain": dom, "tau": t, "tokens_per_s": 100.0 * t,
         "speedup": t if d != "none" else None, "num_rounds": 10, "tokens": int(10 * t),
         "conditional_acceptance": [0.5]}
        for d, t in taus.items()
        for dom in DOMAINS
    ]  # fmt: skip


def _write(tmp_path, shipped):
    evaluated = {
        "rows": _rows(),
        "validation": {
            "samples": 6,
            "tokens": 900,
            "expected_tau": {
                "dflash": 1.9,
                "dspark": 3.6,
                "eagle3": 2.0,
                "dflash-shipped": 2.9,
                "dspark-shipped": 3.5,
            },
        },
        "train_tokens_per_step": 800.0,
        "shipped": shipped,
    }
    trained = {
        m: {"trainable_parameters": 1e6, "steps": 100, "samples": 24, "train_seconds": 5.0, "metrics": {}}
        for m in METHODS
    }
    calibration = {
        "temperatures": [1.0], "fit_rounds": 4, "report_rounds": 2, "report_set": "held-out",
        "mean_ece_before": 0.1, "mean_ece_after": 0.05, "improved": True, "kept": [True],
        "positions": [{"position": 1, "ece_before": 0.1, "ece_after": 0.05, "auc": 0.7}], "drafter": "d",
    }  # fmt: skip
    points = [
        {"policy": p, "concurrency": 1, "requests": 3, "throughput": 10.0, "per_user": 10.0, "tau": 2.0,
         "verify_budget": 3.0}
        for p in ("none", "prefix")
    ]  # fmt: skip
    data = {"prompts": 24, "completion_tokens": 100, "tokens_per_s": 50.0, "answers": "data/answers.jsonl"}
    report = write_report(
        tmp_path, FAST, data=data, trained=trained, calibration=calibration, evaluated=evaluated,
        serving={"points": points}, log=StageLog(), wall_seconds=1.0,
    )  # fmt: skip
    return report.read_text(), json.loads((tmp_path / "summary.json").read_text())


def test_report_puts_the_shipped_drafters_beside_the_trained_ones(tmp_path):
    shipped = {
        "dflash-shipped": {"method": "dflash", "record": WITH_CURVE.as_json()},
        "dspark-shipped": {"method": "dspark", "record": OLD.as_json()},
    }
    text, summary = _write(tmp_path, shipped)
    section = text.split("## Beside the shipped drafters")[1].split("\n## ")[0]
    dflash = next(line for line in section.splitlines() if line.startswith("| **dflash**"))
    # the curve scaled so it ends at 2.9 (the shipped drafter here): τ − 1 × 0.95 → 1.475, 1.95, 2.425, 2.9;
    # this run's 1.9 is first reached at step 100 + 100 × 0.425 / 0.475 ≈ 189.5, the goal at 800
    more = 800 - (100 + 100 * 0.425 / 0.475)
    assert f"≈ {more:,.0f} steps of the shipped run" in dflash
    assert f"≈ {more * 1000:,.0f} tokens" in dflash
    assert f"≈ {more * 1000 / 800:,.0f} of this run's steps" in dflash
    assert "800 steps, 4.0 epochs, 800,000 tokens" in dflash and "| 1.90 |" in dflash and "| 2.90 |" in dflash
    assert "100 steps, ≈ 80,000 tokens" in dflash
    dspark = next(line for line in section.splitlines() if line.startswith("| **dspark**"))
    assert "none: already at or above" in dspark  # 3.6 here against the shipped 3.5, and no curve needed
    assert "eagle3" not in section.split("Both drafters")[0]  # no shipped eagle3 record: no row
    assert "estimate read off another run's learning curve" in section and "expected τ" in section
    assert (tmp_path / "eval" / "shipped_curves.png").stat().st_size > 1000
    assert "eval/shipped_curves.png" in section
    entries = summary["headline"]["shipped_comparison"]
    assert [e["method"] for e in entries] == ["dflash", "dspark"]
    assert entries[0]["more_steps"] == round(more) and entries[1]["estimate"] == "already there"
    lines = headline_lines(summary)
    assert any(line.startswith("dflash vs shipped: expected τ 1.90 vs 2.90") for line in lines)
    assert summary["headline"]["best_trained"] == "eagle3"  # shipped rows are references, not trained


def test_a_record_without_a_curve_says_so(tmp_path):
    text, _ = _write(tmp_path, {"dflash-shipped": {"method": "dflash", "record": OLD.as_json()}})
    assert "no estimate: the shipped record has no learning curve" in text
    assert "300 steps, 0.3 epochs, 300,000 tokens" in text
    assert not (tmp_path / "eval" / "shipped_curves.png").exists()


def test_without_records_the_report_says_none_is_compared(tmp_path):
    text, summary = _write(tmp_path, {"dspark-shipped": {"method": "dspark", "record": None}})
    assert "No shipped drafter of this target has a `SHIPPED.json` record" in text
    assert summary["headline"]["shipped_comparison"] == []


def test_an_eval_summary_from_before_the_comparison_still_reports(tmp_path):
    text, _ = _write(tmp_path, None)
    assert "No shipped drafter of this target" in text
