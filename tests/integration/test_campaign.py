"""``dspark campaign`` end to end on a sliver of the tiny target's prompts, then a resumed rerun.

Every stage runs for real (in-process regeneration, the feature cache, the three trainings
on cached features with the plateau stop rule, the evaluation); the rerun must skip them all.
"""

from __future__ import annotations

import json

import pytest

from dspark.cli import main
from dspark.pipeline.presets import METHODS
from dspark.pipeline.stages import Stages

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
    assert set(STAGES) <= set(status["stages_done"]) and status["in_progress"] == {}
    for method in METHODS:
        assert status["training"][method]["step"] == 2 and status["training"][method]["finished"]
        assert status["training"][method]["latest_checkpoint"]


def test_depth_sweep_reuses_the_campaign_dspark_trains_the_others_and_resumes(run, capsys):
    """Fig. 3 at the campaign's budget: DSpark 2L is the campaign's own drafter, the rest train."""
    sweep = ["--sweeps", "depth"]
    assert main(["--threads", "1", "campaign", "--out", str(run), *ARGS, *sweep]) == 0
    capsys.readouterr()
    summary = json.loads((run / "summary.json").read_text())["sweeps"]["depth"]
    variants = summary["variants"]
    assert list(variants) == ["dspark 1L", "dspark 2L", "dspark 5L", "dflash 5L"]
    assert variants["dspark 2L"]["drafter"] == "drafters/dspark"
    for label, name in (("dspark 1L", "dspark-1L"), ("dspark 5L", "dspark-5L"), ("dflash 5L", "dflash-5L")):
        assert variants[label]["drafter"] == f"drafters/{name}" and variants[label]["steps"] == 2
    points = {(p["label"], p["benchmark"]) for p in summary["points"]}
    assert {label for label, _ in points} == set(variants) and len(points) == 4 * 3
    report = run / summary["report"]
    assert report.is_file() and (report.parent / "depth.png").stat().st_size > 0
    # The layer counts reached the trained drafters (not only the labels).
    layers = {
        name: json.loads((run / "drafters" / name / "config.json").read_text())
        for name in ("dspark-1L", "dspark-5L", "dflash-5L")
    }
    assert {n: c["num_hidden_layers"] for n, c in layers.items()} == {
        "dspark-1L": 1,
        "dspark-5L": 5,
        "dflash-5L": 5,
    }
    assert main(["--threads", "1", "campaign", "--out", str(run), *ARGS, *sweep]) == 0
    err = capsys.readouterr().err
    for stage in ("train-dspark-1L", "train-dspark-5L", "train-dflash-5L", "sweep-depth"):
        assert f"· {stage}: done in an earlier run" in err, stage
    assert main(["campaign", "--out", str(run), "--status"]) == 0
    assert json.loads(capsys.readouterr().out)["training"]["dflash-5L"]["finished"]


def test_bad_sweep_is_a_user_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["campaign", "--out", str(tmp_path), "--sweeps", "width"])
    assert e.value.code == 2 and "unknown --sweeps width" in capsys.readouterr().err


def test_two_processes_share_the_regeneration_and_the_cache(tmp_path):
    """Two processes started together: one runs the regeneration, the other answers prompts and
    writes cache pieces beside it, none twice. (Started one after the other, the first could
    answer all 48 prompts before a loaded machine had imported the second: CI, stop 28.)"""
    import os
    import subprocess
    import sys

    out = tmp_path / "shared"
    args = ["--prompts", "48", "--epochs", "1", "--eval-prompts", "1", "--eval-max-tokens", "16"]
    args += ["--methods", "dflash", "--no-progress"]
    command = [sys.executable, "-m", "dspark", "--threads", "1", "campaign", "--out", str(out), *args]
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    runs = [subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [run.communicate(timeout=600)[1] for run in runs]
    for run, err in zip(runs, errs):
        assert run.returncode == 0, err[-2000:]
    beside = ["regenerate: another process is running it; answering beside it" in err for err in errs]
    assert sorted(beside) == [False, True], errs
    ids = [json.loads(line)["id"] for line in (out / "data" / "answers.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 48  # every prompt answered once, by either process
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cache"]["samples"] == 48 and summary["data"]["completion_tokens"] > 0
    assert not (out / "data" / "answers.jsonl.claims").exists()
