"""Every family of the table (DESIGN §4): layout, dims, and lossless decoding through every drafter.

For seeded tiny random-init targets of Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3,
Phi-3, GPT-2 and GPT-NeoX: the adapter's incremental forward equals HF's full forward,
and greedy speculative decoding with n-gram and briefly trained DFlash / DSpark / Eagle3
equals ``model.generate(do_sample=False)``.
"""

from __future__ import annotations

import pytest
import torch

from dspark.decoding import speculative_generate
from dspark.drafters.common import DecoderDims
from dspark.drafters.ngram import NgramDrafter
from dspark.engine import Engine, EngineConfig
from dspark.errors import UnsupportedTargetError
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter
from dspark.targets.families import layout_for
from tests.unit.drafters.builders import build, prompt
from tests.unit.drafters.test_conformance import fit_to_target, plain_greedy

from .families_zoo import FAMILIES, build_model, build_target

N = 40
GREEDY = SamplingParams(temperature=0.0, max_tokens=N)


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_incremental_forward_matches_hf(family):
    target = build_target(family)
    ids = torch.tensor([prompt(14, seed=5)])
    with torch.no_grad():
        ref = target.model(ids, output_hidden_states=True)
    cache = target.new_cache()
    first, rest = target.forward(ids[:, :9], cache), target.forward(ids[:, 9:], cache)
    logits = torch.cat([first.logits, rest.logits], dim=1)
    features = torch.cat([first.features, rest.features], dim=1)  # [1, T, L, H]
    expected = torch.stack([ref.hidden_states[i + 1] for i in target.target_layer_ids], dim=2)
    torch.testing.assert_close(logits, ref.logits.float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(features, expected, atol=1e-5, rtol=0)


def test_dims_and_draft_layer_details_follow_the_family(family):
    target = build_target(family)
    dims = DecoderDims.from_target(target)
    assert (dims.hidden_size, dims.vocab_size, dims.num_heads) == (64, 128, 4)
    assert dims.intermediate_size == (256 if family == "gpt2" else 128)  # GPT-2: n_inner None -> 4H
    assert dims.qk_norm == (family in ("qwen3", "gemma3_text"))
    assert dims.activation == {"gpt2": "gelu_new", "gpt_neox": "gelu"}.get(
        family, "gelu_pytorch_tanh" if family.startswith("gemma") else "silu"
    )
    assert dims.embed_scale == pytest.approx(8.0 if family.startswith("gemma") else 1.0)
    family_layer = build("dflash", target, qk_norm=None).layers[0]  # draft layers as the family's
    assert (family_layer.self_attn.q_norm is not None) == dims.qk_norm
    assert family_layer.mlp.act.__class__.__name__ == type(build("dflash", target).layers[0].mlp.act).__name__
    assert build("dflash", target).layers[0].self_attn.q_norm is not None  # default: DeepSpec's Qwen3 layer


@pytest.mark.parametrize("name", ["ngram", "dflash", "dspark_markov", "eagle3"])
def test_greedy_equals_hf_generate(family, name):
    target = build_target(family)
    if name == "ngram":
        drafter, ids = NgramDrafter(target.vocab_size), (prompt(5, seed=2) * 3)
    else:
        drafter, ids = fit_to_target(build(name, target).train(), target, steps=15), prompt(6, seed=1)
    result = speculative_generate(target, drafter, ids, GREEDY)
    assert result.token_ids == plain_greedy(target, ids, N)
    assert sum(r.proposed for r in result.rounds) > 0


def test_batched_engine_greedy_equals_hf_generate(family):
    target = build_target(family)
    ids = prompt(5, seed=4) * 3
    if family == "gemma2":  # attention softcapping: refused by the batched engine, by name
        with pytest.raises(UnsupportedTargetError, match="gemma2"):
            Engine(target, None, EngineConfig(payoff=False, policy="fixed", max_batch=1, max_seq_len=128))
        return
    engine = Engine(
        target,
        NgramDrafter(target.vocab_size),
        EngineConfig(payoff=False, policy="fixed", max_batch=1, max_seq_len=128),
    )
    assert engine.generate([ids], GREEDY)[0].token_ids == plain_greedy(target, ids, N)


def test_dspark_trains_for_a_target_without_mask_token(family):
    """No tokenizer mask token: the drafter learns its own mask input, saved with it."""
    target = build_target(family)
    assert getattr(target.tokenizer, "mask_token_id", None) is None
    drafter = build("dspark_markov", target, mask_token_id=None, mask_embedding=True)
    assert drafter.mask_token_id is None and "mask_embedding" in drafter.state_dict()
    before = drafter.mask_embedding.detach().clone()
    drafter = fit_to_target(drafter.train(), target, steps=15)
    assert not torch.equal(drafter.mask_embedding.detach(), before)  # it trained
    ids = prompt(6, seed=1)
    result = speculative_generate(target, drafter, ids, GREEDY)
    assert result.token_ids == plain_greedy(target, ids, N)
    assert sum(r.accepted for r in result.rounds) > 0


def test_unsupported_layout_names_the_model_type():
    import transformers as hf

    model = hf.OPTForCausalLM(
        hf.OPTConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, ffn_dim=64, num_attention_heads=2,
                     word_embed_proj_dim=32, max_position_embeddings=64)
    )  # fmt: skip
    with pytest.raises(UnsupportedTargetError, match="unsupported target model type 'opt'"):
        TargetAdapter(model)


def test_a_missing_module_is_a_one_line_error_naming_the_type():
    model = build_model("llama")
    del model.model.norm
    with pytest.raises(UnsupportedTargetError, match="'llama'.*model.norm"):
        TargetAdapter(model)


def test_table_rows_resolve_to_real_modules(family):
    model = build_model(family)
    layout = layout_for(model.config)
    target = TargetAdapter(model)
    assert target.num_layers == 4 and target._head is model.get_output_embeddings()
    assert target._embedding is model.get_input_embeddings(), layout.embedding


@pytest.mark.parametrize(
    ("overrides", "why"),
    [({"mask_token_id": None, "mask_embedding": True}, "learned its own mask embedding"),
     ({"qk_norm": None}, "q/k-norm False")],
)  # fmt: skip
def test_engine_exports_refuse_what_their_qwen3_class_cannot_hold(tmp_path, overrides, why):
    """A learned mask input or family-style (no q/k-norm) draft layers: refused for vLLM, ours for hf."""
    import json

    from dspark.formats.export import ExportError, export_drafter
    from dspark.formats.folder import load_drafter

    target = build_target("llama")
    drafter = build("dspark_markov", target, **overrides)
    with pytest.raises(ExportError, match=why):
        export_drafter(drafter, target, tmp_path / "vllm", fmt="vllm")
    out = export_drafter(drafter, target, tmp_path / "hf", fmt="hf")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DsparkFamilyDraftModel"]
    again = load_drafter(out, target)  # and our own loader takes it back as it was
    mine, theirs = drafter.state_dict(), again.state_dict()
    assert mine.keys() == theirs.keys()  # mask_embedding included when learned
    assert all(torch.allclose(mine[k], theirs[k].float(), rtol=1e-2, atol=1e-2) for k in mine)  # bf16 export
    assert (again.mask_token_id, again.dims.qk_norm) == (drafter.mask_token_id, drafter.dims.qk_norm)


def test_without_mask_token_the_default_is_the_unknown_token_else_a_one_line_choice(tiny_tokenizer):
    from dspark.drafters.mask import MaskTokenError

    model = build_model("llama")
    with pytest.raises(MaskTokenError, match="--mask-token TOKEN .* --mask-token learned"):
        build("dflash", TargetAdapter(model, tiny_tokenizer), mask_token_id=None)  # its unk is the pad token
    tiny_tokenizer.unk_token = "w127"
    assert build("dflash", TargetAdapter(model, tiny_tokenizer), mask_token_id=None).mask_token_id == 127
