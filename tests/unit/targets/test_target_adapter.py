"""The target adapter against a plain HF forward over the whole sequence (DESIGN §4).

Every family: incremental forwards on the adapter's cache (prefill, extensions,
rollbacks) must give the logits, features and hidden states that one HF forward over
the full sequence gives.
"""

from __future__ import annotations

import pytest
import torch

from dspark.targets import FamilyQuirks, TargetAdapter

ATOL = 1e-5
VOCAB = 128  # the tiny models of tests/conftest.py
FAMILIES = ["tiny_qwen3", "tiny_llama", "tiny_gemma", "tiny_gemma3"]
LAYER_IDS = (-1, 0, 2)  # embeddings, first and second-to-last of 4 layers


@pytest.fixture(params=FAMILIES)
def model(request):
    return request.getfixturevalue(request.param)


def hf_reference(model, ids):
    """Plain HF forward over the full sequence: (logits [B,T,V], hidden_states n+1 x [B,T,H])."""
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    return out.logits.float(), out.hidden_states


def hf_features(hidden_states, layer_ids):
    """HF hidden_states[i + 1] is the output of layer i; hidden_states[0] the embeddings."""
    return torch.stack([hidden_states[i + 1] for i in layer_ids], dim=2)  # [B, T, L, H]


def tokens(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, n), generator=g)


def test_prefill_matches_hf(model):
    adapter = TargetAdapter(model, target_layer_ids=LAYER_IDS)
    ids = tokens(12)
    logits, hs = hf_reference(model, ids)

    cache = adapter.new_cache()
    out = adapter.forward(ids, cache)

    assert out.logits.dtype == torch.float32 and out.logits.shape == (1, 12, adapter.vocab_size)
    assert out.features.shape == (1, 12, len(LAYER_IDS), adapter.hidden_size)
    torch.testing.assert_close(out.logits, logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.features, hf_features(hs, LAYER_IDS), atol=ATOL, rtol=0)
    torch.testing.assert_close(out.hidden, hs[-1], atol=ATOL, rtol=0)  # HF's last state is normed
    assert cache.length == 12


def test_extensions_match_hf(model):
    adapter = TargetAdapter(model, target_layer_ids=LAYER_IDS)
    ids = tokens(15)
    logits, hs = hf_reference(model, ids)

    cache = adapter.new_cache()
    outs = [adapter.forward(ids[:, a:b], cache) for a, b in [(0, 10), (10, 14), (14, 15)]]

    torch.testing.assert_close(torch.cat([o.logits for o in outs], 1), logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(
        torch.cat([o.features for o in outs], 1), hf_features(hs, LAYER_IDS), atol=ATOL, rtol=0
    )
    torch.testing.assert_close(torch.cat([o.hidden for o in outs], 1), hs[-1], atol=ATOL, rtol=0)
    assert cache.length == 15


def test_rollback_then_extend_matches_hf(model):
    """Prefill 12, verify 5, accept 2 (roll back to 14), continue with 3 *different* tokens."""
    adapter = TargetAdapter(model, target_layer_ids=LAYER_IDS)
    first, new = tokens(17, seed=1), tokens(3, seed=2)
    assert not torch.equal(first[:, 14:], new)  # stale KV of the rejected tail would show
    cache = adapter.new_cache()
    adapter.forward(first[:, :12], cache)
    adapter.forward(first[:, 12:17], cache)

    adapter.rollback(cache, 14)
    assert cache.length == 14
    out = adapter.forward(new, cache)

    full = torch.cat([first[:, :14], new], dim=1)  # the 17 tokens the cache now holds
    logits, hs = hf_reference(model, full)
    torch.testing.assert_close(out.logits, logits[:, 14:], atol=ATOL, rtol=0)
    torch.testing.assert_close(out.features, hf_features(hs, LAYER_IDS)[:, 14:], atol=ATOL, rtol=0)
    assert cache.length == 17


def test_rollback_to_zero_is_a_fresh_cache(tiny_gemma):
    adapter = TargetAdapter(tiny_gemma)
    ids = tokens(9)
    cache = adapter.new_cache()
    adapter.forward(tokens(7, seed=5), cache)
    adapter.rollback(cache, 0)
    torch.testing.assert_close(
        adapter.forward(ids, cache).logits, hf_reference(tiny_gemma, ids)[0], atol=ATOL, rtol=0
    )


def test_rollback_past_the_end_raises(tiny_qwen3):
    adapter = TargetAdapter(tiny_qwen3)
    cache = adapter.new_cache()
    adapter.forward(tokens(4), cache)
    with pytest.raises(ValueError, match="roll back"):
        adapter.rollback(cache, 5)
    with pytest.raises(ValueError, match="roll back"):
        adapter.rollback(cache, -1)


def test_batch_of_two_matches_hf_per_row(tiny_qwen3):
    adapter = TargetAdapter(tiny_qwen3)
    ids = torch.cat([tokens(6, seed=7), tokens(6, seed=8)])  # [2, 6]
    cache = adapter.new_cache()
    out = torch.cat([adapter.forward(ids[:, :4], cache).logits, adapter.forward(ids[:, 4:], cache).logits], 1)
    for r in range(2):
        torch.testing.assert_close(
            out[r : r + 1], hf_reference(tiny_qwen3, ids[r : r + 1])[0], atol=ATOL, rtol=0
        )


def test_without_features(tiny_qwen3):
    adapter = TargetAdapter(tiny_qwen3)
    ids = tokens(5)
    out = adapter.forward(ids, adapter.new_cache(), with_features=False)
    assert out.features is None
    torch.testing.assert_close(out.logits, hf_reference(tiny_qwen3, ids)[0], atol=ATOL, rtol=0)


def test_forward_leaves_no_hooks(tiny_qwen3):
    adapter = TargetAdapter(tiny_qwen3, target_layer_ids=LAYER_IDS)
    adapter.forward(tokens(3), adapter.new_cache())
    for layer in tiny_qwen3.model.layers:
        assert not layer._forward_hooks and not layer._forward_pre_hooks


def test_forward_past_max_context_raises(tiny_llama):
    adapter = TargetAdapter(tiny_llama)
    with pytest.raises(ValueError, match="exceeds"):
        adapter.forward(tokens(adapter.max_context + 1), adapter.new_cache())


def test_lm_head_of_final_norm_of_last_layer_is_logits(model):
    """The shared pieces compose to the target: lm_head(final_norm(raw last layer)) == logits."""
    adapter = TargetAdapter(model)
    raw = {}
    handle = model.get_decoder().layers[-1].register_forward_hook(lambda m, a, o: raw.setdefault("h", o))
    try:
        out = adapter.forward(tokens(8), adapter.new_cache())
    finally:
        handle.remove()
    torch.testing.assert_close(adapter.final_norm(raw["h"]), out.hidden, atol=ATOL, rtol=0)
    torch.testing.assert_close(adapter.lm_head(adapter.final_norm(raw["h"])), out.logits, atol=ATOL, rtol=0)


def test_embed_matches_model_input_embeddings(model):
    adapter = TargetAdapter(model)
    ids = tokens(6)
    emb = adapter.embed(ids)  # [1, 6, H]
    torch.testing.assert_close(emb, model.get_input_embeddings()(ids))
    torch.testing.assert_close(emb, hf_reference(model, ids)[1][0])  # what layer 0 sees
    weight = model.get_input_embeddings().weight
    torch.testing.assert_close(emb, weight[ids] * adapter.quirks.embed_scale)


def test_gemma_quirks_are_applied(tiny_gemma):
    adapter = TargetAdapter(tiny_gemma)
    assert adapter.quirks.embed_scale == pytest.approx(8.0)  # sqrt(64)
    assert adapter.quirks.final_logit_softcapping == 2.0
    ids = tokens(4)
    raw = tiny_gemma.get_input_embeddings().weight[ids]
    assert not torch.allclose(adapter.embed(ids), raw)  # the scale is really there
    logits = adapter.forward(ids, adapter.new_cache()).logits
    assert logits.abs().max() < 2.0  # softcapped
    uncapped = tiny_gemma.lm_head(adapter.forward(ids, adapter.new_cache()).hidden)
    assert uncapped.abs().max() > 2.0  # ... and the cap is binding on this model


def test_wrong_embed_scale_fails_loudly(tiny_gemma, monkeypatch):
    monkeypatch.setattr("dspark.targets.adapter.quirks_for", lambda config: FamilyQuirks(family="gemma2"))
    with pytest.raises(ValueError, match="embedding scale"):
        TargetAdapter(tiny_gemma)


def test_attributes(tiny_qwen3, tiny_tokenizer):
    tiny_qwen3.generation_config.eos_token_id = [2, 5]
    adapter = TargetAdapter(tiny_qwen3, tiny_tokenizer)
    assert (adapter.vocab_size, adapter.hidden_size, adapter.num_layers) == (128, 64, 4)
    assert adapter.max_context == 256
    assert adapter.target_layer_ids == (0, 1, 2)  # default_layer_ids(4)
    assert adapter.eos_token_ids == (2, 5)
    assert adapter.device == torch.device("cpu") and adapter.dtype == torch.float32
    assert adapter.quirks.has_qk_norm and adapter.quirks.family == "qwen3"
    assert not tiny_qwen3.training
    assert not any(p.requires_grad for p in tiny_qwen3.parameters())


@pytest.mark.parametrize("bad", [(3,), (-2,), (1, 1)])
def test_invalid_layer_ids_rejected(tiny_qwen3, bad):
    with pytest.raises(ValueError, match="target_layer_ids"):
        TargetAdapter(tiny_qwen3, target_layer_ids=bad)
