"""``dspark build-tiny-target``: corpus → tokenizer → a small Qwen3 trained on CPU (DESIGN §11).

The output is an ordinary Hugging Face model folder (config.json, model.safetensors,
tokenizer files, generation_config.json) plus ``manifest.json`` (corpus hash, Python
and library versions, training figures, per-domain held-out loss) and the built-in
prompt sets, made from held-out items only.
"""

from __future__ import annotations

import json
import logging
import math
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from tqdm import tqdm
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from dspark.tiny.corpus import DOMAINS, Item, build_corpus, corpus_hash, is_held_out
from dspark.tiny.tokenizer import MASK_TOKEN, render_chat, train_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TinyTargetConfig:
    """Shape and training budget of the tiny target. Defaults fit < 1 h on 2 CPU cores."""

    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 12
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    max_position: int = 1024
    math_items: int = 4000
    seq_len: int = 512
    batch_size: int = 8
    steps: int = 900
    lr: float = 2e-3
    warmup_steps: int = 40
    weight_decay: float = 0.1
    seed: int = 0
    prompts_per_domain: int = 40


def model_config(cfg: TinyTargetConfig, tokenizer) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _token_stream(items: list[Item], tokenizer, rng: random.Random) -> torch.Tensor:
    """All training documents, shuffled and concatenated into one id stream."""
    order = list(items)
    rng.shuffle(order)
    ids: list[int] = []
    for item in order:
        ids.extend(tokenizer(render_chat(item.prompt, item.answer))["input_ids"])
    return torch.tensor(ids, dtype=torch.long)


def _lr_at(step: int, cfg: TinyTargetConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_lm(model, stream: torch.Tensor, cfg: TinyTargetConfig, *, desc: str) -> float:
    """Next-token training on random ``seq_len`` windows of ``stream``; returns the loss EMA.

    AdamW (no decay on norms), warmup then cosine (:func:`_lr_at`), clipping at 1.0.
    """
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    bar = tqdm(range(cfg.steps), desc=desc, unit="step", file=sys.stderr)
    loss_ema = None
    for step in bar:
        starts = torch.randint(0, stream.numel() - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)
        batch = torch.stack([stream[s : s + cfg.seq_len + 1] for s in starts.tolist()])  # [B, T+1]
        for group in optim.param_groups:
            group["lr"] = _lr_at(step, cfg)
        logits = model(batch[:, :-1]).logits  # [B, T, V]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        loss_ema = loss.item() if loss_ema is None else 0.98 * loss_ema + 0.02 * loss.item()
        bar.set_postfix(loss=f"{loss_ema:.3f}")
    return loss_ema


@torch.no_grad()
def held_out_loss(model, tokenizer, items: list[Item]) -> dict[str, float]:
    """Mean token cross-entropy over the answer tokens of held-out items, per domain."""
    model.eval()
    out: dict[str, float] = {}
    for domain in DOMAINS:
        total, count = 0.0, 0
        for item in [i for i in items if i.domain == domain]:
            prefix = tokenizer(render_chat(item.prompt))["input_ids"]
            full = tokenizer(render_chat(item.prompt, item.answer))["input_ids"][
                : model.config.max_position_embeddings
            ]
            ids = torch.tensor([full])
            logits = model(ids).logits[0, :-1].float()  # [T-1, V]
            losses = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
            answer = losses[len(prefix) - 1 :]
            total += answer.sum().item()
            count += answer.numel()
        out[domain] = total / max(count, 1)
    model.train()
    return out


def _write_prompt_sets(items: list[Item], out_dir: Path, per_domain: int, seed: int) -> dict[str, int]:
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    rng = random.Random(seed)
    for domain in DOMAINS:
        pool = sorted((i for i in items if i.domain == domain), key=lambda i: i.key)
        rng.shuffle(pool)
        chosen = pool[:per_domain]
        with open(out_dir / f"{domain}.jsonl", "w") as f:
            for item in chosen:
                f.write(
                    json.dumps({"turns": [item.prompt], "domain": domain, "reference": item.answer}) + "\n"
                )
        counts[domain] = len(chosen)
    return counts


def write_builtin_prompts(items: list[Item], out_dir: Path, cfg: TinyTargetConfig) -> dict[str, int]:
    """The built-in prompt sets: held-out items whose prompt text never occurs in training.

    (Two standard-library methods can share a signature and docstring, e.g.
    ``Maildir.remove`` and ``MH.remove``: the held-out split is by item, so the prompt
    text is checked too.)
    """
    train_prompts = {i.prompt for i in items if not is_held_out(i.key)}
    held = [i for i in items if is_held_out(i.key) and i.prompt not in train_prompts]
    return _write_prompt_sets(held, out_dir, cfg.prompts_per_domain, cfg.seed)


def build_tiny_target(out: Path, prompts_out: Path, cfg: TinyTargetConfig = TinyTargetConfig()) -> dict:
    """Build the tiny target into ``out`` and the built-in prompt sets into ``prompts_out``."""
    started = time.time()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    items = build_corpus(cfg.math_items, seed=cfg.seed)
    train_items = [i for i in items if not is_held_out(i.key)]
    held_items = [i for i in items if is_held_out(i.key)]
    log.info("corpus: %d items (%d train, %d held out)", len(items), len(train_items), len(held_items))

    tokenizer = train_tokenizer((render_chat(i.prompt, i.answer) for i in train_items), cfg.vocab_size)
    stream = _token_stream(train_items, tokenizer, rng)
    model = Qwen3ForCausalLM(model_config(cfg, tokenizer))
    model.train()
    params = sum(p.numel() for p in model.parameters())
    log.info("model: %.2fM parameters, stream: %d tokens", params / 1e6, stream.numel())

    loss_ema = train_lm(model, stream, cfg, desc="tiny target")
    train_seconds = time.time() - started

    held = held_out_loss(model, tokenizer, held_items)
    log.info("held-out loss per domain: %s", held)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    ).save_pretrained(out)
    manifest = {
        "corpus_sha256": corpus_hash(items),
        "corpus_items": {d: sum(i.domain == d for i in items) for d in DOMAINS},
        "held_out_items": {d: sum(i.domain == d for i in held_items) for d in DOMAINS},
        "train_tokens_in_stream": stream.numel(),
        "tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
        "parameters": params,
        "mask_token": MASK_TOKEN,
        "mask_token_id": tokenizer.convert_tokens_to_ids(MASK_TOKEN),
        "final_train_loss_ema": loss_ema,
        "held_out_loss": held,
        "build_seconds": round(time.time() - started, 1),
        "train_seconds": round(train_seconds, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "config": asdict(cfg),
    }
    manifest["builtin_prompts"] = write_builtin_prompts(items, prompts_out, cfg)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
