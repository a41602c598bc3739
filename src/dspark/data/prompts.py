"""Prompt sets: built-in (``math``, ``code``, ``chat``) or local JSONL files (SPEC §7.1).

A JSONL line is ``{"turns": ["...", ...]}`` (as in ``../shared/benchmarks``) or
``{"conversations": [{"role": ..., "content": ...}, ...]}``; the first user turn is the
prompt of single-turn evaluation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dspark.errors import DsparkError
from dspark.presets.tiny import PROMPT_DOMAINS, builtin_prompts


@dataclass(frozen=True)
class Prompt:
    turns: tuple[str, ...]  # user turns, in order
    domain: str | None = None
    source: str = ""  # "file:line" or "builtin:domain:index"


def _from_record(record: dict, source: str, domain: str | None) -> Prompt:
    if "turns" in record:
        turns = record["turns"]
    elif "conversations" in record:
        turns = [m["content"] for m in record["conversations"] if m.get("role") == "user"]
    else:
        raise DsparkError(f"{source}: expected a 'turns' or 'conversations' field")
    if not turns or not all(isinstance(t, str) for t in turns):
        raise DsparkError(f"{source}: the turns must be a non-empty list of strings")
    return Prompt(tuple(turns), record.get("domain", domain), source)


def load_prompts(spec: str, limit: int | None = None) -> list[Prompt]:
    """Prompts of a built-in set name or a JSONL path; ``limit`` keeps the first N."""
    if spec in PROMPT_DOMAINS:
        records = builtin_prompts(spec)
        prompts = [_from_record(r, f"builtin:{spec}:{i}", spec) for i, r in enumerate(records)]
    else:
        path = Path(spec)
        if not path.is_file():
            raise DsparkError(
                f"no prompt set {spec!r}: not a built-in set ({', '.join(PROMPT_DOMAINS)}) nor a file"
            )
        prompts = []
        with open(path) as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DsparkError(f"{path}:{n}: not valid JSON ({e.msg})") from None
                prompts.append(_from_record(record, f"{path}:{n}", path.stem))
    return prompts[:limit] if limit is not None else prompts
