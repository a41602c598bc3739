"""No command deletes what it did not write (issue 15, finding 1): output folders through the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.cli import main
from dspark.drafters.dspark import DSparkConfig
from dspark.drafters.kinds import KINDS
from dspark.formats.folder import load_drafter, save_drafter
from dspark.output_folders import MARKER, OutputFolderError, check_replaceable
from dspark.targets import TargetAdapter

GAMMA = 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny chat target, a DSpark drafter with a confidence head inside ``work/``, 3 prompts."""
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target, mask_token_id

    root = tmp_path_factory.mktemp("cal")
    target_dir = build_tiny_chat_target(root / "target")
    target = TargetAdapter.from_pretrained(target_dir)
    config = DSparkConfig(
        num_layers=1, block_size=GAMMA, mask_token_id=mask_token_id(target.tokenizer), markov_rank=8
    )
    torch.manual_seed(0)
    save_drafter(root / "work" / "dspark", KINDS["dspark"].drafter_cls.from_target(target, config), target)
    with open(root / "bench.jsonl", "w") as f:
        for i in range(3):
            f.write(json.dumps({"turns": [f"Explain how topic {i} works."]}) + "\n")
    return root


def _calibrate(capsys, setup, tmp_path, save_to) -> tuple[int, str]:
    argv = [
        "--threads", "1", "calibrate", "--drafter", setup / "work" / "dspark", "--bench",
        setup / "bench.jsonl", "--target", setup / "target", "--max-tokens", "12", "--no-progress",
        "--save-to", save_to, "--out", tmp_path / "report",
    ]  # fmt: skip
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def _snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_calibrate_save_to_a_foreign_folder_is_refused_and_nothing_deleted(setup, tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "thesis.tex").write_text("precious")
    code, err = _calibrate(capsys, setup, tmp_path, notes)
    assert code == 2 and err.startswith("dspark: error: --save-to") and "did not write" in err
    assert (notes / "thesis.tex").read_text() == "precious" and len(list(notes.iterdir())) == 1


def test_calibrate_save_to_the_parent_of_the_source_is_refused(setup, tmp_path, capsys):
    before = _snapshot(setup / "work")
    code, err = _calibrate(capsys, setup, tmp_path, setup / "work")
    assert code == 2 and "holds the input" in err and err.count("\n") == 1
    assert _snapshot(setup / "work") == before  # the source drafter is intact
    code, err = _calibrate(capsys, setup, tmp_path, setup / "work" / "dspark")  # the source itself
    assert code == 2 and "holds the input" in err
    assert _snapshot(setup / "work") == before


def test_calibrate_save_to_writes_a_marked_copy_that_a_rerun_may_replace(setup, tmp_path, capsys):
    copy = tmp_path / "calibrated"
    for _ in range(2):  # the second run replaces what the first wrote
        code, err = _calibrate(capsys, setup, tmp_path, copy)
        assert code == 0, err
    marker = json.loads((copy / MARKER).read_text())
    assert marker["command"] == "calibrate" and "model.safetensors" in marker["files"]
    target = TargetAdapter.from_pretrained(setup / "target")
    assert load_drafter(copy, target).config.sts_temperatures is not None
    assert "sts_temperatures" not in json.loads((setup / "work" / "dspark" / "config.json").read_text()) or (
        json.loads((setup / "work" / "dspark" / "config.json").read_text())["sts_temperatures"] is None
    )
    (copy / "my-notes.txt").write_text("added by the user")  # now it holds something dspark did not write
    code, err = _calibrate(capsys, setup, tmp_path, copy)
    assert code == 2 and "my-notes.txt" in err and (copy / "my-notes.txt").is_file()


def test_train_does_not_replace_a_foreign_drafter_subfolder(tmp_path):
    """``dspark train --out RUN`` publishes RUN/drafter: a user's folder of that name survives."""
    foreign = tmp_path / "run" / "drafter"
    foreign.mkdir(parents=True)
    (foreign / "data.csv").write_text("1,2,3")
    with pytest.raises(OutputFolderError, match="did not write"):
        check_replaceable(
            foreign, command="train", inputs=[tmp_path / "run" / "checkpoints" / "step_00000001"]
        )
    from dspark.formats.folder import publish_checkpoint

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for name in ("config.json", "model.safetensors"):
        (ckpt / name).write_text("{}")
    with pytest.raises(OutputFolderError):
        publish_checkpoint(ckpt, foreign)
    assert (foreign / "data.csv").read_text() == "1,2,3"
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["drafter"]  # no temporary left behind
