"""What each export format writes, and what each engine cannot represent (DESIGN §5.4, §14).

A layout turns our ``config.json`` fields and ``state_dict`` into the files one consumer
reads. The facts below were read from the engines' own code (vLLM 0.32, SGLang 0.5.23,
speculators 0.9) and are checked against vLLM's loader by ``tests/interop``:

- **Draft layers.** ``num_hidden_layers`` is the drafter's, so ``layer_types`` has one
  entry per draft layer (transformers 5 refuses anything else); RoPE is written as the
  draft layers apply it (plain, ``rope_theta`` of the target, no scaling); the MLP is
  SwiGLU (``hidden_act = silu``) whatever the target family uses.
- **Layer ids.** Our id ``i`` is the output of target layer ``i`` (``-1`` = embeddings).
  vLLM captures the *input* of each listed layer (its id = ours + 1) except in the
  nested ``dflash_config``, to which it adds the 1 itself; SGLang adds 1 to every id
  it reads. Both concatenate the captured states in ascending order.
- **DSpark / DFlash** are DeepSpec's ``Qwen3DSparkModel``: ``sample_from_anchor = true``
  (slot 0, the anchor, predicts the first draft). vLLM serves DFlash checkpoints of
  this layout with its ``dspark`` method only (its ``dflash`` method wants another
  architecture and refuses ``sample_from_anchor``); SGLang's DSPARK needs a Markov head.
- **Eagle3** is vLLM's ``LlamaForCausalLMEagle3``: residual = the un-normed hidden state
  (``norm_before_residual = false``), ``fc`` sized from the number of listed layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from dspark import __version__
from dspark.drafters.kinds import DrafterKind
from dspark.errors import DsparkError
from dspark.formats.export.sidecars import SPS_NAME, STS_NAME, sglang_sps_table, sglang_sts

# gguf: llama.cpp's single file (gguf_export.py); the others are folders written by LAYOUTS.
FORMATS = ("vllm", "sglang", "speculators", "hf", "gguf")
# Which engine each format is for (the names used in errors, SERVE.md and the interop table).
ENGINE_OF_FORMAT = {
    "vllm": "vLLM", "sglang": "SGLang", "speculators": "vLLM", "hf": "DeepSpec", "gguf": "llama.cpp",
}  # fmt: skip
DEEPSPEC_NUM_ANCHORS = 512  # DeepSpec's config asserts the field; it only matters in training
SPECULATORS_VERSION = "0.9.0"  # the speculators config schema we write
OWN_ARCHITECTURE = "DsparkFamilyDraftModel"  # read by our loader only (dspark_method)
ENGINE_LAYER_NAME = "midlayer."  # the name SGLang gives Eagle3's layer (vLLM accepts it too)
_OUR_LAYER_NAME = "layers.0."
# Our drafter fields, kept at the top level of a speculators config for our own loader.
_OURS = ("dspark_method", "target_layer_ids", "num_target_layers", "sts_temperatures", "torch_dtype")


class ExportError(DsparkError):
    """A drafter that cannot be written in the requested format, or an unsafe ``--out``."""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What one format writes: ``config.json``, the weights, and sidecar files (name → text)."""

    config: dict[str, Any]
    state: dict[str, Tensor]
    files: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # caveats for SERVE.md


@dataclass(frozen=True, kw_only=True)
class ExportInput:
    """Everything a layout reads."""

    kind: DrafterKind
    drafter: Any
    config: dict[str, Any]  # our config.json fields (folder.drafter_config_json), dtype set
    state: dict[str, Tensor]  # our state_dict in the export dtype
    target_name: str
    target_architectures: tuple[str, ...]
    sps_table: dict[str, Any] | None = None  # a measured SPS(B) table, for SGLang


def refuse(engine: str, fmt: str, why: str) -> ExportError:
    return ExportError(f"{engine} cannot load this drafter (--format {fmt}): {why}")


# -- checks -----------------------------------------------------------------------------------


def _check_family(engine: str, fmt: str, inp: ExportInput) -> None:
    """The engines' draft classes are Qwen3/Llama layers: no Gemma-style quirks."""
    dims = inp.drafter.dims
    family = inp.config.get("model_type", "this target")
    if dims.embed_scale != 1.0 or dims.logit_softcap is not None:
        raise refuse(
            engine,
            fmt,
            f"its draft class has Qwen3/Llama layers, which neither scale embeddings "
            f"(x{dims.embed_scale:.3g}) nor softcap logits ({dims.logit_softcap}) as the {family} target "
            "does; use --format hf",
        )


def _check_ascending(engine: str, fmt: str, ids: list[int]) -> None:
    if ids != sorted(ids):
        raise refuse(
            engine,
            fmt,
            f"target_layer_ids {ids} are not ascending, and it concatenates the target's layers in "
            "ascending order, so fc would read them permuted",
        )


def _check_block_heads(engine: str, fmt: str, inp: ExportInput) -> None:
    c = inp.config
    if engine == "vLLM" and c.get("markov_rank", 0) > 0 and c.get("markov_head_type") == "rnn":
        raise refuse(engine, fmt, "Qwen3DSparkForCausalLM has no RNN Markov head (markov_head_type 'rnn')")
    if engine == "SGLang" and c.get("markov_rank", 0) <= 0:
        raise refuse(
            engine,
            fmt,
            "its DSPARK algorithm requires markov_rank > 0 and its DFLASH algorithm serves only "
            "z-lab's bonus-anchor DFlash layout, not DeepSpec's; serve this drafter with vLLM or dspark",
        )


# -- common fields ----------------------------------------------------------------------------


def draft_layer_fields(config: dict[str, Any], drafter, num_layers: int) -> dict[str, Any]:
    """``config`` with the draft layers described as they are (module docstring)."""
    theta = float(drafter.dims.rope_theta)
    out = dict(config)
    out.pop("rope_scaling", None)
    out.update(
        num_hidden_layers=num_layers,
        layer_types=["full_attention"] * num_layers,
        hidden_act=drafter.dims.activation,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        rope_theta=theta,
        # The file holds its own lm_head.weight; a tied config would make a loader skip it.
        tie_word_embeddings=False,
    )
    if "hidden_activation" in out:  # Gemma's name for it
        out["hidden_activation"] = drafter.dims.activation
    return out


def _deepspec_fields(inp: ExportInput) -> dict[str, Any]:
    config = draft_layer_fields(inp.config, inp.drafter, inp.config["num_hidden_layers"])
    config.update(num_anchors=DEEPSPEC_NUM_ANCHORS, sample_from_anchor=True)
    return config


def _eagle3_fields(inp: ExportInput, aux_ids: list[int]) -> dict[str, Any]:
    config = draft_layer_fields(inp.config, inp.drafter, 1)
    config.update(
        model_type="llama",  # no q/k norm in the draft layer
        # N < V: a reduced draft vocabulary, with d2t / t2d in the weights (vLLM's llama_eagle3)
        draft_vocab_size=config.get("draft_vocab_size") or config["vocab_size"],
        target_hidden_size=config["hidden_size"],
        norm_before_residual=False,  # our residual is the un-normed hidden state
        eagle_aux_hidden_state_layer_ids=aux_ids,
        eagle_config={"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": aux_ids},
    )
    return config


def _midlayer(state: dict[str, Tensor]) -> dict[str, Tensor]:
    return {
        (ENGINE_LAYER_NAME + k.removeprefix(_OUR_LAYER_NAME) if k.startswith(_OUR_LAYER_NAME) else k): v
        for k, v in state.items()
    }


def _check_draft_layers(engine: str, fmt: str, inp: ExportInput) -> None:
    """The engines' block drafters have Qwen3 layers (q/k-norm, SiLU) and read ``mask_token_id``."""
    dims = inp.drafter.dims
    if inp.config.get("mask_embedding"):
        raise refuse(
            engine,
            fmt,
            "this drafter learned its own mask embedding (its target's tokenizer has no mask token) and the "
            "engine needs a mask_token_id; retrain it with --mask-token TOKEN, or use --format hf",
        )
    if not dims.qk_norm or dims.activation != "silu":
        raise refuse(
            engine,
            fmt,
            f"its draft class has Qwen3 layers (q/k-norm, SiLU), and this drafter's follow the "
            f"{inp.config.get('model_type')} target (q/k-norm {dims.qk_norm}, {dims.activation}); "
            "train it with qk_norm=True (preset field) on a SiLU family, or use --format hf",
        )


def _check_draft_vocab(engine: str, fmt: str, inp: ExportInput) -> None:
    """vLLM loads a reduced draft vocabulary (``draft_vocab_size`` + ``d2t``) for DSpark, DFlash
    and Eagle3 (vLLM 0.32: qwen3_dspark.py, llama_eagle3.py); SGLang's was not checked here."""
    if engine == "SGLang" and inp.config.get("draft_vocab_size"):
        raise refuse(
            engine,
            fmt,
            f"this drafter proposes from a reduced vocabulary of {inp.config['draft_vocab_size']} tokens "
            "(d2t) and dspark has not verified SGLang's loader for it; export it with --format vllm",
        )


def _engine_checks(engine: str, fmt: str, inp: ExportInput) -> list[int]:
    _check_family(engine, fmt, inp)
    _check_draft_vocab(engine, fmt, inp)
    ids = list(inp.config["target_layer_ids"])
    _check_ascending(engine, fmt, ids)
    if inp.kind.uses_mask_token:
        _check_block_heads(engine, fmt, inp)
        _check_draft_layers(engine, fmt, inp)
    return ids


# -- formats ----------------------------------------------------------------------------------


def hf_layout(inp: ExportInput) -> Layout:
    """Our own folder; for DSpark/DFlash DeepSpec's layout with the fields its config asserts.

    A drafter with Gemma-style quirks gets an architecture no engine registers
    (:data:`OWN_ARCHITECTURE`): DeepSpec's and vLLM's ``Qwen3DSparkModel`` would load it
    and silently drop the embedding scale and the softcap.
    """
    if inp.kind.uses_mask_token:
        # DeepSpec-layout folders are what vLLM serves as they are (it reads target_layer_ids).
        _check_ascending("DeepSpec/vLLM", "hf", list(inp.config["target_layer_ids"]))
        config = _deepspec_fields(inp)
        dims = inp.drafter.dims
        quirks = dims.embed_scale != 1.0 or dims.logit_softcap is not None
        # No mask token (learned mask input) or non-Qwen3 draft layers: DeepSpec would misload it.
        own_layers = inp.config.get("mask_embedding") or not dims.qk_norm or dims.activation != "silu"
        # DeepSpec's loader has no reduced draft vocabulary (d2t): its strict key check would refuse it.
        reduced = bool(inp.config.get("draft_vocab_size"))
        if quirks or own_layers or reduced:
            config["architectures"] = [OWN_ARCHITECTURE]
        return Layout(config=config, state=inp.state)
    return Layout(config=draft_layer_fields(inp.config, inp.drafter, 1), state=inp.state)


def vllm_layout(inp: ExportInput) -> Layout:
    """``--speculative-config`` with method ``dspark`` (DSpark, DFlash) or ``eagle3``."""
    ids = _engine_checks("vLLM", "vllm", inp)
    notes = []
    if inp.kind.uses_mask_token:
        config = _deepspec_fields(inp)
        config["dflash_config"] = {"target_layer_ids": ids, "mask_token_id": config["mask_token_id"]}
        if config.get("sts_temperatures"):
            notes.append(
                "vLLM reads no STS temperatures: adaptive verification would use the uncalibrated "
                "confidences (output stays lossless; only the verification budget changes)."
            )
        return Layout(config=config, state=inp.state, notes=tuple(notes))
    return Layout(config=_eagle3_fields(inp, [i + 1 for i in ids]), state=_midlayer(inp.state))


def sglang_layout(inp: ExportInput) -> Layout:
    """``--speculative-algorithm DSPARK`` (+ STS JSON, SPS table) or ``EAGLE3``."""
    ids = _engine_checks("SGLang", "sglang", inp)
    if not inp.kind.uses_mask_token:
        # SGLang adds 1 to each id itself (it captures before layer id + 1).
        return Layout(config=_eagle3_fields(inp, ids), state=_midlayer(inp.state))
    config = _deepspec_fields(inp)
    config["dflash_config"] = {"target_layer_ids": ids, "mask_token_id": config["mask_token_id"]}
    files, notes = {}, []
    if config.get("enable_confidence_head") and config.get("sts_temperatures"):
        files[STS_NAME] = sglang_sts(config["sts_temperatures"], config["block_size"])
    elif config.get("enable_confidence_head"):
        notes.append("No STS temperatures: run `dspark calibrate` and export again to write sglang_sts.json.")
    else:
        notes.append(
            "No confidence head: SGLang builds one unless SGLANG_RAGGED_VERIFY_MODE=static (set below)."
        )
    if inp.sps_table is not None:
        files[SPS_NAME] = sglang_sps_table(inp.sps_table)
    else:
        notes.append(
            "No SPS table: SGLang's scheduler then verifies every draft. Profile the target on the "
            "serving GPU (sglang.benchmark.dspark_sps_profiler) or export again with --sps-table."
        )
    return Layout(config=config, state=inp.state, files=files, notes=tuple(notes))


def speculators_layout(inp: ExportInput) -> Layout:
    """The ``speculators_config`` layout that ``vllm serve <folder>`` reads (speculators 0.9)."""
    ids = _engine_checks("vLLM", "speculators", inp)
    c = inp.config
    block = inp.kind.uses_mask_token
    gamma = c["block_size"]
    layer = draft_layer_fields(c, inp.drafter, c["num_hidden_layers"] if block else 1)
    if not block:
        layer["model_type"] = "llama"  # the Eagle3 layer has no q/k norm
    drafter_keys = {"block_size", "mask_token_id", "markov_rank", "markov_head_type", "architectures"}
    drafter_keys |= {"enable_confidence_head", "confidence_head_with_markov"}
    drafter_keys |= {k for k in _OURS if k != "torch_dtype"}
    layer = {k: v for k, v in layer.items() if k not in drafter_keys}
    config: dict[str, Any] = {
        "speculators_model_type": "dspark" if block else "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "dspark" if block else "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": gamma}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": inp.target_name, "architectures": list(inp.target_architectures)},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": c.get("draft_vocab_size") or c["vocab_size"],
        "target_hidden_size": c["hidden_size"],
        "block_size": gamma,
        "dspark_version": __version__,
        **{k: c[k] for k in _OURS if k in c},
    }
    if block:
        config.update(
            architectures=["Qwen3DSparkModel"],
            aux_hidden_state_layer_ids=[i + 1 for i in ids],
            sample_from_anchor=True,
            **{k: c[k] for k in ("mask_token_id", "markov_rank", "markov_head_type")},
            **{k: c[k] for k in ("enable_confidence_head", "confidence_head_with_markov")},
        )
        return Layout(config=config, state=inp.state)
    aux = [i + 1 for i in ids]
    # vLLM sizes Eagle3's fc from the nested list (3 layers when it is missing).
    layer["eagle_config"] = {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": aux}
    config.update(
        architectures=["Eagle3LlamaForCausalLM"],
        eagle_aux_hidden_state_layer_ids=aux,
        norm_before_residual=False,
    )
    return Layout(config=config, state=inp.state)


LAYOUTS = {"hf": hf_layout, "vllm": vllm_layout, "sglang": sglang_layout, "speculators": speculators_layout}
