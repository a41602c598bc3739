"""Reading and writing GGUF files with the ``gguf`` package: tensors, typed metadata, tokenizers.

llama.cpp's names for the drafter and target tensors live with their writers
(:mod:`~dspark.formats.export.gguf_draft`, :mod:`~dspark.formats.export.gguf_target`);
this module only knows the file format. GGUF stores a tensor's dimensions innermost
first (``ne[0]`` = the last numpy axis), so a torch ``[out, in]`` weight is llama.cpp's
``{in, out}`` as it is: nothing is transposed. Vectors (norms, biases) are always F32,
as llama.cpp's converter writes them and as ggml's CPU element-wise kernels want them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dspark.errors import DsparkError

# GGML tensor types by export dtype name (``general.file_type`` is llama.cpp's LLAMA_FTYPE).
GGML_TYPE_NAMES = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}
FILE_TYPES = {"fp32": 0, "fp16": 1, "bf16": 32}
TOKENIZER_PREFIX = "tokenizer."
# llama.cpp's names of a decoder layer's weights, ``blk.N.<name>``: the same in its qwen3
# (target) and dflash (draft) graphs. Keys: ours / HF's inside ``layers.N.``.
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf():
    try:
        import gguf
    except ImportError:
        raise DsparkError(
            "--format gguf writes with the gguf package: pip install 'dspark[smollm2]'"
        ) from None
    return gguf


@dataclass
class GgufContent:
    """What one GGUF file holds: ``arch``, metadata (key → (value, type name[, item type name]))
    and tensors (llama.cpp name → torch tensor, written in its dtype)."""

    arch: str
    metadata: dict[str, tuple] = field(default_factory=dict)
    tensors: dict[str, Tensor] = field(default_factory=dict)

    def put(self, key: str, value: Any, kind: str, item: str | None = None) -> None:
        """Set ``key`` (``{arch}`` replaced) to ``value`` of GGUF type ``kind`` (``UINT32``, ``ARRAY``)."""
        self.metadata[key.format(arch=self.arch)] = (value, kind, item)


def as_dtype(t: Tensor, dtype_name: str) -> Tensor:
    """Matrices in the export dtype, vectors and integer tables as they must be (F32 / I64)."""
    if not t.is_floating_point():
        return t.detach().to(torch.int64).cpu().contiguous()
    if t.dim() <= 1:
        return t.detach().to(torch.float32).cpu().contiguous()
    return (
        t.detach()
        .to({"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name])
        .cpu()
    )


def write_gguf(path: Path, content: GgufContent) -> None:
    """Write ``content`` to ``path`` (GGUF v3, default alignment)."""
    gguf = _gguf()
    writer = gguf.GGUFWriter(str(path), content.arch)
    vt = gguf.GGUFValueType
    for key, (value, kind, item) in content.metadata.items():
        if key in ("general.architecture",):
            continue
        writer.add_key_value(key, value, vt[kind], sub_type=vt[item] if item else None)
    for name, t in content.tensors.items():
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            bits = t.view(torch.int16).numpy().view(np.uint16)
            writer.add_tensor(name, bits, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(name, t.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@dataclass(frozen=True)
class GgufRead:
    """A GGUF file read back: metadata values and tensors (as torch, in their stored dtype)."""

    metadata: dict[str, Any]
    types: dict[str, tuple[str, ...]]  # key → GGUF value type names (arrays: ARRAY, item)
    tensors: dict[str, Tensor]
    tensor_types: dict[str, str]  # name → GGML type name


def read_gguf(path: Path, *, with_tensors: bool = True) -> GgufRead:
    """Read ``path``'s metadata (and tensors, F32/F16/BF16/I64 only) with ``gguf.GGUFReader``."""
    gguf = _gguf()
    reader = gguf.GGUFReader(str(path))
    metadata, types = {}, {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        metadata[key] = f.contents()
        types[key] = tuple(t.name for t in f.types)
    tensors, tensor_types = {}, {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        tensor_types[t.name] = kind
        if not with_tensors:
            continue
        shape = [int(n) for n in reversed(t.shape)]  # numpy order
        data = np.asarray(t.data)
        if kind == "BF16":
            tensors[t.name] = torch.from_numpy(data.view(np.int16).copy()).view(torch.bfloat16).reshape(shape)
        elif kind in ("F32", "F16", "I64", "I32"):
            tensors[t.name] = torch.from_numpy(data.copy()).reshape(shape)
    return GgufRead(metadata, types, tensors, tensor_types)


def tokenizer_metadata(source: GgufRead) -> dict[str, tuple]:
    """The ``tokenizer.*`` keys of a GGUF, with their types, to copy into another file."""
    out = {}
    for key, value in source.metadata.items():
        if key.startswith(TOKENIZER_PREFIX):
            kinds = source.types[key]
            out[key] = (value, kinds[0], kinds[1] if len(kinds) > 1 else None)
    return out
