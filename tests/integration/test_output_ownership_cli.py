"""Issue 40, defects 2 and 3, as a user meets them: no command overwrites what its marker does not
say it wrote (a drafter folder copied in by hand, a user's metrics.jsonl or calibration.md), an
export through a symbolic link publishes cleanly, and an output file is never one of the inputs."""

from __future__ import annotations

import json
import shutil

import pytest

from dspark.output_folders import MARKER
from dspark.presets.tiny import tiny_target_dir
from tests.integration.test_cli_hardening import _one_line, _run

SHIPPED = tiny_target_dir().parent / "drafters" / "tiny" / "dspark"  # has a confidence head
TRAIN = ["--steps", "1", "--limit", "4", "--max-length", "64", "--batch-size", "2"]
TRAIN += ["--micro-batch-size", "2", "--num-anchors", "4", "--save-every", "0"]


def _refused(code: int, err: str, *needles: str) -> None:
    _one_line(code, err, "--force", *needles)


def _snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _users_drafter(path):
    """A drafter folder the user made: config.json + model.safetensors, no marker."""
    path.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(SHIPPED / name, path / name)
    return path


def _calibrate(capsys, tmp_path, *extra) -> tuple[int, str]:
    argv = ["calibrate", "--drafter", "dspark", "--bench", "math", "--limit", "2", "--max-tokens", "8"]
    return _run(capsys, *argv, "--no-progress", *extra)


def test_calibrate_save_to_a_users_drafter_folder_needs_force(tmp_path, capsys):
    mine = _users_drafter(tmp_path / "mine")
    before = _snapshot(mine)
    code, err = _calibrate(capsys, tmp_path, "--save-to", mine, "--out", tmp_path / "report")
    _refused(code, err, "--save-to")
    assert _snapshot(mine) == before
    code, err = _calibrate(capsys, tmp_path, "--save-to", mine, "--out", tmp_path / "report", "--force")
    assert code == 0, err
    assert json.loads((mine / MARKER).read_text())["command"] == "calibrate"
    # control: now calibrate's own copy at this path, replaced again without --force
    code, err = _calibrate(capsys, tmp_path, "--save-to", mine, "--out", tmp_path / "report")
    assert code == 0, err


def test_calibrate_out_does_not_overwrite_a_users_report(tmp_path, capsys):
    report = tmp_path / "report"
    report.mkdir()
    (report / "calibration.md").write_text("my notes")
    code, err = _calibrate(capsys, tmp_path, "--dry-run", "--out", report)
    _refused(code, err, "calibration.md")
    assert (report / "calibration.md").read_text() == "my notes"


def _train(capsys, out, *extra) -> tuple[int, str]:
    return _run(capsys, "train", "--drafter", "dspark", "--data", "tiny-corpus", *TRAIN, "--out", out, *extra)


USERS_FILES = {
    "train_config.json": lambda run: (run / "train_config.json").write_text('{"mine": 1}\n'),
    "metrics.jsonl": lambda run: (run / "metrics.jsonl").write_text('{"step": 0, "mine": 1}\nnot json\n'),
    "checkpoints": lambda run: (
        (run / "checkpoints").mkdir() or (run / "checkpoints" / ".tmp-x").write_text("1")
    ),
    "drafter": lambda run: _users_drafter(run / "drafter"),
}


@pytest.mark.parametrize("name", USERS_FILES)
def test_train_out_refuses_run_files_it_did_not_write(tmp_path, capsys, name):
    run = tmp_path / "run"
    run.mkdir()
    USERS_FILES[name](run)
    (run / "notes.txt").write_text("mine")
    before = _snapshot(run)
    code, err = _train(capsys, run)
    _refused(code, err, name)
    assert _snapshot(run) == before  # refused before anything was written


def test_train_force_takes_over_only_its_own_names_and_a_rerun_is_ours(tmp_path, capsys):
    from dspark.output_folders import read_claims

    run = tmp_path / "run"
    run.mkdir()
    for make in USERS_FILES.values():
        make(run)
    (run / "notes.txt").write_text("mine")
    code, err = _train(capsys, run, "--force")
    assert code == 0, err
    assert (run / "notes.txt").read_text() == "mine"
    assert "mine" not in (run / "train_config.json").read_text()
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    (claim,) = read_claims(run)
    assert claim.command == "train" and "notes.txt" not in claim.files
    drafter_claim = read_claims(run / "drafter")[0]
    assert (drafter_claim.command, drafter_claim.run) == ("train", claim.run)
    # control: the run folder is ours now; the same command resumes and republishes without --force
    code, err = _train(capsys, run)
    assert code == 0, err


def test_train_refuses_a_drafter_folder_of_another_run_before_training(tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    assert _train(capsys, first)[0] == 0
    assert _train(capsys, second)[0] == 0
    shutil.rmtree(second / "drafter")
    shutil.copytree(first / "drafter", second / "drafter")  # marked, but by the other run
    before = _snapshot(second)
    code, err = _train(capsys, second)
    _refused(code, err, "drafter")
    assert _snapshot(second) == before


def test_export_force_through_a_link_replaces_the_folder_it_names(tmp_path, capsys):
    real, link = tmp_path / "real", tmp_path / "LINK"
    argv = ["export", "--format", "hf", "--drafter", "dspark"]
    assert _run(capsys, *argv, "--out", real)[0] == 0
    link.symlink_to(real)
    code, err = _run(capsys, *argv, "--out", link, "--force")
    assert code == 0, err
    assert link.is_symlink() and (link / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LINK", "real"]  # no .LINK.old-PID


def test_regenerate_refuses_to_append_to_its_own_prompts(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"turns": ["Say hi."]}) + "\n")
    before = prompts.read_bytes()
    code, err = _run(capsys, "data", "regenerate", "--prompts", prompts, "--out", prompts, "--no-progress")
    assert code == 2 and "is the input" in err and err.count("\n") == 1, err
    assert prompts.read_bytes() == before


def test_data_prompts_refuses_its_input_and_a_users_file(tmp_path, capsys):
    prompts, out = tmp_path / "p.jsonl", tmp_path / "train.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [f"Q{i}?"], "domain": "x"}) + "\n" for i in range(4)))
    before = prompts.read_bytes()
    code, err = _run(capsys, "data", "prompts", "--set", prompts, "--out", prompts, "--domains", "y")
    assert code == 2 and "is the input" in err, err
    assert prompts.read_bytes() == before
    out.write_text("my own prompts\n")
    _refused(*_run(capsys, "data", "prompts", "--set", prompts, "--out", out), "train.jsonl")
    assert out.read_text() == "my own prompts\n"
    assert _run(capsys, "data", "prompts", "--set", prompts, "--out", out, "--force")[0] == 0
    assert _run(capsys, "data", "prompts", "--set", prompts, "--out", out)[0] == 0  # control: ours now


def test_eval_out_does_not_overwrite_a_users_report(tmp_path, capsys):
    report = tmp_path / "report"
    report.mkdir()
    (report / "report.md").write_text("my notes")
    argv = ["eval", "--drafters", "ngram", "--bench", "math", "--limit", "1", "--max-tokens", "4"]
    argv += ["--no-baseline", "--no-progress", "--out", report]
    _refused(*_run(capsys, *argv), "report.md")
    assert sorted(p.name for p in report.iterdir()) == ["report.md"]
    assert _run(capsys, *argv, "--force")[0] == 0
    assert _run(capsys, *argv)[0] == 0  # control: eval's own report now


@pytest.mark.parametrize(
    "argv,name",
    [(["quickstart", "--fast"], "report.md"), (["campaign", "--target", "tiny"], "summary.json")],
)
def test_pipelines_refuse_a_users_files_under_their_names(tmp_path, capsys, argv, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("mine")
    _refused(*_run(capsys, *argv, "--out", out, "--no-progress"), name)
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_a_pipeline_folder_from_before_claims_is_adopted_by_its_stage_records(tmp_path):
    from dspark.output_folders import OutputFolderError, read_claims
    from dspark.pipeline.stages import claim_run_folder

    out = tmp_path / "out"
    (out / "stages").mkdir(parents=True)
    (out / "report.md").write_text("written by an earlier quickstart")
    with pytest.raises(OutputFolderError):  # control: without its stage records it is the user's
        claim_run_folder(out, ("report.md", "stages"), command="quickstart")
    (out / "stages" / "regenerate.json").write_text('{"key": {}, "summary": {}}')
    claim_run_folder(out, ("report.md", "stages"), command="quickstart")
    assert read_claims(out)[0].command == "quickstart"


@pytest.mark.parametrize(
    "argv,name",
    [
        (["bench", "serve", "--concurrency", "1"], "results.json"),
        (["sweep", "depth", "--layers", "1", "--steps", "1"], "report.md"),
    ],
)
def test_benches_and_sweeps_refuse_a_users_files_before_running(tmp_path, capsys, argv, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("mine")
    _refused(*_run(capsys, *argv, "--out", out), name)
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_profile_out_refuses_a_users_file(tmp_path, capsys):
    table = tmp_path / "sps.json"
    table.write_text("mine")
    _refused(*_run(capsys, "profile", "--max-batch", "1", "--repeats", "1", "--out", table), "sps.json")
    assert table.read_text() == "mine"


def test_data_cache_refuses_a_folder_of_other_files(tmp_path, capsys):
    data = tmp_path / "records.jsonl"
    data.write_text(json.dumps({"turns": ["Say hi."], "answers": ["Hi there."]}) + "\n")
    out = tmp_path / "cache"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, err = _run(
        capsys, "data", "cache", "--data", data, "--out", out, "--dtype", "fp32", "--no-progress"
    )
    _one_line(code, err, "notes.txt", "not a feature cache")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    (out / "notes.txt").unlink()  # control: an empty folder is built in
    assert (
        _run(capsys, "data", "cache", "--data", data, "--out", out, "--dtype", "fp32", "--no-progress")[0]
        == 0
    )
