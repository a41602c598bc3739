"""The shared draft layer (DESIGN §5.1): a Qwen3 decoder layer, plus KV injection (paper Eq. 3)."""

from __future__ import annotations

import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding

from dspark.drafters.attention import rope_cos_sin
from dspark.drafters.common import DecoderDims, DraftDecoderLayer, init_weights
from dspark.drafters.request_state import ContextKV

DIMS = DecoderDims(
    vocab_size=32, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=8
)


def layer(seed: int = 0) -> DraftDecoderLayer:
    torch.manual_seed(seed)
    m = DraftDecoderLayer(DIMS)
    init_weights(m, 0.2)
    with torch.no_grad():  # non-trivial norm weights, so a skipped norm shows
        for name, p in m.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return m.eval()


def test_layer_without_context_is_a_qwen3_decoder_layer():
    """Same weights, causal mask, no injected context: HF's Qwen3DecoderLayer output."""
    ours = layer()
    config = Qwen3Config(
        vocab_size=32, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, rms_norm_eps=1e-6, attn_implementation="eager",
    )  # fmt: skip
    hf = Qwen3DecoderLayer(config, layer_idx=0).eval()
    hf.load_state_dict(ours.state_dict())
    B, T = 2, 6
    h = torch.randn(B, T, 32)
    positions = torch.arange(3, 3 + T).expand(B, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril().expand(B, 1, T, T)
    cos, sin = rope_cos_sin(positions, 8, 10000.0)
    ref_cos, ref_sin = Qwen3RotaryEmbedding(config)(h, positions)
    torch.testing.assert_close(cos, ref_cos, atol=1e-6, rtol=0)
    additive = torch.zeros(B, 1, T, T).masked_fill(~causal, float("-inf"))
    with torch.no_grad():
        expected = hf(h, attention_mask=additive, position_embeddings=(ref_cos, ref_sin))
        actual = ours(h, cos, sin, None, None, causal)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def reference_injected_layer(m: DraftDecoderLayer, h, h_ctx, pos, ctx_pos):
    """Eq. 3 written out: K = [W_K H_ctx ; W_K H_d], queries from the block, plain softmax attention."""
    attn = m.self_attn
    nh, nkv, hd = 4, 2, 8

    def heads(x, n):  # [T, n*hd] -> [n, T, hd]
        return x.view(x.shape[0], n, hd).transpose(0, 1)

    def rope(x, p):
        cos, sin = rope_cos_sin(p.unsqueeze(0), hd, 10000.0)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    hn = m.input_layernorm(h)  # [T, H]; the context is *not* normed by the layer
    q = rope(attn.q_norm(heads(attn.q_proj(hn), nh)), pos)  # [nh, T, hd]
    k = torch.cat([rope(attn.k_norm(heads(attn.k_proj(h_ctx), nkv)), ctx_pos),
                   rope(attn.k_norm(heads(attn.k_proj(hn), nkv)), pos)], dim=1)  # fmt: skip
    v = torch.cat([heads(attn.v_proj(h_ctx), nkv), heads(attn.v_proj(hn), nkv)], dim=1)  # [nkv, C+T, hd]
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    weights = torch.softmax(q @ k.transpose(1, 2) / hd**0.5, dim=-1)  # [nh, T, C+T], bidirectional
    out = (weights @ v).transpose(0, 1).reshape(h.shape[0], nh * hd)
    h = h + attn.o_proj(out)
    return h + m.mlp(m.post_attention_layernorm(h))


def test_kv_injection_matches_eq3():
    m = layer(1)
    C, T = 5, 3
    h_ctx, h = torch.randn(C, 32), torch.randn(T, 32)
    ctx_pos, pos = torch.arange(C), torch.arange(C, C + T)
    cos_c, sin_c = rope_cos_sin(ctx_pos.unsqueeze(0), 8, 10000.0)
    cos, sin = rope_cos_sin(pos.unsqueeze(0), 8, 10000.0)
    with torch.no_grad():
        ctx_k, ctx_v = m.context_kv(h_ctx.unsqueeze(0), cos_c, sin_c)
        actual = m(h.unsqueeze(0), cos, sin, ctx_k, ctx_v, None)[0]
        expected = reference_injected_layer(m, h, h_ctx, pos, ctx_pos)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_context_kv_grows_in_place():
    cache = ContextKV(2, 2, 4, dtype=torch.float32, device="cpu")
    chunks = [torch.randn(2, 2, 2, n, 4) for n in (40, 1, 30, 7)]  # crosses the initial 64 capacity
    for c in chunks:
        cache.append(c)
    assert cache.length == 78
    torch.testing.assert_close(cache.view(), torch.cat(chunks, dim=3), atol=0, rtol=0)
