"""A GGUF of a target that has none, for llama.cpp to run beside a draft GGUF.

Written for Qwen3-family HF folders whose tokenizer is a byte-level BPE with GPT-2's
pre-tokenizer regex, which is what the embedded tiny target is; anything else is refused
with the reason (llama.cpp's own ``convert_hf_to_gguf.py`` converts it). The names are
llama.cpp's ``qwen3`` architecture (``src/models/qwen3.cpp``: ``token_embd``,
``blk.N.attn_q`` ... ``output_norm``, ``output`` absent when the head is tied), and
the tokenizer is written as its ``gpt2`` vocabulary with pre-tokenizer ``gpt-2``, whose
regex is the one HF's ``ByteLevel(use_regex=True)`` applies. That llama.cpp tokenizes
real prompts to the same ids is pinned by ``tests/interop/test_llamacpp_tokenizer.py``.
The weights are written as F32: exactly the weights dspark computes the target from.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from dspark.formats.export.gguf_file import LAYER_NAMES, GgufContent, write_gguf
from dspark.formats.export.layouts import ExportError

# llama.cpp token types (llama_token_type): normal, control (special added), user-defined.
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4


def refuse_target(why: str) -> ExportError:
    return ExportError(
        f"llama.cpp cannot load this drafter (--format gguf): its draft file carries the target GGUF's "
        f"tokenizer, and dspark writes no GGUF of this target ({why}); it knows SmolLM2's and writes "
        "Qwen3 targets with a byte-level BPE tokenizer, like the embedded tiny one"
    )


def tensor_name(hf_name: str) -> str:
    """llama.cpp's qwen3 name of an HF Qwen3 weight (``model.layers.3.mlp.up_proj.weight`` →
    ``blk.3.ffn_up.weight``)."""
    name = hf_name.removeprefix("model.")
    if name == "embed_tokens.weight":
        return "token_embd.weight"
    if name == "norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    parts = name.split(".")
    if parts[0] == "layers":
        inner, suffix = ".".join(parts[2:-1]), parts[-1]
        if inner in LAYER_NAMES:
            return f"blk.{parts[1]}.{LAYER_NAMES[inner]}.{suffix}"
    raise refuse_target(f"it has a weight {hf_name!r} llama.cpp's qwen3 graph does not read")


def tokenizer_content(folder: Path, content: GgufContent, eos_token_id: int | None) -> None:
    """Add the ``tokenizer.ggml.*`` keys of ``folder/tokenizer.json`` (byte-level BPE) to ``content``."""
    tok = json.loads((folder / "tokenizer.json").read_text())
    model, pre = tok["model"], tok.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback") or model.get("ignore_merges"):
        raise refuse_target("its tokenizer is not a plain byte-level BPE")
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or pre.get("add_prefix_space"):
        raise refuse_target(f"its pre-tokenizer {pre.get('type')!r} is not GPT-2's ByteLevel regex")
    if tok.get("normalizer") is not None:
        raise refuse_target("its tokenizer normalizes text, which llama.cpp's gpt2 vocabulary does not")
    vocab: dict[str, int] = model["vocab"]
    added = {t["id"]: t for t in tok.get("added_tokens", [])}
    n = max([*vocab.values(), *added]) + 1
    tokens = [""] * n
    for text, i in vocab.items():
        tokens[i] = text
    types = [TOKEN_NORMAL] * n
    for i, t in added.items():
        tokens[i] = t["content"]
        types[i] = TOKEN_CONTROL if t.get("special") else TOKEN_USER_DEFINED
    if "" in tokens:
        raise refuse_target("its vocabulary has unused ids")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    content.put("tokenizer.ggml.model", "gpt2", "STRING")
    content.put("tokenizer.ggml.pre", "gpt-2", "STRING")
    content.put("tokenizer.ggml.tokens", tokens, "ARRAY", "STRING")
    content.put("tokenizer.ggml.token_type", types, "ARRAY", "INT32")
    content.put("tokenizer.ggml.merges", merges, "ARRAY", "STRING")
    content.put("tokenizer.ggml.add_bos_token", False, "BOOL")
    content.put("tokenizer.ggml.add_eos_token", False, "BOOL")
    if eos_token_id is not None:
        content.put("tokenizer.ggml.eos_token_id", int(eos_token_id), "UINT32")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    pad = config.get("pad_token")
    if pad is not None and pad in vocab:
        content.put("tokenizer.ggml.padding_token_id", vocab[pad], "UINT32")
    template = folder / "chat_template.jinja"
    if template.is_file():
        content.put("tokenizer.chat_template", template.read_text(), "STRING")


def target_content(folder: Path) -> GgufContent:
    """The GGUF content (llama.cpp ``qwen3``) of the HF target at ``folder``."""
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") != "qwen3":
        raise refuse_target(f"dspark writes Qwen3 targets only, not {config.get('model_type')!r}")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default" or config.get("use_sliding_window"):
        raise refuse_target("it scales RoPE or uses sliding windows, which dspark does not write")
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise refuse_target("its weights are not one model.safetensors file")
    c = GgufContent(arch="qwen3")
    c.put("general.name", folder.name, "STRING")
    c.put("{arch}.block_count", config["num_hidden_layers"], "UINT32")
    c.put("{arch}.context_length", config["max_position_embeddings"], "UINT32")
    c.put("{arch}.embedding_length", config["hidden_size"], "UINT32")
    c.put("{arch}.feed_forward_length", config["intermediate_size"], "UINT32")
    c.put("{arch}.attention.head_count", config["num_attention_heads"], "UINT32")
    c.put("{arch}.attention.head_count_kv", config["num_key_value_heads"], "UINT32")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    c.put("{arch}.attention.key_length", head_dim, "UINT32")
    c.put("{arch}.attention.value_length", head_dim, "UINT32")
    c.put(
        "{arch}.rope.freq_base", float(rope.get("rope_theta", config.get("rope_theta", 10000.0))), "FLOAT32"
    )
    c.put("{arch}.attention.layer_norm_rms_epsilon", float(config["rms_norm_eps"]), "FLOAT32")
    # F32 throughout: dspark computes the target in fp32 from these weights, and ggml's BF16
    # matmul would also round the activations to bf16 (llama-quantize makes smaller files).
    c.put("general.file_type", 0, "UINT32")
    for name, t in load_file(str(weights)).items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        c.tensors[tensor_name(name)] = t.float().contiguous()
    eos = config.get("eos_token_id")
    tokenizer_content(folder, c, eos[0] if isinstance(eos, list) else eos)
    return c


def write_target_gguf(folder: Path, path: Path) -> Path:
    """Write the GGUF of the HF target at ``folder`` to ``path``; return ``path``."""
    write_gguf(path, target_content(folder))
    return path
