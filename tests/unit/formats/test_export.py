"""`dspark export`: engine layouts, re-loading by the strict loader, checksums, safe writes."""

from __future__ import annotations

import copy
import dataclasses
import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark.cli import main
from dspark.formats.export import ExportError, export_drafter
from dspark.formats.folder import EXPORT_MANIFEST, DrafterLoadError, load_drafter
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter
from tests.unit.drafters.builders import build, make_state, prompt

KINDS = ["dspark_markov", "dspark_rnn", "dflash", "eagle3"]
FORMATS = ["vllm", "sglang", "speculators", "hf"]
# What each engine cannot represent (the interop suite checks the rest against vLLM's loader).
REFUSED = {("dspark_rnn", "vllm"), ("dspark_rnn", "speculators"), ("dflash", "sglang")}


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
    if (name, fmt) in REFUSED:
        with pytest.raises(ExportError, match=r"^(vLLM|SGLang) cannot load this drafter \(--format"):
            export_drafter(drafter, target, tmp_path / "out", fmt=fmt, dtype=torch.float32)
        assert not list(tmp_path.iterdir())
        return
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
    # One layer type per draft layer (the target has 4), DeepSpec's num_anchors, our anchor slot.
    assert config["layer_types"] == ["full_attention"] * 2
    assert config["num_anchors"] == 512 and config["sample_from_anchor"] is True


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
    # vLLM's aux id j is the input of layer j = our output of layer j - 1 (-1 = embeddings);
    # SGLang adds that 1 itself, so it gets our ids (writing vLLM's was one layer off).
    ids = [0, 2, 3] if fmt == "vllm" else [-1, 1, 2]
    assert config["eagle_aux_hidden_state_layer_ids"] == ids
    assert config["eagle_config"] == {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": ids}
    assert config["norm_before_residual"] is False
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
def test_eagle3_with_4_target_layers_is_exported_with_each_engines_layer_ids(tmp_path, tiny_qwen3, fmt):
    """vLLM and SGLang size fc from the id list; vLLM's ids are ours + 1, SGLang adds the 1 itself."""
    target = TargetAdapter(tiny_qwen3, target_layer_ids=(-1, 0, 1, 2))
    drafter = build("eagle3", target)
    out = export_drafter(drafter, target, tmp_path / "out", fmt=fmt, dtype=torch.float32)
    ids = _config(out)["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == ([0, 1, 2, 3] if fmt == "vllm" else [-1, 0, 1, 2])
    assert load_file(str(out / "model.safetensors"))["fc.weight"].shape == (64, 4 * 64)


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators", "hf"])
def test_unsorted_layer_ids_are_refused_where_engines_concatenate_ascending(tmp_path, tiny_qwen3, fmt):
    target = TargetAdapter(tiny_qwen3, target_layer_ids=(2, 0, 1))
    with pytest.raises(ExportError, match=r"\[2, 0, 1\] are not ascending"):
        export_drafter(build("dflash", target), target, tmp_path / "out", fmt=fmt)


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators"])
def test_gemma_targets_are_refused_for_the_engines_qwen3_class(tmp_path, tiny_gemma, fmt):
    target = TargetAdapter(tiny_gemma)
    drafter = build("dspark_markov", target)
    with pytest.raises(ExportError, match="neither scale embeddings .* nor softcap logits"):
        export_drafter(drafter, target, tmp_path / "out", fmt=fmt)
    out = export_drafter(drafter, target, tmp_path / "hf", fmt="hf")  # ours, under our own architecture
    assert _config(out)["architectures"] == ["DsparkFamilyDraftModel"]


def test_export_writes_the_drafters_plain_rope_not_the_targets_scaling(tmp_path, tiny_llama):
    cfg = tiny_llama.config
    cfg.rope_parameters = {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    target = TargetAdapter(tiny_llama)
    out = export_drafter(build("dflash", target), target, tmp_path / "out", fmt="vllm")
    config = _config(out)
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert "rope_scaling" not in config and config["hidden_act"] == "silu"


def test_sglang_export_writes_sts_json_and_sps_table(tmp_path, target):
    from dspark.formats.export import read_sps_table

    drafter = build("dspark_markov", target, sts_temperatures=(2.0, 1.5))
    sps = tmp_path / "sps.json"
    sps.write_text(json.dumps({"tokens": [1, 8, 32], "steps_per_s": [50.0, 40.0, 20.0], "meta": {}}))
    out = export_drafter(
        drafter, target, tmp_path / "out", fmt="sglang", dtype=torch.float32, sps_table=read_sps_table(sps)
    )
    # Exactly γ = 4 temperatures (SGLang refuses another count): the last fitted one repeats.
    assert json.loads((out / "sglang_sts.json").read_text()) == {"temperatures": [2.0, 1.5, 1.5, 1.5]}
    table = json.loads((out / "sglang_sps_table.json").read_text())
    assert table == {
        "sample_batch_tokens": [1, 8, 32],
        "sample_steps_per_sec": [50.0, 40.0, 20.0],
        "max_batch_tokens": 32,
    }
    serve = (out / "SERVE.md").read_text()
    assert "--speculative-algorithm DSPARK" in serve and "--speculative-dspark-block-size 4" in serve
    assert f"--speculative-dspark-confidence-sts-path {out.resolve() / 'sglang_sts.json'}" in serve
    assert f"--speculative-dspark-sps-table-path {out.resolve() / 'sglang_sps_table.json'}" in serve
    manifest = json.loads((out / EXPORT_MANIFEST).read_text())
    assert set(manifest["sha256"]) == {"model.safetensors", "sglang_sts.json", "sglang_sps_table.json"}
    with pytest.raises(ExportError, match="read by SGLang only"):
        export_drafter(drafter, target, tmp_path / "v", fmt="vllm", sps_table=read_sps_table(sps))


def test_legacy_rnn_checkpoint_loads_with_a_zero_bias_and_the_same_drafts(tmp_path, target):
    drafter = build("dspark_rnn", target)
    with torch.no_grad():
        drafter.markov_head.joint_proj.bias.zero_()  # what a legacy (bias-free) head computed
    out = export_drafter(drafter, target, tmp_path / "out", fmt="hf", dtype=torch.float32)
    (out / EXPORT_MANIFEST).unlink()
    state = load_file(str(out / "model.safetensors"))
    state["markov_head.rnn_proj.weight"] = state.pop("markov_head.joint_proj.weight")
    del state["markov_head.joint_proj.bias"]
    save_file(state, str(out / "model.safetensors"))
    loaded = load_drafter(out, target)
    assert torch.equal(loaded.markov_head.joint_proj.bias, torch.zeros(3 * 8))
    _assert_same_drafts(drafter, loaded, target)


def test_speculators_export_names_its_verifier_and_nests_the_layer_config(tmp_path, target):
    out = export_drafter(
        build("dspark_markov", target), target, tmp_path / "out", fmt="speculators", target_name="org/target"
    )
    config = _config(out)
    assert config["speculators_model_type"] == "dspark"
    assert config["speculators_config"]["verifier"]["name_or_path"] == "org/target"
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert config["aux_hidden_state_layer_ids"] == [1, 2, 3]  # vLLM: ours + 1
    assert config["sample_from_anchor"] is True  # speculators' default is false
    assert config["transformer_layer_config"]["num_hidden_layers"] == 2
    assert "vllm serve " + str(out.resolve()) in (out / "SERVE.md").read_text()


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
    from dspark.formats.export import layouts as export

    original = export.LAYOUTS["vllm"]

    def scaled_fc(inp):
        layout = original(inp)
        return dataclasses.replace(layout, state=layout.state | {"fc.weight": 2 * layout.state["fc.weight"]})

    monkeypatch.setitem(export.LAYOUTS, "vllm", scaled_fc)
    with pytest.raises(ExportError, match="validation failed: fc.weight"):
        export_drafter(build("dflash", target), target, tmp_path / "out", fmt="vllm")
    assert not list(tmp_path.iterdir())  # neither the folder nor its temporary copy


# -- never lose data ------------------------------------------------------------------------


def test_existing_out_is_refused_without_force(tmp_path, target):
    drafter = build("dflash", target)
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with pytest.raises(ExportError, match="not empty.*pass --force"):
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
    assert "vllm serve" in serve and '"method": "dspark"' in serve and '"num_speculative_tokens": 7' in serve
    assert '"enable_adaptive_verification": true' in serve and "not run" in serve


def test_cli_refuses_dflash_for_sglang_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["export", "--format", "sglang", "--drafter", "dflash", "--out", str(tmp_path / "e")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("dspark: error: SGLang cannot load this drafter")
        and len(err.strip().splitlines()) == 1
    )
    assert not (tmp_path / "e").exists()


def test_cli_exports_the_shipped_5_layer_eagle3_for_vllm(tmp_path, capsys):
    out = tmp_path / "e"
    assert main(["export", "--format", "vllm", "--drafter", "eagle3", "--out", str(out)]) == 0
    assert len(_config(out)["eagle_aux_hidden_state_layer_ids"]) == 5


def test_cli_refuses_a_bad_sps_table_before_any_work(tmp_path, capsys):
    bad = tmp_path / "sps.json"
    bad.write_text(json.dumps({"tokens": [8, 1], "steps_per_s": [1.0, 2.0]}))  # not increasing
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "export",
                "--format",
                "sglang",
                "--drafter",
                "dspark",
                "--out",
                str(tmp_path / "o"),
                "--sps-table",
                str(bad),
            ]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("dspark: error: --sps-table") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
