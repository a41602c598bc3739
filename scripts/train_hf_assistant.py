"""Train a small LM on the tiny target's corpus, as the `assistant_model` of HF assisted
generation (the baseline of issue 6's batch-1 comparison). Same tokenizer as the target.

Usage: python scripts/train_hf_assistant.py OUT_DIR [STEPS]
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from dspark.presets.tiny import tiny_target_dir
from dspark.tiny.build import TinyTargetConfig, _token_stream, model_config, train_lm
from dspark.tiny.corpus import build_corpus, is_held_out


def main(out: Path, steps: int) -> None:
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_target_dir())
    cfg = dataclasses.replace(TinyTargetConfig(), num_layers=2, steps=steps, warmup_steps=20)
    items = [i for i in build_corpus(cfg.math_items, seed=cfg.seed) if not is_held_out(i.key)]
    stream = _token_stream(items, tokenizer, random.Random(cfg.seed))
    model = Qwen3ForCausalLM(model_config(cfg, tokenizer)).train()
    started = time.time()
    loss = train_lm(model, stream, cfg, desc="assistant")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(
        f"assistant: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
        f"{steps} steps in {time.time() - started:.0f} s, final loss (EMA) {loss:.3f}"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 400)
