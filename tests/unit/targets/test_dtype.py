"""``--dtype auto`` picks bf16 where the hardware computes it natively (issue 17, ``targets/dtype.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dspark.commands.loading import load_inference_target
from dspark.formats.build import build_drafter
from dspark.targets import dtype as dtypes

X86_BF16 = "processor : 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n"
X86_AMX = "flags : avx2 avx512f amx_bf16 amx_tile\n"
X86_PLAIN = "processor : 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni\n"
ARM_BF16 = "processor : 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
ARM_PLAIN = "Features : fp asimd\n"


def test_flags_are_read_from_x86_and_arm_cpuinfo():
    assert {"avx512_bf16", "avx512f"} <= dtypes.cpu_flags(X86_BF16)
    assert "bf16" in dtypes.cpu_flags(ARM_BF16)
    assert dtypes.cpu_flags("model name : bf16 avx512_bf16\n") == frozenset()  # only the flag lines


@pytest.mark.parametrize(
    "text,capability,native",
    [
        (X86_BF16, "AVX512", True),
        (X86_AMX, "AVX512", True),
        (X86_BF16, "AVX2", False),  # torch limited to AVX2 kernels emulates bf16
        (X86_PLAIN, "AVX512", False),
        (ARM_BF16, "SVE256", True),
        (ARM_PLAIN, "DEFAULT", False),
    ],
)
def test_native_bf16(text, capability, native):
    assert dtypes.native_bf16(dtypes.cpu_flags(text), capability) is native


@pytest.mark.parametrize(
    "text,capability,amx",
    [
        (X86_AMX, "AVX512", True),
        (X86_AMX, "AVX2", False),
        (X86_BF16, "AVX512", False),
        (ARM_BF16, "SVE256", False),
    ],
)
def test_amx_bf16(text, capability, amx):
    assert dtypes.amx_bf16(dtypes.cpu_flags(text), capability) is amx


@pytest.mark.parametrize("amx", [True, False])
def test_training_runs_bf16_on_cuda_and_amx_cpus(monkeypatch, amx):
    """Training's auto: bf16 autocast on CUDA and on AMX CPUs (5-8x faster products) for targets
    of hidden >= 512, fp32 elsewhere."""
    monkeypatch.setattr(dtypes, "cpu_has_amx_bf16", lambda: amx)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert dtypes.training_bf16("auto", cpu) is amx
    assert dtypes.training_bf16("auto", cpu, hidden_size=576) is amx
    assert dtypes.training_bf16("auto", cpu, hidden_size=256) is False  # the tiny target
    assert dtypes.training_bf16("auto", cuda, hidden_size=256) is True
    assert dtypes.training_bf16("auto", cuda) is True
    assert dtypes.training_bf16("fp32", cuda) is False
    assert dtypes.training_bf16("bf16", cpu) is True


@pytest.mark.parametrize("native", [True, False])
def test_auto_is_bf16_on_native_cpus_for_large_enough_targets(monkeypatch, native):
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: native)
    expected = torch.bfloat16 if native else torch.float32
    assert dtypes.inference_dtype("auto", "cpu", hidden_size=576) == expected
    assert dtypes.inference_dtype(None, "cpu") == expected
    assert dtypes.inference_dtype("auto", "cpu", hidden_size=256) == torch.float32  # faster in fp32
    assert dtypes.inference_dtype("auto", "cuda") == torch.bfloat16
    assert dtypes.inference_dtype("float32", "cuda") == torch.float32
    assert dtypes.inference_dtype("bfloat16", "cpu", hidden_size=256) == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of"):
        dtypes.inference_dtype("fp16", "cpu")


def test_this_machine_is_detected_from_its_cpuinfo():
    text = Path("/proc/cpuinfo").read_text()
    expected = dtypes.native_bf16(dtypes.cpu_flags(text), torch.backends.cpu.get_cpu_capability())
    assert dtypes.cpu_has_native_bf16() is expected


def test_decoding_commands_load_the_target_and_drafter_in_the_chosen_dtype():
    auto = load_inference_target(None, "auto", "cpu")
    assert auto.dtype == torch.float32  # the embedded tiny target (hidden 256) stays in fp32
    bf16 = load_inference_target(None, "bfloat16", "cpu")
    assert bf16.dtype == torch.bfloat16 and bf16.model.dtype == torch.bfloat16
    drafter = build_drafter("dspark", bf16)
    assert {p.dtype for p in drafter.parameters()} == {torch.bfloat16}


def test_generate_takes_dtype(capsys):
    from dspark.cli import main

    argv = ["generate", "--prompt", "Add 2 and 3.", "--max-tokens", "8", "--drafter", "ngram", "--json"]
    assert main([*argv, "--dtype", "bfloat16"]) == 0
    assert '"text"' in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--dtype", "fp16"])
    assert exit_info.value.code == 2
