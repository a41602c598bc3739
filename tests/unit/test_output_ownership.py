"""Markers decide ownership (issue 40, defect 2): a folder or file is dspark's only when its
marker names the command and the run that wrote it; ``--force`` overwrites only the
command's own output names, never a file of another name."""

from __future__ import annotations

import json
import os

import pytest

from dspark.output_folders import (
    MARKER,
    OutputFolderError,
    check_not_input,
    check_replaceable,
    claim_outputs,
    publish_folder,
    read_claims,
    temp_folder,
)

DRAFTER = ("config.json", "model.safetensors")


def _drafter_folder(path, marker: dict | None = None):
    path.mkdir(parents=True)
    for name in DRAFTER:
        (path / name).write_text(f"user's {name}")
    if marker is not None:
        (path / MARKER).write_text(json.dumps(marker))
    return path


OWNERS = {
    "no marker": None,
    "another command": {"command": "export", "run": "r1", "files": list(DRAFTER)},
    "another run": {"command": "train", "run": "r2", "files": list(DRAFTER)},
    "a marker without a run": {"command": "train", "files": list(DRAFTER)},
    "a marker that does not list the files": {"command": "train", "run": "r1", "files": []},
}


@pytest.mark.parametrize("owner", OWNERS)
def test_a_folder_not_marked_by_this_command_and_run_is_refused_naming_force(tmp_path, owner):
    folder = _drafter_folder(tmp_path / "d", OWNERS[owner])
    with pytest.raises(OutputFolderError, match="--force") as e:
        check_replaceable(folder, command="train", run="r1", names=DRAFTER)
    assert "\n" not in str(e.value)
    assert check_replaceable(folder, command="train", run="r1", names=DRAFTER, force=True) == folder


def test_negative_control_this_command_and_run_replace_their_own_folder(tmp_path):
    folder = _drafter_folder(tmp_path / "d", {"command": "train", "run": "r1", "files": list(DRAFTER)})
    assert check_replaceable(folder, command="train", run="r1", names=DRAFTER) == folder


def test_force_never_replaces_a_folder_holding_other_files(tmp_path):
    folder = _drafter_folder(tmp_path / "d")
    (folder / "thesis.tex").write_text("precious")
    with pytest.raises(OutputFolderError, match="even with --force"):
        check_replaceable(folder, command="train", run="r1", names=DRAFTER, force=True)


def test_publish_leaves_an_unmarked_drafter_folder_intact(tmp_path):
    folder = _drafter_folder(tmp_path / "d")
    tmp = temp_folder(folder)
    (tmp / "config.json").write_text("new")
    with pytest.raises(OutputFolderError, match="--force"):
        publish_folder(tmp, folder, command="calibrate", run="x", names=DRAFTER)
    assert (folder / "config.json").read_text() == "user's config.json" and not tmp.exists()


def test_publish_through_a_link_replaces_the_folder_it_names_and_keeps_the_link(tmp_path):
    real = tmp_path / "real"
    first = temp_folder(real)
    (first / "config.json").write_text("1")
    publish_folder(first, real, command="export", run="r")
    link = tmp_path / "link"
    link.symlink_to(real)
    second = temp_folder(link)
    (second / "config.json").write_text("2")
    assert publish_folder(second, link, command="export", run="r") == real
    assert link.is_symlink() and (link / "config.json").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # no .link.old-PID left


def test_a_broken_link_is_a_one_line_error(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(OutputFolderError, match="broken symbolic link"):
        check_replaceable(link, command="export")


def test_claimed_names_are_ours_and_unclaimed_ones_the_users(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("user's metrics\n")
    (run / "notes.txt").write_text("mine")
    names = ("metrics.jsonl", "train_config.json")
    with pytest.raises(OutputFolderError, match="metrics.jsonl.*--force"):
        claim_outputs(run, names, command="train")
    assert not (run / MARKER).exists()
    first = claim_outputs(run, names, command="train", force=True)  # takes over those names only
    assert claim_outputs(run, names, command="train") == first  # control: now ours, same run
    (claim,) = read_claims(run)
    assert claim.files == set(names) and "notes.txt" not in claim.files
    with pytest.raises(OutputFolderError, match="calibrate"):  # train's claim is not calibrate's
        claim_outputs(run, ["metrics.jsonl"], command="calibrate")
    claim_outputs(run, ["calibration.md"], command="calibrate")  # beside train's: both claims kept
    assert {c.command for c in read_claims(run)} == {"train", "calibrate"}
    assert (run / "notes.txt").read_text() == "mine"


def test_an_output_file_that_is_an_input_is_refused(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("{}\n")
    with pytest.raises(OutputFolderError, match="is the input"):
        check_not_input(prompts, [str(prompts)])
    link = tmp_path / "alias.jsonl"
    os.symlink(prompts, link)
    with pytest.raises(OutputFolderError, match="is the input"):
        check_not_input(link, [str(prompts)])
    check_not_input(tmp_path / "answers.jsonl", [str(prompts), "math"])  # control
