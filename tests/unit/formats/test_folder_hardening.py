"""Hostile drafter folders (issue 15): sizes refused before allocation, malformed configs and
non-finite weights refused with one line, never a traceback or gigabytes allocated."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark.cli import main
from dspark.formats.folder import DrafterLoadError, load_drafter, save_drafter
from dspark.formats.shipped import shipped_drafter_dir
from tests.unit.drafters.builders import build

HUGE = 10**9


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _edit(folder, **fields):
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))


@pytest.fixture(params=["dspark_markov", "eagle3"])
def folder(request, tmp_path, target):
    return save_drafter(tmp_path / "d", build(request.param, target), target)


@pytest.mark.parametrize(
    "kind,field",
    [("dspark_markov", f) for f in ("num_hidden_layers", "markov_rank", "block_size")]
    + [(k, f) for k in ("dflash", "eagle3") for f in ("num_hidden_layers", "block_size")],
)
def test_hostile_sizes_are_refused_before_anything_is_allocated(tmp_path, target, kind, field):
    folder = save_drafter(tmp_path / "d", build(kind, target), target)
    _edit(folder, **{field: HUGE})
    before = _rss_mb()
    with pytest.raises(DrafterLoadError, match=field):
        load_drafter(folder, target)
    assert _rss_mb() - before < 100  # MB (was 7.3 GB for num_hidden_layers before an 8 GB limit)


def test_sizes_that_disagree_with_the_weights_name_the_field(tmp_path, target):
    folder = save_drafter(tmp_path / "d", build("dspark_markov", target), target)
    raw = json.loads((folder / "config.json").read_text())
    _edit(folder, num_hidden_layers=raw["num_hidden_layers"] + 1)
    with pytest.raises(DrafterLoadError, match="num_hidden_layers .* the weights hold"):
        load_drafter(folder, target)
    _edit(folder, num_hidden_layers=raw["num_hidden_layers"], markov_rank=raw["markov_rank"] * 2)
    with pytest.raises(DrafterLoadError, match="shapes do not match the config .*markov_rank 16"):
        load_drafter(folder, target)


def test_non_finite_weights_are_refused(folder, target):
    state = load_file(str(folder / "model.safetensors"))
    key = next(k for k in state if k.startswith("layers.0.") and state[k].dim() == 2)
    state[key][0, 0] = float("nan")
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(DrafterLoadError, match=f"not finite.*{key}"):
        load_drafter(folder, target)


MALFORMED = {
    "a JSON array": "[1, 2, 3]",
    "markov_rank 64.5": {"markov_rank": 64.5},
    "num_hidden_layers -1": {"num_hidden_layers": -1},
    "block_size true": {"block_size": True},
    "target_layer_ids a string": {"target_layer_ids": "0,1"},
    "sts_temperatures NaN": {"sts_temperatures": [float("nan")] * 7},
    "not UTF-8": b"\xff\xfe{}",
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_drafter_configs_are_one_line_errors(tmp_path, capsys, case):
    folder = tmp_path / "d"
    shutil.copytree(shipped_drafter_dir("dspark"), folder)
    change = MALFORMED[case]
    if isinstance(change, dict):
        _edit(folder, **change)
    elif isinstance(change, bytes):
        (folder / "config.json").write_bytes(change)
    else:
        (folder / "config.json").write_text(change)
    with pytest.raises(SystemExit) as e:
        main(["--threads", "1", "generate", "--prompt", "Hi", "--drafter", str(folder), "--max-tokens", "2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("dspark: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_a_clean_folder_still_loads(folder, target):
    drafter = load_drafter(folder, target)
    assert all(torch.isfinite(p).all() for p in drafter.parameters())
