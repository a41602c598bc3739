"""The dtype a target (and its drafters) runs in for inference: ``--dtype auto|float32|bfloat16``.

``auto`` is bf16 where the hardware computes it natively — every CUDA device we run on,
and CPUs with bf16 dot-product instructions (x86 ``avx512_bf16`` / ``amx_bf16`` with
torch's AVX-512 kernels in use, Arm ``bf16``) for targets of hidden size >=
:data:`BF16_MIN_HIDDEN` — and fp32 elsewhere. On a CPU without them bf16 is emulated and
slower than fp32. On SmolLM2-135M (hidden 576) bf16 makes the decode step 1.26× faster
and verifying 8 tokens cost 1.07× a decode step instead of 1.69×. Below that
size oneDNN's bf16 GEMMs of a few rows cost more than fp32's (hidden 256: a [7, 256] x
[256, 768] product takes 89 µs in bf16, 30 µs in fp32, one thread), so the embedded tiny
target decodes faster in fp32 and ``auto`` keeps it there (BENCHMARKS.md).

Training does not use this: it keeps its own dtype rules (:func:`training_bf16`: bf16
autocast on CUDA and on CPUs with AMX, fp32 on other CPUs).
Losslessness holds against the target as loaded: greedy speculative output equals the
plain greedy output of the same target in the same dtype.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

DTYPE_CHOICES = ("auto", "float32", "bfloat16")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 (AVX-512, AMX), Arm (FEAT_BF16)
X86_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
BF16_MIN_HIDDEN = 512  # CPU: smaller targets run faster in fp32 (module docstring)


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of ``/proc/cpuinfo`` text (x86 ``flags``, Arm ``Features``)."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return frozenset(flags)


def native_bf16(flags: frozenset[str], capability: str) -> bool:
    """True when a CPU with these flags computes bf16 natively in torch's kernels.

    On x86 the bf16 instructions only run inside torch's AVX-512 kernels, so a torch
    limited to AVX2 (``ATEN_CPU_CAPABILITY=avx2``) emulates bf16 even on such a CPU.
    """
    if flags & X86_BF16_FLAGS:
        return capability.upper().startswith("AVX512")
    return "bf16" in flags  # Arm: the NEON/SVE kernels use BFMMLA/BFDOT when present


def _this_cpu(test) -> bool:
    """``test(flags, capability)`` for this machine (False when ``/proc/cpuinfo`` cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    return test(cpu_flags(text), torch.backends.cpu.get_cpu_capability())


@lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """:func:`native_bf16` for this machine."""
    return _this_cpu(native_bf16)


def inference_dtype(
    choice: str | None, device: str | torch.device | None = None, *, hidden_size: int | None = None
) -> torch.dtype:
    """The dtype of ``--dtype choice`` on ``device`` (None: CUDA if present, else the CPU).

    ``hidden_size`` is the target's (None: unknown, taken as large enough for bf16).
    """
    choice = choice or "auto"
    if choice != "auto":
        if choice not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {choice!r}")
        return DTYPES[choice]
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        return torch.bfloat16
    small = hidden_size is not None and hidden_size < BF16_MIN_HIDDEN
    if device.type == "cpu" and not small and cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32


def amx_bf16(flags: frozenset[str], capability: str) -> bool:
    """True when a CPU with these flags has AMX bf16 tiles that torch's kernels (oneDNN) use."""
    return "amx_bf16" in flags and native_bf16(flags, capability)


@lru_cache(maxsize=1)
def cpu_has_amx_bf16() -> bool:
    """:func:`amx_bf16` for this machine."""
    return _this_cpu(amx_bf16)


def training_bf16(precision: str, device: torch.device, hidden_size: int | None = None) -> bool:
    """Whether a training run of ``precision`` (auto | bf16 | fp32) computes under bf16 autocast.

    ``auto`` is bf16 on CUDA, and on a CPU with AMX for targets of hidden size >=
    :data:`BF16_MIN_HIDDEN`: a SmolLM2 drafter's bf16 products run 5-8x faster than fp32 there
    (one thread) and a training step about 1.9x faster end to end, while the tiny target's
    step gains nothing (BENCHMARKS.md) and keeps fp32 everywhere. With AVX-512 bf16
    alone a bf16 product is slower than fp32's (78 vs 95 GFLOP/s on a Zen 4 core), so other
    CPUs train in fp32. Master weights stay fp32 either way.
    """
    if precision != "auto":
        return precision == "bf16"
    if device.type == "cuda":
        return True
    small = hidden_size is not None and hidden_size < BF16_MIN_HIDDEN
    return device.type == "cpu" and not small and cpu_has_amx_bf16()
