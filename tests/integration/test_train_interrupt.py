"""Ctrl-C during `dspark train` names the last checkpoint and how to resume; the rerun says it resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def test_ctrl_c_names_the_checkpoint_and_the_rerun_says_it_resumed(tmp_path):
    data = tmp_path / "answers.jsonl"
    turn = [
        {"role": "user", "content": "Ben has 12 pencils and gets 3 more. How many now?"},
        {"role": "assistant", "content": "Ben has 12 + 3 = 15 pencils. The answer is 15. \\boxed{15}"},
    ]
    data.write_text("\n".join(json.dumps({"conversations": turn}) for _ in range(4)) + "\n")
    out = tmp_path / "run"
    argv = [
        sys.executable, "-m", "dspark", "--threads", "1", "train", "--drafter", "dflash", "--data",
        str(data), "--out", str(out), "--steps", "40", "--save-every", "5",
        "--batch-size", "2", "--micro-batch-size", "2", "--max-length", "64", "--num-anchors", "8",
    ]  # fmt: skip
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    # A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored
    # across exec: the child gets Ctrl-C's default (KeyboardInterrupt) whatever ran pytest.
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + 240
    while not latest.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    said = [line for line in err.splitlines() if "interrupted; the last checkpoint is" in line]
    assert len(said) == 1 and str(out) in said[0] and "rerunning the same command" in said[0], err
    assert "Traceback" not in err
    checkpoint = said[0].split("the last checkpoint is ")[1].split(" — ")[0]
    step = int(checkpoint.rsplit("_", 1)[-1])  # .../checkpoints/step_00000003
    assert 5 <= step < 40 and step % 5 == 0

    rerun = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed from step {step} of 40" in rerun.stderr, rerun.stderr


def test_ctrl_c_inside_a_save_names_the_checkpoint_it_put_in_place(tmp_path, monkeypatch, caplog):
    """Ctrl-C after ``latest`` names the new checkpoint but before ``save`` returns (what the
    test above hits now and then): the message names what is on disk, not the one before."""
    from dspark.cli import main
    from dspark.training.run import Trainer

    data = tmp_path / "answers.jsonl"
    turn = [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": "5. \\boxed{5}"}]
    data.write_text("\n".join(json.dumps({"conversations": turn}) for _ in range(4)) + "\n")
    out = tmp_path / "run"
    save = Trainer.save

    def save_then_interrupted(self, step):
        save(self, step)
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "save", save_then_interrupted)
    argv = [
        "--threads", "1", "train", "--drafter", "dflash", "--data", str(data), "--out", str(out),
        "--steps", "10", "--save-every", "2", "--batch-size", "2", "--micro-batch-size", "2",
        "--max-length", "64", "--num-anchors", "8",
    ]  # fmt: skip
    with caplog.at_level("WARNING", logger="dspark.training.trainer"):
        assert main(argv) == 130
    said = [r.getMessage() for r in caplog.records if "interrupted" in r.getMessage()]
    assert len(said) == 1 and "the last checkpoint is" in said[0] and "step_00000002" in said[0], said
