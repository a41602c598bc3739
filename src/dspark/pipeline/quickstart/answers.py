"""The target's own answers the quickstart trains and validates on (regenerated, DESIGN §7.1)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

from dspark.data.prompts import Prompt
from dspark.data.regenerate import InProcessBackend, RegenerateConfig, regenerate
from dspark.errors import DsparkError
from dspark.pipeline.presets import DOMAINS
from dspark.protocols import SamplingParams
from dspark.tiny.corpus import training_records


def training_prompts(count: int, seed: int):
    """``count`` of the tiny target's training prompts, balanced over math / code / chat."""

    by_domain: dict[str, list] = {d: [] for d in DOMAINS}
    for i, record in enumerate(training_records()):
        if record["domain"] in by_domain:
            user = record["conversations"][0]["content"]
            by_domain[record["domain"]].append(Prompt((user,), record["domain"], f"tiny-corpus:{i}"))
    rng = random.Random(seed)
    for items in by_domain.values():
        rng.shuffle(items)
    per = -(-count // len(DOMAINS))
    mixed = [p for group in itertools.zip_longest(*(v[:per] for v in by_domain.values())) for p in group if p]
    return mixed[:count]


def answer(target, prompts, answers: Path, *, temperature: float, max_tokens: int, seed: int, progress: bool):
    """The target's answers to ``prompts`` in ``answers`` (resuming a partial file); the
    regeneration summary. A failed prompt is an error naming the file of reasons."""

    errors = errors_file(answers)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    backend = InProcessBackend(target, drafter=None, max_batch=8, max_seq_len=512)
    summary = regenerate(
        prompts, backend, answers, errors, params, RegenerateConfig(concurrency=8, progress=progress)
    )
    if summary.failed:
        raise DsparkError(f"{summary.failed} prompts failed; reasons in {errors}; rerun to retry")
    return summary


def errors_file(answers: Path) -> Path:
    return answers.with_name(answers.stem + ".errors.jsonl")


def mean_tokens(samples) -> float:
    return sum(len(s.input_ids) for s in samples) / max(1, len(samples))


def summary_of(summary, answers: Path, root: Path, data_id: str) -> dict[str, Any]:
    return {
        "prompts": summary.total,
        "completion_tokens": summary.completion_tokens,
        "tokens_per_s": round(summary.tokens_per_s, 1),
        "answers": str(answers.relative_to(root)),
        "data_id": data_id,
    }
