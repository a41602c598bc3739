"""`dspark train` end to end on the embedded tiny target, then generate with the result."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.cli import main
from dspark.formats.folder import load_drafter
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


def test_train_with_a_reduced_draft_vocabulary(tmp_path, capsys):
    """``--draft-vocab N``: the N most frequent supervised tokens, stored as d2t, no target tensors."""
    from safetensors.torch import load_file

    from dspark.commands.loading import training_records
    from dspark.data.samples import tokenize_records
    from dspark.drafters.draft_vocab import most_frequent_tokens, to_file_state

    out = tmp_path / "run"
    argv = ["train", "--drafter", "dspark", "--data", "tiny-corpus", "--limit", "8", "--out", str(out)]
    argv += ["--steps", "2", "--batch-size", "2", "--micro-batch-size", "1", "--num-anchors", "8"]
    argv += ["--max-length", "128", "--save-every", "0", "--draft-vocab", "64"]
    assert main(argv) == 0
    capsys.readouterr()
    config = json.loads((out / "drafter" / "config.json").read_text())
    assert config["draft_vocab_size"] == 64
    file = load_file(str(out / "drafter" / "model.safetensors"))
    assert "lm_head.weight" not in file and "embed_tokens.weight" not in file
    target = TargetAdapter.from_pretrained(tiny_target_dir())
    data = tokenize_records(training_records(["tiny-corpus"], 8), target.tokenizer, max_length=128)
    ids = most_frequent_tokens(data, target.vocab_size, 64)
    assert torch.equal(file["d2t"], to_file_state({"draft_ids": ids}, target.vocab_size)["d2t"])
    drafter = load_drafter(out / "drafter", target)
    assert torch.equal(drafter.draft_ids, ids) and drafter.lm_head.weight.shape[0] == 64
    with pytest.raises(SystemExit) as exc:
        main([*argv[:-2], "--draft-vocab", "0", "--no-resume"])
    assert exc.value.code == 2 and "--draft-vocab must be >= 1" in capsys.readouterr().err


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
