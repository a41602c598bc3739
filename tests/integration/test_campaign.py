"""``dspark campaign`` end to end on a sliver of the tiny target's prompts, then a resumed rerun.

Every stage runs for real (in-process regeneration, the feature cache, the three trainings
on cached features with the plateau stop rule, the evaluation); the rerun must skip them all.
"""

from __future__ import annotations

import json

import pytest

from dspark.campaign.plan import METHODS
from dspark.cli import main
from dspark.quickstart.stages import Stages

ARGS = ["--prompts", "8", "--epochs", "2", "--eval-prompts", "1", "--eval-max-tokens", "16", "--no-progress"]
STAGES = ["regenerate", "cache", *(f"train-{m}" for m in METHODS), "eval"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("campaign")
    assert main(["--threads", "1", "campaign", "--out", str(out), *ARGS]) == 0
    return out


def test_every_stage_ran_and_the_drafters_trained_on_cached_features(run):
    summary = json.loads((run / "summary.json").read_text())
    assert summary["data"]["prompts"] == 8 and summary["cache"]["samples"] == 8 - summary["data"]["failed"]
    for method in METHODS:
        trained = summary["trained"][method]
        assert trained["steps"] == trained["max_steps"] == 2  # 2 epochs of 8 samples at batch 8
        assert trained["epochs"] == pytest.approx(2.0)
        assert 1.0 <= trained["expected_tau"] <= 8.0
        assert (run / trained["drafter"] / "model.safetensors").is_file()
    rows = {(r["drafter"], r["benchmark"]) for r in summary["eval"]["rows"]}
    assert {m for m, _ in rows} >= {*METHODS, "ngram"}
    assert (run / "eval" / "report.md").is_file()


def test_rerun_skips_every_stage(run, capsys):
    assert main(["--threads", "1", "campaign", "--out", str(run), *ARGS]) == 0
    err = capsys.readouterr().err
    for stage in STAGES:
        assert f"· {stage}: done in an earlier run" in err, stage
    assert all(Stages(run).marker(s).is_file() for s in STAGES)


def test_status_and_learning_curves(run, capsys):
    summary = json.loads((run / "summary.json").read_text())
    assert (
        summary["learning_curves"] == "learning_curves.png"
        and (run / "learning_curves.png").stat().st_size > 0
    )
    assert main(["campaign", "--out", str(run), "--status"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert set(STAGES) <= set(status["stages_done"])
    for method in METHODS:
        assert status["training"][method]["step"] == 2 and status["training"][method]["finished"]
        assert status["training"][method]["latest_checkpoint"]
