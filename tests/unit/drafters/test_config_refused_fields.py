"""Issue 40, defects 5 and 6: a drafter config.json whose attention shape is broken is refused,
not silently replaced by the target's values; an integer too long to convert is a one-line
error, not a traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from dspark.formats.folder import DrafterLoadError, load_drafter
from dspark.presets.tiny import tiny_target_dir
from dspark.targets import TargetAdapter

SHIPPED = tiny_target_dir().parent / "drafters" / "tiny" / "dspark"


@pytest.fixture(scope="module")
def target():
    return TargetAdapter.from_pretrained(tiny_target_dir())


def _copy(tmp_path, change=None):
    folder = tmp_path / "d"
    shutil.copytree(SHIPPED, folder)
    if change is not None:
        raw = json.loads((folder / "config.json").read_text())
        change(raw)
        (folder / "config.json").write_text(json.dumps(raw))  # NaN is written as NaN
    return folder


BROKEN = {
    "num_attention_heads 0": (lambda r: r.update(num_attention_heads=0), "num_attention_heads"),
    "num_key_value_heads -1": (lambda r: r.update(num_key_value_heads=-1), "num_key_value_heads"),
    "head_dim -64": (lambda r: r.update(head_dim=-64), "head_dim"),
    "rms_norm_eps NaN": (lambda r: r.update(rms_norm_eps=float("nan")), "rms_norm_eps"),
    "rope_theta NaN": (lambda r: r.update(rope_theta=float("nan")), "rope_theta"),
    "rope_parameters.rope_theta NaN": (
        lambda r: r.setdefault("rope_parameters", {}).update(rope_theta=float("nan")),
        "rope_theta",
    ),
    "rope_theta 0": (lambda r: r.update(rope_theta=0), "rope_theta"),
    "intermediate_size 0": (lambda r: r.update(intermediate_size=0), "intermediate_size"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_attention_field_is_refused_by_name(tmp_path, target, case):
    change, field = BROKEN[case]
    with pytest.raises(DrafterLoadError, match=f"malformed drafter config: {field}"):
        load_drafter(_copy(tmp_path, change), target)


def test_negative_control_the_shipped_config_loads(tmp_path, target):
    load_drafter(_copy(tmp_path), target)


def test_a_5000_digit_integer_is_a_load_error(tmp_path, target):
    folder = _copy(tmp_path)
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text.replace("{", '{"block_size": ' + "7" * 5000 + ",", 1))
    with pytest.raises(DrafterLoadError, match="digits"):
        load_drafter(folder, target)


def test_an_export_manifest_that_does_not_vouch_for_the_weights_is_refused(tmp_path, target):
    from dspark.formats.export import export_drafter
    from tests.unit.training.test_checkpoint_integrity import _flip_byte

    out = export_drafter(load_drafter(SHIPPED, target), target, tmp_path / "ex", fmt="hf")
    load_drafter(out, target)  # control: an intact export loads
    manifest = json.loads((out / "dspark_export.json").read_text())
    del manifest["sha256"]["model.safetensors"]
    (out / "dspark_export.json").write_text(json.dumps(manifest))
    _flip_byte(out / "model.safetensors")
    with pytest.raises(DrafterLoadError, match="no sha256 of model.safetensors"):
        load_drafter(out, target)
