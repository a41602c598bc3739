"""The interop matrix: every method × format exported from seeded tiny targets, with references.

Each case is one drafter (method + target + settings) exported in one format, fp32. An
export that a format refuses is recorded with its one-line reason. For every export
this module also writes ``reference.safetensors``: random inputs and *our* drafter's
outputs on them (context K/V per layer, LM head, Markov bias, confidence, Eagle3's fc,
entry K/V and final norm), which :mod:`tests.interop.vllm_check` recomputes with vLLM's
modules in its own virtualenv.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from dspark.drafters.attention import rope_cos_sin
from dspark.drafters.dflash import DFlashConfig, DFlashDrafter
from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
from dspark.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from dspark.formats.export import LAYOUTS, ExportError, export_drafter
from dspark.targets import TargetAdapter

DIMS = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
)
MASK_ID, BLOCK, CONTEXT, ROWS = 127, 4, 11, 6
DRAFT_VOCAB = 64  # N of the reduced-vocabulary rows (d2t, issue 16; vLLM pads heads to 64 rows)
STS = (1.5, 1.25, 1.0)  # fewer than BLOCK: the last one repeats (SGLang wants exactly γ)


def _target(family: str) -> TargetAdapter:
    torch.manual_seed(0)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**DIMS))
    elif family == "llama31":  # Llama-3.1 RoPE scaling: the draft layers use plain RoPE
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}
        rope |= {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        model = LlamaForCausalLM(LlamaConfig(**DIMS, rope_parameters=rope))
    elif family == "gemma2":
        model = Gemma2ForCausalLM(
            Gemma2Config(**DIMS, query_pre_attn_scalar=16, sliding_window=6, final_logit_softcapping=2.0)
        )
    else:
        raise ValueError(family)
    model.config._name_or_path = f"tiny-{family}"
    return model.eval()


@dataclass(frozen=True)
class Drafter:
    """One row of the matrix: a method on a target with some settings."""

    name: str
    cls: type
    config: object
    family: str = "qwen3"
    layer_ids: tuple[int, ...] | None = None

    def build(self):
        target = TargetAdapter(_target(self.family), target_layer_ids=self.layer_ids)
        torch.manual_seed(1)
        ids = None
        if getattr(self.config, "draft_vocab_size", None):  # a reduced draft vocabulary: spread ids
            ids = torch.randperm(DIMS["vocab_size"])[: self.config.draft_vocab_size].sort().values
        drafter = self.cls.from_target(target, self.config, draft_ids=ids).eval()
        with torch.no_grad():  # make every head visible (W_2 starts at 0)
            for name, p in drafter.named_parameters():
                if name.startswith(("markov_head.", "confidence_head.")) or name.endswith("bias"):
                    p.normal_(std=0.3)
                elif "norm" in name:
                    p.uniform_(0.5, 1.5)  # distinct per layer: catches a shared K-norm weight
        return drafter, target


def _dspark(**kw) -> DSparkConfig:
    return DSparkConfig(num_layers=2, block_size=BLOCK, mask_token_id=MASK_ID, markov_rank=8, **kw)


DRAFTERS = (
    Drafter("dspark", DSparkDrafter, _dspark(sts_temperatures=STS)),
    Drafter("dspark-rnn", DSparkDrafter, _dspark(markov_head_type="rnn")),
    Drafter("dspark-no-conf", DSparkDrafter, _dspark(enable_confidence_head=False)),
    Drafter("dflash", DFlashDrafter, DFlashConfig(num_layers=2, block_size=BLOCK, mask_token_id=MASK_ID)),
    Drafter("eagle3", Eagle3Drafter, Eagle3Config(block_size=BLOCK), layer_ids=(0, 1, 2)),
    Drafter("eagle3-4-layers", Eagle3Drafter, Eagle3Config(block_size=BLOCK), layer_ids=(-1, 0, 1, 2)),
    Drafter("dspark-llama31-rope", DSparkDrafter, _dspark(), family="llama31"),
    Drafter("dspark-d2t", DSparkDrafter, _dspark(draft_vocab_size=DRAFT_VOCAB)),
    Drafter(
        "dflash-d2t",
        DFlashDrafter,
        DFlashConfig(num_layers=2, block_size=BLOCK, mask_token_id=MASK_ID, draft_vocab_size=DRAFT_VOCAB),
    ),
    Drafter(
        "eagle3-d2t",
        Eagle3Drafter,
        Eagle3Config(block_size=BLOCK, draft_vocab_size=DRAFT_VOCAB),
        layer_ids=(0, 1, 2),
    ),
    Drafter("dspark-gemma2", DSparkDrafter, _dspark(), family="gemma2"),
    Drafter(
        "dflash-unsorted-ids",
        DFlashDrafter,
        DFlashConfig(num_layers=2, block_size=BLOCK, mask_token_id=MASK_ID),
        layer_ids=(2, 0, 1),
    ),
)


@dataclass(frozen=True)
class Case:
    drafter: str
    method: str
    fmt: str
    folder: str | None  # None when refused
    refused: str | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@torch.no_grad()
def block_reference(drafter) -> dict[str, torch.Tensor]:
    """Inputs and our DSpark/DFlash outputs: context K/V per layer, LM head, Markov bias, confidence."""
    g = torch.Generator().manual_seed(2)
    H, L = drafter.dims.hidden_size, len(drafter.target_layer_ids)
    features = torch.randn(CONTEXT, L, H, generator=g)  # [C, L, H]
    positions = torch.arange(CONTEXT)  # [C]
    h_ctx = drafter.backbone.context_features(features).unsqueeze(0)  # [1, C, H]
    cos, sin = rope_cos_sin(positions.unsqueeze(0), drafter.dims.head_dim, drafter.dims.rope_theta)
    ref = {"in.features": features.flatten(1), "in.positions": positions}  # [C, L*H]
    for i, layer in enumerate(drafter.layers):
        k, v = layer.context_kv(h_ctx, cos, sin)  # [1, nkv, C, hd]
        ref[f"out.context_k.{i}"] = k[0].transpose(0, 1).flatten(1)  # [C, nkv*hd]
        ref[f"out.context_v.{i}"] = v[0].transpose(0, 1).flatten(1)
    h = torch.randn(ROWS, H, generator=g)  # [N, H]: final-normed block hidden states
    prev = torch.randint(0, drafter.dims.vocab_size, (ROWS,), generator=g)  # [N]: any target id
    ref |= {"in.h": h, "in.prev": prev, "out.lm_head": drafter.backbone.logits(h)}
    head = getattr(drafter, "markov_head", None)
    if head is not None:
        bias, emb, _ = head.step(prev, h, head.initial_state(ROWS, h))
        ref["out.markov_bias"] = bias.float()  # [N, V]
        conf = getattr(drafter, "confidence_head", None)
        if conf is not None:
            ref["out.confidence"] = torch.sigmoid(drafter._confidence_logits(h, emb))  # [N], before STS
    return ref


@torch.no_grad()
def eagle3_reference(drafter) -> dict[str, torch.Tensor]:
    """Inputs and our Eagle3 outputs: fc, the entry's K/V, final norm, LM head."""
    g = torch.Generator().manual_seed(3)
    H, L = drafter.dims.hidden_size, len(drafter.target_layer_ids)
    features = torch.randn(CONTEXT, L, H, generator=g)  # [C, L, H]
    tokens = torch.randint(0, drafter.dims.vocab_size, (CONTEXT,), generator=g)  # [C]
    positions = torch.arange(CONTEXT)
    fused = drafter.fc(features.flatten(1))  # [C, H]
    layer = drafter.layers[0]
    x = layer.entry_input(drafter.embed_tokens(tokens), fused).unsqueeze(0)  # [1, C, 2H]
    cos, sin = rope_cos_sin(positions.unsqueeze(0), drafter.dims.head_dim, drafter.dims.rope_theta)
    k, v = layer.self_attn.project_kv(x, cos, sin)  # [1, nkv, C, hd]
    h = torch.randn(ROWS, H, generator=g)
    normed = drafter.norm(h)
    return {
        "in.features": features.flatten(1),
        "in.tokens": tokens,
        "in.positions": positions,
        "in.h": h,
        "out.fc": fused,
        "out.entry_k.0": k[0].transpose(0, 1).flatten(1),  # [C, nkv*hd]
        "out.entry_v.0": v[0].transpose(0, 1).flatten(1),
        "out.norm": normed,
        "out.lm_head": drafter.logits(h),  # Eagle3's logits apply the final norm themselves ([N, N_d])
    }


def export_all(root: Path) -> list[Case]:
    """Export every drafter in every format under ``root``; write targets and references."""
    root.mkdir(parents=True, exist_ok=True)
    cases, targets = [], {}
    for spec in DRAFTERS:
        drafter, target = spec.build()
        method = drafter.config.__class__.__name__.removesuffix("Config").lower()
        if spec.family not in targets:  # the target folder vLLM's ModelConfig reads
            targets[spec.family] = root / f"target-{spec.family}"
            target.model.save_pretrained(targets[spec.family])
        reference = eagle3_reference(drafter) if method == "eagle3" else block_reference(drafter)
        for fmt in LAYOUTS:  # the folder formats (gguf: test_llamacpp_*.py)
            out = root / f"{spec.name}.{fmt}"
            try:
                export_drafter(
                    drafter, target, out, fmt=fmt, dtype=torch.float32, target_name=str(targets[spec.family])
                )
            except ExportError as e:
                cases.append(Case(spec.name, method, fmt, None, str(e)))
                continue
            save_file({k: v.contiguous() for k, v in reference.items()}, str(out / "reference.safetensors"))
            cases.append(Case(spec.name, method, fmt, str(out)))
    (root / "cases.json").write_text(json.dumps([c.to_json() for c in cases], indent=1))
    return cases
