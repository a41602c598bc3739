"""`dspark train` end to end on the embedded tiny target, then generate with the result."""

from __future__ import annotations

import json

import pytest

from dspark.cli import main
from dspark.drafters.folder import load_drafter
from dspark.presets.tiny import tiny_target_dir
from dspark.targets import TargetAdapter


@pytest.mark.parametrize("method", ["dspark", "eagle3"])
def test_train_two_steps_then_generate(tmp_path, capsys, method):
    out = tmp_path / method
    argv = [
        "train",
        "--drafter",
        method,
        "--data",
        "tiny-corpus",
        "--limit",
        "8",
        "--out",
        str(out),
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--micro-batch-size",
        "1",
        "--num-anchors",
        "8",
        "--max-length",
        "128",
        "--save-every",
        "0",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2
    assert (out / "metrics.jsonl").is_file()
    config = json.loads((out / "drafter" / "config.json").read_text())
    assert config["dspark_method"] == method
    target = TargetAdapter.from_pretrained(tiny_target_dir())
    load_drafter(out / "drafter", target)  # strict loader accepts the published folder
    assert (
        main(
            [
                "generate",
                "--prompt",
                "Explain the pass statement in Python.",
                "--drafter",
                str(out / "drafter"),
                "--max-tokens",
                "12",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["num_tokens"] >= 1
    # Running the same command again resumes from the finished checkpoint and does no step.
    assert main(argv) == 0


def test_unknown_preset_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "train",
                "--drafter",
                "dspark",
                "--preset",
                "nope",
                "--data",
                "tiny-corpus",
                "--out",
                str(tmp_path),
                "--steps",
                "1",
            ]
        )
    assert exc.value.code == 2
    assert "unknown preset" in capsys.readouterr().err


def test_train_flags_reach_the_trainer(tmp_path, capsys, monkeypatch):
    """--activation-checkpointing and --pack-target switch the trainer's options on (issue 14)."""
    from dspark.training import trainer as trainer_module

    seen = []
    real_init = trainer_module.Trainer.__init__

    def spy(self, cfg, *a, **k):
        seen.append(cfg)
        real_init(self, cfg, *a, **k)

    monkeypatch.setattr(trainer_module.Trainer, "__init__", spy)
    argv = [
        "train",
        "--drafter",
        "dflash",
        "--data",
        "tiny-corpus",
        "--limit",
        "4",
        "--out",
        str(tmp_path / "r"),
    ]
    argv += ["--steps", "1", "--batch-size", "2", "--micro-batch-size", "2", "--num-anchors", "4"]
    argv += ["--max-length", "64", "--save-every", "0", "--activation-checkpointing", "--pack-target"]
    assert main(argv) == 0
    assert seen[0].activation_checkpointing and seen[0].pack_target
