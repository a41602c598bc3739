"""Issue 40, defect 6: a checkpoint is resumed only when its marker vouches for every byte.

A ``COMPLETE`` marker without checksums (its ``sha256`` key deleted, or hand-written) used
to take an old-format path that only parsed the files, so a flipped data byte resumed
silently. Now what cannot be verified is refused like what is corrupt."""

from __future__ import annotations

import json

import pytest

from dspark.training import checkpoint as ck

from .test_checkpoint import _ckpt
from .test_checkpoint_integrity import _flip_byte


def _edit_marker(folder, change) -> None:
    marker = json.loads((folder / ck.MARKER).read_text())
    change(marker)
    (folder / ck.MARKER).write_text(json.dumps(marker))


TAMPERING = {
    "sha256 deleted": lambda m: m.pop("sha256"),
    "sha256 not a mapping": lambda m: m.update(sha256=["x"]),
    "the file left out of files and sha256": lambda m: (
        m["files"].remove("model.safetensors"),
        m["sha256"].pop("model.safetensors"),
    ),
}


@pytest.mark.parametrize("tampering", TAMPERING)
def test_a_marker_that_cannot_vouch_for_a_flipped_byte_is_refused(tmp_path, tampering):
    folder = ck.save_checkpoint(tmp_path, _ckpt(2))
    _edit_marker(folder, TAMPERING[tampering])
    _flip_byte(folder / "model.safetensors")
    with pytest.raises(ck.CheckpointError):
        ck.verify_checkpoint(folder)
    with pytest.raises(ck.CheckpointError, match="no valid checkpoint"):
        ck.latest_checkpoint(tmp_path)


def test_falls_back_to_an_older_verified_checkpoint(tmp_path):
    ck.save_checkpoint(tmp_path, _ckpt(1))
    newest = ck.save_checkpoint(tmp_path, _ckpt(2))
    _edit_marker(newest, lambda m: m.pop("sha256"))
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "step_00000001"


def test_negative_control_an_intact_checkpoint_verifies(tmp_path):
    folder = ck.save_checkpoint(tmp_path, _ckpt(2))
    ck.verify_checkpoint(folder)
    assert ck.latest_checkpoint(tmp_path) == folder
