"""Issue 40, defect 5: one-line errors instead of tracebacks (or of a misleading failure later)."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from dspark.cli import main
from dspark.errors import DsparkError
from dspark.presets.tiny import tiny_target_dir
from dspark.training.config import TrainConfig
from dspark.training.metrics_log import truncate_after
from tests.integration.test_cli_hardening import _one_line, _run
from tests.integration.test_output_ownership_cli import TRAIN

SHIPPED = tiny_target_dir().parent / "drafters" / "tiny" / "dspark"


def _train_args(out, *extra):
    return ["train", "--drafter", "dspark", "--data", "tiny-corpus", *TRAIN, "--out", out, *extra]


@pytest.mark.parametrize(
    "flag,value", [("--lr", "nan"), ("--lr", "inf"), ("--lr", "0"), ("--batch-size", "0"), ("--steps", "0")]
)
def test_bad_training_numbers_are_refused_before_anything_runs(tmp_path, capsys, flag, value):
    code, err = _run(capsys, *_train_args(tmp_path / "run", flag, value))
    assert code == 2 and f"argument {flag}" in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "fields", [{"lr": math.nan}, {"lr": math.inf}, {"global_batch_size": 0}, {"max_grad_norm": math.nan}]
)
def test_train_config_refuses_what_the_cli_refuses(fields):
    with pytest.raises(DsparkError):
        TrainConfig(output_dir="x", max_steps=1, **fields)


def test_a_drafter_config_with_a_5000_digit_integer_is_one_line(tmp_path, capsys):
    folder = tmp_path / "d"
    shutil.copytree(SHIPPED, folder)
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text.replace("{", '{"markov_rank": ' + "9" * 5000 + ",", 1))
    for argv in (
        ["export", "--format", "hf", "--drafter", folder, "--out", tmp_path / "ex"],
        ["calibrate", "--drafter", folder, "--dry-run", "--out", tmp_path / "report"],
    ):
        _one_line(*_run(capsys, *argv), "digits")


def test_a_non_json_metrics_log_in_a_resumed_run_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    assert _run(capsys, *_train_args(run))[0] == 0
    metrics = run / "metrics.jsonl"
    metrics.write_text("not json\n" + metrics.read_text())
    _one_line(*_run(capsys, *_train_args(run)), "metrics.jsonl", "line 1")
    assert metrics.read_text().startswith("not json\n")


def test_truncate_after_drops_a_cut_last_line_and_keeps_the_rest(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [json.dumps({"step": s}) + "\n" for s in (1, 2, 3)]
    path.write_text("".join(records) + '{"step": 4, "lo')  # the crash cut the last write
    truncate_after(path, 2)
    assert path.read_text() == "".join(records[:2])
    truncate_after(path, 0)  # a fresh run starts an empty log: no record of another run kept
    assert path.read_text() == ""


def test_no_resume_says_what_it_does(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--no-resume refuse to run if --out already holds checkpoints" in text
    assert "start afresh even if" not in text


def test_a_prompt_file_with_a_5000_digit_integer_is_one_line(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["hi"], "n": ' + "9" * 5000 + "}\n")
    _one_line(*_run(capsys, "data", "prompts", "--set", prompts, "--out", tmp_path / "o.jsonl"), "digits")


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_eval_temperature_nan_is_refused_before_decoding(tmp_path, capsys, value):
    argv = ["eval", "--drafters", "ngram", "--bench", "math", "--limit", "1", "--max-tokens", "4"]
    _one_line(*_run(capsys, *argv, "--temperature", value, "--out", tmp_path / "e"), "--temperature")
    assert not (tmp_path / "e").exists()


def test_a_cache_manifest_without_the_index_checksum_is_refused(tmp_path, capsys):
    from dspark.data.cache import CacheError, FeatureCache

    data, out = tmp_path / "records.jsonl", tmp_path / "cache"
    data.write_text(json.dumps({"turns": ["Say hi."], "answers": ["Hi there."]}) + "\n")
    assert (
        _run(capsys, "data", "cache", "--data", data, "--out", out, "--dtype", "fp32", "--no-progress")[0]
        == 0
    )
    FeatureCache.open(out)  # control: intact
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["index"]["sha256"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CacheError, match="sha256"):
        FeatureCache.open(out)


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--drafter", "dspark", "--data", "tiny-corpus", "--out", "{file}"],
        ["eval", "--drafters", "ngram", "--bench", "math", "--limit", "1", "--out", "{file}"],
        ["data", "prompts", "--set", "math", "--out", "{file}/train.jsonl"],
        ["export", "--format", "hf", "--drafter", "dspark", "--out", "{file}/export"],
    ],
)
def test_a_file_where_the_output_folder_goes_is_one_line(tmp_path, capsys, argv):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    _one_line(*_run(capsys, *(a.format(file=file) for a in argv)), "exists and is not a folder")
    assert file.read_text() == "mine"


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["train", "--drafter", "dspark", "--data", "tiny-corpus", "--seed", "-1"], "--seed"),
        (["train", "--drafter", "dspark", "--data", "tiny-corpus", "--limit", "0"], "--limit"),
        (["calibrate", "--drafter", "dspark", "--dry-run", "--seed", "-1"], "--seed"),
    ],
)
def test_negative_seeds_and_empty_limits_are_usage_errors(tmp_path, capsys, argv, flag):
    code, err = _run(capsys, *argv, "--out", tmp_path / "out")
    assert code == 2 and f"argument {flag}" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
