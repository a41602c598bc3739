"""`dspark export`: engine layouts, re-loading by the strict loader, checksums, safe writes."""

from __future__ import annotations

import copy
import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark.cli import main
from dspark.drafters.export import ExportError, export_drafter
from dspark.drafters.folder import EXPORT_MANIFEST, DrafterLoadError, load_drafter
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter

from .builders import build, make_state, prompt

KINDS = ["dspark_markov", "dflash", "eagle3"]
FORMATS = ["vllm", "sglang", "hf"]


def _draft(drafter, target):
    state = make_state(target, prompt(12, seed=3))
    return drafter.propose([state], 4, [SamplingParams(temperature=1.0, seed=7)])


def _assert_same_drafts(a, b, target):
    x, y = _draft(a, target), _draft(b, target)
    assert torch.equal(x.tokens, y.tokens)
    assert torch.equal(x.probs, y.probs)


def _config(folder):
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", KINDS)
def test_fp32_export_reloads_with_identical_drafts(tmp_path, target, name, fmt):
    drafter = build(name, target)
    out = export_drafter(drafter, target, tmp_path / "out", fmt=fmt, dtype=torch.float32)
    loaded = load_drafter(out, target)
    assert type(loaded) is type(drafter)
    _assert_same_drafts(drafter, loaded, target)
    manifest = json.loads((out / EXPORT_MANIFEST).read_text())
    assert manifest["format"] == fmt and manifest["dtype"] == "float32"
    assert set(manifest["sha256"]) == {"model.safetensors"}
    assert (out / "SERVE.md").is_file()


def test_bf16_export_equals_the_source_rounded_to_bf16(tmp_path, target):
    drafter = build("dspark_markov", target)
    out = export_drafter(drafter, target, tmp_path / "out", fmt="vllm", dtype=torch.bfloat16)
    assert all(v.dtype == torch.bfloat16 for v in load_file(str(out / "model.safetensors")).values())
    rounded = copy.deepcopy(drafter)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    _assert_same_drafts(rounded, load_drafter(out, target), target)
    assert _config(out)["torch_dtype"] == _config(out)["dtype"] == "bfloat16"


def test_dspark_engine_export_is_deepspec_layout_with_dflash_config(tmp_path, target):
    drafter = build("dspark_markov", target)
    out = export_drafter(drafter, target, tmp_path / "out", fmt="vllm", dtype=torch.float32)
    assert set(load_file(str(out / "model.safetensors"))) == set(drafter.state_dict())
    config = _config(out)
    assert config["architectures"] == ["Qwen3DSparkModel"]
    assert config["dflash_config"] == {"target_layer_ids": [0, 1, 2], "mask_token_id": 127}
    for field in ("block_size", "num_target_layers", "target_layer_ids", "mask_token_id", "markov_rank"):
        assert field in config
    assert config["markov_rank"] == 8 and config["num_hidden_layers"] == 2
    assert config["tie_word_embeddings"] is False


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_eagle3_engine_export_is_vllm_layout(tmp_path, tiny_qwen3, fmt):
    target = TargetAdapter(tiny_qwen3, target_layer_ids=(-1, 1, 2))
    drafter = build("eagle3", target)
    out = export_drafter(drafter, target, tmp_path / "out", fmt=fmt, dtype=torch.float32)
    state = load_file(str(out / "model.safetensors"))
    layer = {k for k in state if k.startswith("midlayer.")}
    assert set(state) - layer == {"embed_tokens.weight", "fc.weight", "norm.weight", "lm_head.weight"}
    assert "midlayer.hidden_norm.weight" in layer and not any(k.startswith("layers.") for k in state)
    assert state["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * target.hidden_size  # [embed ; h]
    assert state["fc.weight"].shape == (target.hidden_size, 3 * target.hidden_size)
    config = _config(out)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    # vLLM's aux id j is the input of layer j = our output of layer j - 1 (-1 = embeddings).
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    assert config["eagle_config"] == {
        "use_aux_hidden_state": True,
        "eagle_aux_hidden_state_layer_ids": [0, 2, 3],
    }
    assert config["target_layer_ids"] == [-1, 1, 2] and config["dspark_method"] == "eagle3"
    assert config["draft_vocab_size"] == target.vocab_size
    assert config["target_hidden_size"] == target.hidden_size
    _assert_same_drafts(drafter, load_drafter(out, target), target)


def test_eagle3_hf_export_keeps_our_layer_names(tmp_path, target):
    out = export_drafter(build("eagle3", target), target, tmp_path / "out", fmt="hf", dtype=torch.float32)
    keys = set(load_file(str(out / "model.safetensors")))
    assert "layers.0.hidden_norm.weight" in keys and not any(k.startswith("midlayer.") for k in keys)
    assert "eagle_config" not in _config(out)


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_eagle3_with_other_than_3_target_layers_is_refused_for_engines(tmp_path, tiny_qwen3, fmt):
    target = TargetAdapter(tiny_qwen3, target_layer_ids=(-1, 0, 1, 2))
    drafter = build("eagle3", target)
    with pytest.raises(ExportError, match=r"exactly 3 target layers.*fuses 4 \[-1, 0, 1, 2\].*--format hf"):
        export_drafter(drafter, target, tmp_path / "out", fmt=fmt)
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())
    export_drafter(drafter, target, tmp_path / "out", fmt="hf")  # our own layout has no such limit


# -- corrupted exports ----------------------------------------------------------------------


@pytest.fixture
def exported(tmp_path, target):
    return export_drafter(build("dspark_markov", target), target, tmp_path / "out", fmt="vllm")


def _flip_tensor_bytes(path):
    raw = bytearray(path.read_bytes())
    (header_len,) = struct.unpack("<Q", raw[:8])
    data_start = 8 + header_len
    mid = data_start + (len(raw) - data_start) // 2
    for i in range(mid, mid + 16):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_flipped_weight_bytes_are_refused_by_the_checksum(exported, target):
    _flip_tensor_bytes(exported / "model.safetensors")
    with pytest.raises(DrafterLoadError, match="corrupted: checksum mismatch"):
        load_drafter(exported, target)
    # safetensors alone cannot tell: without the manifest the corrupt weights load.
    (exported / EXPORT_MANIFEST).unlink()
    load_drafter(exported, target)


def test_truncated_weights_are_refused(exported, target):
    path = exported / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(DrafterLoadError, match="checksum mismatch"):
        load_drafter(exported, target)
    (exported / EXPORT_MANIFEST).unlink()
    with pytest.raises(DrafterLoadError, match="cannot read weights"):
        load_drafter(exported, target)


def test_both_layer_names_are_refused(tmp_path, target):
    out = export_drafter(build("eagle3", target), target, tmp_path / "out", fmt="vllm", dtype=torch.float32)
    (out / EXPORT_MANIFEST).unlink()
    state = load_file(str(out / "model.safetensors"))
    state["layers.0.hidden_norm.weight"] = state["midlayer.hidden_norm.weight"].clone()
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(DrafterLoadError, match="both midlayer"):
        load_drafter(out, target)


def test_an_export_that_does_not_reload_identically_is_not_written(tmp_path, target, monkeypatch):
    from dspark.drafters import export

    def scaled_fc(config, state, drafter):
        return config, state | {"fc.weight": 2 * state["fc.weight"]}

    monkeypatch.setitem(export._ENGINE_LAYOUTS, "Qwen3DSparkModel", scaled_fc)
    with pytest.raises(ExportError, match="validation failed: fc.weight"):
        export_drafter(build("dflash", target), target, tmp_path / "out", fmt="vllm")
    assert not list(tmp_path.iterdir())  # neither the folder nor its temporary copy


# -- never lose data ------------------------------------------------------------------------


def test_existing_out_is_refused_without_force(tmp_path, target):
    drafter = build("dflash", target)
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with pytest.raises(ExportError, match="not empty; pass --force"):
        export_drafter(drafter, target, out, fmt="hf")
    assert (out / "config.json").read_text() == "{}"
    export_drafter(drafter, target, out, fmt="hf", force=True)
    assert _config(out)["dspark_method"] == "dflash"


def test_force_replaces_only_a_drafter_folder_that_is_not_the_source(tmp_path, target):
    drafter = build("dflash", target)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "thesis.tex").write_text("precious")
    with pytest.raises(ExportError, match="dspark did not write"):
        export_drafter(drafter, target, notes, fmt="hf", force=True)
    assert (notes / "thesis.tex").read_text() == "precious"
    source = export_drafter(drafter, target, tmp_path / "src", fmt="hf")
    with pytest.raises(ExportError, match="holds the input"):
        export_drafter(drafter, target, source, fmt="vllm", source=source, force=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    export_drafter(drafter, target, empty, fmt="hf")  # an empty folder is fine


# -- the CLI --------------------------------------------------------------------------------


def test_cli_exports_the_shipped_drafter(tmp_path, capsys):
    out = tmp_path / "dspark-vllm"
    assert main(["export", "--format", "vllm", "--drafter", "dspark", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["out"] == str(out) and printed["format"] == "vllm" and printed["method"] == "dspark"
    assert "dflash_config" in _config(out) and _config(out)["torch_dtype"] == "bfloat16"
    serve = (out / "SERVE.md").read_text()
    assert "vllm serve" in serve and '"num_speculative_tokens": 7' in serve
    assert "--speculative-num-draft-tokens 8" in serve and "not run" in serve


def test_cli_refuses_the_shipped_5_layer_eagle3_for_vllm(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["export", "--format", "vllm", "--drafter", "eagle3", "--out", str(tmp_path / "e")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("dspark: error:") and "fuses 5" in err and len(err.strip().splitlines()) == 1
