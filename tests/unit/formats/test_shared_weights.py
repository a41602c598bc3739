"""Drafter folders without the target's frozen tensors, and reduced vocabularies on disk (issue 16)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dspark.formats.export import export_drafter
from dspark.formats.folder import DrafterLoadError, load_drafter, publish_checkpoint, save_drafter
from dspark.formats.shared_weights import RECORD_FIELD
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter
from tests.unit.drafters.builders import BLOCK, DRAFTERS, build, make_state, prompt
from tests.unit.drafters.test_draft_vocab import N, build_reduced, draft_ids


def _keys(path):
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return set(f.keys())


def _same_drafts(a, b, target):
    params = [SamplingParams(temperature=1.0, seed=5)]
    x = a.propose([make_state(target, prompt(9))], BLOCK, params)
    y = b.propose([make_state(target, prompt(9))], BLOCK, params)
    assert torch.equal(x.tokens, y.tokens)
    torch.testing.assert_close(x.probs, y.probs, atol=0, rtol=0)


@pytest.mark.parametrize("reduced", [False, True])
@pytest.mark.parametrize("name", DRAFTERS)
def test_folder_leaves_out_the_targets_tensors_and_reloads_them(tmp_path, target, name, reduced):
    drafter = build_reduced(name, target) if reduced else build(name, target)
    folder = save_drafter(tmp_path / "d", drafter, target)
    keys = _keys(folder)
    assert "embed_tokens.weight" not in keys and "lm_head.weight" not in keys
    assert ({"d2t", "t2d"} <= keys) == reduced and "draft_ids" not in keys
    config = json.loads((folder / "config.json").read_text())
    assert sorted(config[RECORD_FIELD]["omitted"]) == ["embed_tokens.weight", "lm_head.weight"]
    assert config.get("draft_vocab_size") == (N if reduced else None)
    loaded = load_drafter(folder, target)
    for key, value in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    if reduced:
        assert torch.equal(loaded.draft_ids, draft_ids())
    _same_drafts(drafter, loaded, target)


def test_a_folder_holding_the_tensors_still_loads(tmp_path, target):
    """Folders written before this change (every key in the file) load unchanged."""
    drafter = build("dspark_markov", target)
    folder = save_drafter(tmp_path / "old", drafter, target, keep_shared=True)
    assert {"embed_tokens.weight", "lm_head.weight"} <= _keys(folder)
    assert RECORD_FIELD not in json.loads((folder / "config.json").read_text())
    _same_drafts(drafter, load_drafter(folder, target), target)


def test_another_target_is_refused_in_one_line(tmp_path, target, tiny_qwen3):
    folder = save_drafter(tmp_path / "d", build("dflash", target), target)
    other = TargetAdapter(type(tiny_qwen3)(tiny_qwen3.config))  # same shape, other random weights
    with pytest.raises(DrafterLoadError) as e:
        load_drafter(folder, other)
    assert "trained for another target" in str(e.value) and "\n" not in str(e.value)


def test_inconsistent_draft_vocabulary_tables_are_refused(tmp_path, target):
    folder = save_drafter(tmp_path / "d", build_reduced("dspark_markov", target), target)
    state = load_file(str(folder / "model.safetensors"))
    state["t2d"] = torch.roll(state["t2d"], 1)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(DrafterLoadError, match="disagree"):
        load_drafter(folder, target)


def test_published_checkpoint_is_stripped(tmp_path, target):
    """A training checkpoint holds every key (resume); the published folder does not."""
    from dspark.formats.folder import drafter_config_json

    drafter = build_reduced("eagle3", target)
    ckpt = tmp_path / "step"
    ckpt.mkdir()
    save_file({k: v.contiguous() for k, v in drafter.state_dict().items()}, str(ckpt / "model.safetensors"))
    (ckpt / "config.json").write_text(json.dumps(drafter_config_json(drafter, target)))
    folder = publish_checkpoint(ckpt, tmp_path / "drafter", target)
    assert "lm_head.weight" not in _keys(folder) and "d2t" in _keys(folder)
    _same_drafts(drafter, load_drafter(folder, target), target)


@pytest.mark.parametrize("name", ["dspark_markov", "eagle3"])
def test_export_writes_the_targets_tensors_and_round_trips(tmp_path, target, name):
    drafter = build_reduced(name, target)
    folder = save_drafter(tmp_path / "d", drafter, target)
    loaded = load_drafter(folder, target)
    out = export_drafter(loaded, target, tmp_path / "vllm", fmt="vllm", dtype=torch.float32)
    keys = _keys(out)
    assert {"embed_tokens.weight", "lm_head.weight", "d2t", "t2d"} <= keys
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == N and RECORD_FIELD not in config
    file = load_file(str(out / "model.safetensors"))
    assert torch.equal(file["d2t"] + torch.arange(N), draft_ids())
    assert file["lm_head.weight"].shape == (N, target.hidden_size)
    _same_drafts(drafter, load_drafter(out, target), target)
    with pytest.raises(Exception, match="SGLang cannot load this drafter"):
        export_drafter(loaded, target, tmp_path / "sg", fmt="sglang", dtype=torch.float32)


def test_a_draft_vocabulary_larger_than_the_targets_is_refused(tmp_path, target):
    folder = save_drafter(tmp_path / "d", build_reduced("dflash", target), target)
    config = json.loads((folder / "config.json").read_text())
    config["draft_vocab_size"] = 4096
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(DrafterLoadError, match="draft_vocab_size 4096 > the target's vocabulary 128"):
        load_drafter(folder, target)
