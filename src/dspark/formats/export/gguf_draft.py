"""``--format gguf``: a DSpark / DFlash drafter as the draft GGUF llama.cpp serves.

The names and keys are llama.cpp's (sources vendored in ``llama-cpp-python==0.3.36``:
``gguf-py/gguf/constants.py``, ``src/models/dflash.cpp``, ``common/speculative.cpp``),
checked by its own binaries in ``tests/interop/test_llamacpp_*.py``:

- Architecture ``dflash``; draft layers are Qwen3 layers with q/k RMS norms
  (``blk.N.attn_q_norm`` is required), ``fc`` + ``enc.output_norm`` fuse the target's
  features, ``output_norm`` is the final norm. The target's embedding and (for the full
  vocabulary) LM head are not copied: llama.cpp shares the target's (``ctx_other``), which
  are the very weights the drafter was trained against.
- ``dflash.target_layers`` lists the target layers whose *input* llama.cpp captures, in the
  order ``fc`` reads them: our id ``i`` (output of layer ``i``) is its ``i + 1``.
- DSpark heads: ``markov_w1 {r, V}``, ``markov_w2 {r, N}``, ``conf_proj {H + r, 1}`` (+ bias),
  the confidence reading ``[h_k ; W_1[x_{k-1}]]`` (paper Eq. 7) as ours does.
- A reduced draft vocabulary: ``d2t`` (I64, absolute target ids, one per draft row) and the
  draft's own ``output {H, N}``.
- ``dflash.sample_from_anchor = true``: slot 0 (the anchor) predicts the first draft, which
  llama.cpp reads only with ``--spec-type draft-dspark``. It picks that type by itself for a
  file with a Markov head; a DFlash drafter (no Markov head) needs the flag, or llama.cpp
  would read it as z-lab's bonus-anchor DFlash (SERVE.md says so).

What llama.cpp cannot represent is refused (:func:`gguf_problems`): an RNN Markov head,
draft layers without q/k norm, a learned mask embedding, Gemma-style scaling or softcaps,
Eagle3 (llama.cpp's ``eagle3`` graph fuses exactly 3 target layers, dspark's shipped
Eagle3 drafters 5, and dspark does not write that graph's layout). STS temperatures (DESIGN §8) have no
place in the file: ``--spec-draft-p-min`` then thresholds the uncalibrated confidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dspark.formats.export.gguf_file import (
    FILE_TYPES,
    LAYER_NAMES,
    GgufContent,
    as_dtype,
    tokenizer_metadata,
)
from dspark.formats.export.layouts import ExportError

ARCH = "dflash"
ENGINE = "llama.cpp"
_TOP_NAMES = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "markov_head.markov_w1.weight": "markov_w1.weight",
    "markov_head.markov_w2.weight": "markov_w2.weight",
    "confidence_head.proj.weight": "conf_proj.weight",
    "confidence_head.proj.bias": "conf_proj.bias",
}
_SHARED = ("embed_tokens.weight",)  # read from the target by llama.cpp (ctx_other)
HIDDEN_ACTS = ("silu", "gelu", "gelu_pytorch_tanh")  # what dflash.cpp's load_arch_hparams accepts


def refuse(why: str) -> ExportError:
    return ExportError(f"{ENGINE} cannot load this drafter (--format gguf): {why}")


@dataclass(frozen=True)
class DraftGguf:
    """The draft file's content and the caveats SERVE.md repeats."""

    content: GgufContent
    spec_type: str  # the --spec-type that reads it right
    notes: tuple[str, ...]


def gguf_problems(config: dict[str, Any], dims) -> str | None:
    """Why llama.cpp's ``dflash`` graph cannot run this drafter (None: it can)."""
    method = config.get("dspark_method")
    if method == "eagle3":
        n = len(config.get("target_layer_ids") or ())
        if n != 3:  # src/models/eagle3.cpp: "EAGLE3 requires exactly 3 entries in 'extract_layers'"
            return f"its eagle3 graph fuses exactly 3 target layers, and this Eagle3 drafter fuses {n}"
        return "dspark does not write its eagle3 layout yet; serve this Eagle3 drafter with vLLM or SGLang"
    if method not in ("dspark", "dflash"):
        return f"it has no graph for dspark's {method!r} drafters"
    if config.get("markov_rank", 0) > 0 and config.get("markov_head_type", "vanilla") != "vanilla":
        return f"its DSpark graph has the vanilla Markov head only, not {config['markov_head_type']!r}"
    if not config.get("draft_qk_norm", True):
        return "its DFlash layers always RMS-normalize q and k per head, and this drafter was trained without"
    if config.get("mask_embedding"):
        return "it feeds the mask as a token of the vocabulary, and this drafter learned its own mask vector"
    if dims.embed_scale != 1.0 or dims.logit_softcap is not None:
        return (
            "its DSpark/DFlash graph neither scales embeddings nor softcaps logits as this target family does"
        )
    if dims.activation not in HIDDEN_ACTS:
        return f"its DFlash MLP has no {dims.activation!r} activation"
    return None


def _tensor_name(key: str) -> str | None:
    if key in _TOP_NAMES:
        return _TOP_NAMES[key]
    if key in _SHARED:
        return None
    parts = key.split(".")
    if parts[0] == "layers" and ".".join(parts[2:-1]) in LAYER_NAMES:
        return f"blk.{parts[1]}.{LAYER_NAMES['.'.join(parts[2:-1])]}.{parts[-1]}"
    raise refuse(f"it has a weight {key!r} that the dflash graph does not read")


def draft_tensors(state: dict[str, Tensor], config: dict[str, Any], dtype_name: str) -> dict[str, Tensor]:
    """llama.cpp name → tensor (export dtype; vectors F32, ``d2t`` I64) of a drafter ``state_dict``."""
    out: dict[str, Tensor] = {}
    reduced = "draft_ids" in state
    for key, value in state.items():
        if key == "draft_ids":
            out["d2t"] = value.to(torch.int64)  # absolute target id of each draft row
            continue
        if key == "lm_head.weight":
            if reduced:  # the draft's own rows; the full head is the target's
                out["output.weight"] = as_dtype(value, dtype_name)
            continue
        name = _tensor_name(key)
        if name is not None:
            out[name] = as_dtype(value, dtype_name)
    if "markov_w1.weight" in out and "conf_proj.weight" in out:
        conf = out["conf_proj.weight"]  # [1, H (+ r)]: llama.cpp always reads [h ; W_1[x]]
        H, r = out["output_norm.weight"].shape[0], out["markov_w1.weight"].shape[1]
        if conf.shape[1] == H:  # a confidence head on h alone: zero weight on W_1[x], the same map
            out["conf_proj.weight"] = torch.cat([conf, conf.new_zeros(1, r)], dim=1)
    elif "conf_proj.weight" in out:  # no Markov head: llama.cpp loads no confidence head
        del out["conf_proj.weight"], out["conf_proj.bias"]
    return out


def draft_content(
    state: dict[str, Tensor],
    config: dict[str, Any],
    dims,
    *,
    tokenizer_source,
    context_length: int,
    dtype_name: str,
    name: str,
) -> DraftGguf:
    """The draft GGUF of a drafter (``state``: its ``state_dict``; ``config``: its config.json
    fields); ``tokenizer_source``: a :class:`~dspark.formats.export.gguf_file.GgufRead` or
    content of the target, whose ``tokenizer.*`` keys llama.cpp compares with the draft's."""
    why = gguf_problems(config, dims)
    if why is not None:
        raise refuse(why)
    tensors = draft_tensors(state, config, dtype_name)
    has_markov = "markov_w1.weight" in tensors
    has_conf = "conf_proj.weight" in tensors
    c = GgufContent(arch=ARCH)
    c.put("general.name", name, "STRING")
    c.put("general.file_type", FILE_TYPES[dtype_name], "UINT32")
    c.put("{arch}.block_count", config["num_hidden_layers"], "UINT32")
    c.put("{arch}.context_length", context_length, "UINT32")
    c.put("{arch}.embedding_length", dims.hidden_size, "UINT32")
    c.put("{arch}.feed_forward_length", dims.intermediate_size, "UINT32")
    c.put("{arch}.attention.head_count", dims.num_heads, "UINT32")
    c.put("{arch}.attention.head_count_kv", dims.num_kv_heads, "UINT32")
    c.put("{arch}.attention.key_length", dims.head_dim, "UINT32")
    c.put("{arch}.attention.value_length", dims.head_dim, "UINT32")
    c.put("{arch}.rope.freq_base", float(dims.rope_theta), "FLOAT32")
    c.put("{arch}.attention.layer_norm_rms_epsilon", float(dims.rms_norm_eps), "FLOAT32")
    if dims.activation != "silu":
        c.put("{arch}.hidden_activation", dims.activation, "STRING")
    c.put("{arch}.block_size", int(config["block_size"]), "UINT32")
    # llama.cpp captures the *input* of each listed layer: our id (an output) + 1.
    c.put("{arch}.target_layers", [int(i) + 1 for i in config["target_layer_ids"]], "ARRAY", "INT32")
    c.put("{arch}.sample_from_anchor", True, "BOOL")
    c.put("{arch}.has_confidence_head", has_conf, "BOOL")
    source = tokenizer_source.metadata if isinstance(tokenizer_source, GgufContent) else None
    tokenizer = source if source is not None else tokenizer_metadata(tokenizer_source)
    for key, (value, kind, item) in tokenizer.items():
        if key.startswith("tokenizer."):
            c.metadata[key] = (value, kind, item)
    c.put("tokenizer.ggml.mask_token_id", int(config["mask_token_id"]), "UINT32")
    c.tensors.update(tensors)
    notes = []
    if not has_markov:
        notes.append(
            "This DFlash drafter predicts from the anchor slot (DeepSpec's layout): serve it with "
            "`--spec-type draft-dspark`. Without the flag llama.cpp picks `draft-dflash`, which reads "
            "z-lab's bonus-anchor layout and would draft the wrong slots."
        )
    if config.get("enable_confidence_head") and not has_conf:
        notes.append(
            "llama.cpp loads a confidence head only beside a Markov head: this drafter's is left "
            "out, so `--spec-draft-p-min` must stay 0."
        )
    if has_conf and config.get("sts_temperatures"):
        notes.append(
            "llama.cpp has no STS temperatures: `--spec-draft-p-min` thresholds the uncalibrated "
            "confidence of each slot."
        )
    return DraftGguf(c, "draft-dspark", tuple(notes))
