"""`--format gguf`: llama.cpp's names, shapes and keys, refusals, and the file read back
(llama.cpp itself runs the exports in tests/interop/test_llamacpp_drafters.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dspark.formats.export.gguf_draft import draft_content
from dspark.formats.export.gguf_file import GgufContent, read_gguf, write_gguf
from dspark.formats.export.layouts import ExportError
from dspark.formats.folder import drafter_config_json
from tests.unit.drafters.builders import MASK_ID, build


def _tokenizer() -> GgufContent:
    c = GgufContent(arch="qwen3")
    c.put("tokenizer.ggml.model", "gpt2", "STRING")
    c.put("tokenizer.ggml.tokens", [f"t{i}" for i in range(128)], "ARRAY", "STRING")
    c.put("tokenizer.ggml.eos_token_id", 2, "UINT32")
    return c


def _content(drafter, target, **kw):
    config = drafter_config_json(drafter, target)
    config.update(kw)
    return draft_content(
        drafter.state_dict(), config, drafter.dims, tokenizer_source=_tokenizer(),
        context_length=256, dtype_name="fp32", name="test",
    )  # fmt: skip


def test_dspark_names_shapes_and_keys(target):
    drafter = build("dspark_markov", target)
    draft = _content(drafter, target)
    t, meta = draft.content.tensors, {k: v[0] for k, v in draft.content.metadata.items()}
    H, V, r = drafter.dims.hidden_size, drafter.dims.vocab_size, 8
    # GGUF's ne is the numpy shape reversed: fc {n_embd_inp, n_embd}, markov_w1 {r, V} ...
    assert t["fc.weight"].shape == (H, len(drafter.config.target_layer_ids) * H)
    assert t["markov_w1.weight"].shape == (V, r) and t["markov_w2.weight"].shape == (V, r)
    assert t["conf_proj.weight"].shape == (1, H + r) and t["conf_proj.bias"].dtype == torch.float32
    assert "blk.1.attn_q_norm.weight" in t and "enc.output_norm.weight" in t
    assert "token_embd.weight" not in t and "output.weight" not in t  # the target's, shared
    assert meta["dflash.target_layers"] == [i + 1 for i in drafter.config.target_layer_ids]
    assert meta["dflash.sample_from_anchor"] is True and meta["dflash.has_confidence_head"] is True
    assert meta["tokenizer.ggml.mask_token_id"] == MASK_ID and meta["tokenizer.ggml.model"] == "gpt2"
    assert torch.equal(t["markov_w1.weight"], drafter.markov_head.markov_w1.weight.detach())


def test_a_reduced_vocabulary_writes_absolute_d2t_and_its_own_head(target):
    ids = torch.tensor([5, 0, 9, 100, 3, 77, 64, 12])
    drafter = build("dspark_markov", target, draft_vocab_size=len(ids))
    drafter.draft_ids.copy_(ids)
    t = _content(drafter, target).content.tensors
    assert t["d2t"].dtype == torch.int64 and torch.equal(t["d2t"], drafter.draft_ids)
    assert t["output.weight"].shape == (len(ids), drafter.dims.hidden_size)
    assert t["markov_w2.weight"].shape[0] == len(ids)


def test_a_confidence_head_on_h_alone_reads_a_zero_markov_part(target):
    drafter = build("dspark_markov", target, confidence_head_with_markov=False)
    w = _content(drafter, target).content.tensors["conf_proj.weight"]
    H = drafter.dims.hidden_size
    assert w.shape == (1, H + 8) and not w[:, H:].any()
    assert torch.equal(w[:, :H], drafter.confidence_head.proj.weight.detach())


def test_dflash_names_the_spec_type_that_reads_its_layout(target):
    draft = _content(build("dflash", target), target)
    assert draft.spec_type == "draft-dspark" and "markov_w1.weight" not in draft.content.tensors
    assert any("--spec-type draft-dspark" in n for n in draft.notes)


@pytest.mark.parametrize(
    ("name", "overrides", "match"),
    [
        ("dspark_rnn", {}, "vanilla Markov head only"),
        ("eagle3", {}, "does not write its eagle3 layout"),
        (
            "eagle3",
            {"target_layer_ids": [0, 1, 2, 3]},
            "fuses exactly 3 target layers, and this Eagle3 drafter fuses 4",
        ),
        ("dflash", {"draft_qk_norm": False}, "RMS-normalize q and k"),
        ("dflash", {"mask_embedding": True}, "mask as a token"),
    ],
)
def test_what_llamacpp_cannot_run_is_refused_in_one_line(target, name, overrides, match):
    drafter = build(name, target)
    with pytest.raises(
        ExportError, match=rf"^llama\.cpp cannot load this drafter \(--format gguf\): .*{match}"
    ):
        _content(drafter, target, **overrides)


def test_gemma_scaling_is_refused(target):
    drafter = build("dflash", target)
    drafter.dims = dataclasses.replace(drafter.dims, embed_scale=2.0)
    with pytest.raises(ExportError, match="neither scales embeddings"):
        _content(drafter, target)


def test_the_file_reads_back_bit_identical(target, tmp_path):
    drafter = build("dspark_markov", target)
    content = _content(drafter, target).content
    content.tensors = {k: v.to(torch.bfloat16) if v.dim() > 1 else v for k, v in content.tensors.items()}
    write_gguf(tmp_path / "d.gguf", content)
    back = read_gguf(tmp_path / "d.gguf")
    assert back.metadata["general.architecture"] == "dflash"
    assert back.tensor_types["fc.weight"] == "BF16" and back.tensor_types["conf_proj.bias"] == "F32"
    for name, t in content.tensors.items():
        assert torch.equal(back.tensors[name], t), name
    assert back.metadata["tokenizer.ggml.tokens"][:2] == ["t0", "t1"]


def test_a_target_dspark_cannot_write_is_refused_with_the_reason(tmp_path):
    import json

    from dspark.formats.export.gguf_target import target_content

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(
        ExportError, match=r"^llama\.cpp cannot load this drafter .*Qwen3 targets only, not 'llama'"
    ):
        target_content(tmp_path)
