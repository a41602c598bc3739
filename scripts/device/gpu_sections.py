"""The GPU sections the prepared device run borrows (``scripts/device/sections.py``: ``env``,
``cuda_tests``, ``train_shapes``); each runs in its own process.

Run by the device run, not by hand. Every section is ``section(scale) -> dict`` (JSON-able).
``scale`` is :data:`FULL` on a GPU and :data:`DRY` for the CPU dry run that CI exercises
(tiny shapes, same code paths).
Targets are random-init Qwen3 models with the real shapes and vocabulary but fewer
layers (``target_layers``; each result says how many), so nothing is downloaded.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Qwen3 shapes (config.json of the released models); vocabulary 151,936.
QWEN3 = {
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8),
    "qwen3-8b": dict(
        hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8
    ),
}


@dataclass(frozen=True, kw_only=True)
class Scale:
    """How big a section's work is: the GPU run or the CPU dry run."""

    device: str
    vocab_size: int
    shapes: dict  # name -> Qwen3 shape overrides
    target_layers: int  # of the random-init training targets
    sps_layers: int  # of the SPS / engine target (Qwen3-8B has 36)
    draft_layers: int
    tokens: int  # per training sequence
    anchors: int
    micro_batches: tuple[int, ...]
    train_steps: int  # timed, after one warm-up step
    sps_slots: int
    engine_batches: tuple[int, ...]
    engine_max_tokens: int
    campaign: bool


FULL = Scale(
    device="cuda",
    vocab_size=151_936,
    shapes=QWEN3,
    target_layers=6,
    sps_layers=12,
    draft_layers=5,
    tokens=2048,
    anchors=512,
    micro_batches=(1, 2),
    train_steps=4,
    sps_slots=32,
    engine_batches=(1, 8, 32),
    engine_max_tokens=64,
    campaign=True,
)

_TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
DRY = Scale(
    device="cpu",
    vocab_size=512,
    shapes={"qwen3-4b": _TINY, "qwen3-8b": _TINY},
    target_layers=2,
    sps_layers=2,
    draft_layers=1,
    tokens=64,
    anchors=8,
    micro_batches=(1,),
    train_steps=1,
    sps_slots=2,
    engine_batches=(1,),
    engine_max_tokens=8,
    campaign=False,
)


def _target(scale: Scale, shape: str, layers: int):
    """A random-init Qwen3-shaped :class:`TargetAdapter`, bf16 on CUDA, fp32 on the CPU."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dspark.targets import TargetAdapter

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=scale.vocab_size,
        num_hidden_layers=layers,
        head_dim=128 if scale.device == "cuda" else 16,
        max_position_embeddings=8192,
        tie_word_embeddings=shape == "qwen3-4b",  # as the released models
        **scale.shapes[shape],
    )
    dtype = torch.bfloat16 if scale.device == "cuda" else torch.float32
    with torch.device(scale.device):
        model = Qwen3ForCausalLM(config).to(dtype).eval()
    target = TargetAdapter(model, target_layer_ids=tuple(range(min(5, layers - 1))))
    target.eos_token_ids = ()  # random weights: every request runs to max_tokens
    return target


def _peak_gb(device: str) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None


def env(scale: Scale) -> dict:
    import torch
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version}
    out["cuda"] = torch.cuda.is_available()
    if out["cuda"]:
        props = torch.cuda.get_device_properties(0)
        out |= {"device": props.name, "memory_gb": round(props.total_memory / 2**30, 1)}
        out["bf16"] = torch.cuda.is_bf16_supported()
    return out


def gpu_tests(scale: Scale) -> dict:
    """The ``gpu``-marked tests (bf16 greedy equality, engine losslessness on CUDA)."""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider", "-rfE"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = run.stdout.strip().splitlines()
    return {"rc": run.returncode, "summary": lines[-1] if lines else "", "tail": run.stdout[-3000:]}


def _train_one(
    scale: Scale, target, shape: str, micro_batch: int, checkpointing: bool, attention: str
) -> dict:
    import torch

    from dspark.data.samples import TrainDataset, TrainSample
    from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
    from dspark.training import distributed
    from dspark.training.trainer import TrainConfig, Trainer

    torch.manual_seed(1)
    config = DSparkConfig(
        num_layers=scale.draft_layers, block_size=7, mask_token_id=scale.vocab_size - 1, markov_rank=256
    )
    with torch.device(scale.device):  # random init on the GPU: seconds, not a minute on the CPU
        drafter = DSparkDrafter.from_target(target, config)
    g = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(micro_batch * (scale.train_steps + 1)):
        ids = torch.randint(0, scale.vocab_size - 1, (scale.tokens,), generator=g)
        mask = torch.ones(scale.tokens, dtype=torch.bool)
        mask[: scale.tokens // 8] = False  # a prompt, then the supervised answer
        samples.append(TrainSample(input_ids=ids, loss_mask=mask))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(
            output_dir=tmp,
            max_steps=scale.train_steps + 1,
            global_batch_size=micro_batch,
            micro_batch_size=micro_batch,
            num_anchors=scale.anchors,
            progress=False,
            activation_checkpointing=checkpointing,
            attention=attention,
        )
        world = distributed.current_world(target.device)
        trainer = Trainer(cfg, target, drafter, TrainDataset(samples), world)
        trainer.step(1)  # warm-up: allocator, kernels
        if scale.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started, tokens = time.perf_counter(), 0
        for step in range(2, scale.train_steps + 2):
            tokens += trainer.step(step).tokens
        if scale.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    return {
        "shape": shape,
        "target_layers": scale.target_layers,
        "draft_layers": scale.draft_layers,
        "micro_batch": micro_batch,
        "tokens_per_seq": scale.tokens,
        "anchors": scale.anchors,
        "activation_checkpointing": checkpointing,
        "attention": attention,
        "tokens_per_s": round(tokens / seconds, 1),
        "peak_gb": _peak_gb(scale.device),
    }


def _train(scale: Scale, shape: str) -> dict:
    """Training tokens/s and peak memory at a drafter shape, per micro-batch size; errors per row."""
    import torch

    rows = []
    target = _target(scale, shape, scale.target_layers)
    first = scale.micro_batches[0]
    variants = [(mb, False, "auto") for mb in scale.micro_batches] + [
        (first, True, "auto"),
        (first, False, "packed"),
    ]
    for micro_batch, checkpointing, attention in variants:
        try:
            rows.append(_train_one(scale, target, shape, micro_batch, checkpointing, attention))
        except Exception as e:  # an OOM at micro-batch 2 must not hide micro-batch 1's figures
            rows.append(
                {"micro_batch": micro_batch, "activation_checkpointing": checkpointing, "error": repr(e)}
            )
        if scale.device == "cuda":
            torch.cuda.empty_cache()
    return {"rows": rows}


def train_qwen3_4b(scale: Scale) -> dict:
    return _train(scale, "qwen3-4b")


def train_qwen3_8b(scale: Scale) -> dict:
    return _train(scale, "qwen3-8b")
