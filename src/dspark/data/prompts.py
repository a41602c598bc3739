"""Prompt sets: built-in, local JSONL or a Hugging Face dataset; dedup, domains, split (DESIGN §7.1).

A set is named by a *spec*:

- a built-in set name (``math``, ``code``, ``chat``; DESIGN §11), or the name of a
  shipped benchmark subset (``gsm8k``, ``humaneval``, ``mt-bench``: their first 20 prompts),
- a JSONL path: one record per line, ``{"turns": ["...", ...]}`` (as in
  ``../shared/benchmarks``) or ``{"conversations": [{"role": ..., "content": ...}, ...]}``
  (ShareGPT's ``{"from", "value"}`` too); only the user turns and the system message are
  kept — the target writes the answers itself (``regenerate``),
- ``hf:NAME`` or ``hf:NAME:SPLIT`` (default split ``train``): a Hugging Face dataset
  through the ``datasets`` package, when it is installed and the network allows.

Every prompt carries a domain tag (the record's ``"domain"``, else the set's name) and a
content key (:attr:`Prompt.key`) that identifies it across runs: dedup, the train/eval
split and the resume of ``regenerate`` all go by that key.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark.data.records import parse_record
from dspark.errors import DsparkError
from dspark.presets.tiny import PROMPT_DOMAINS, SHIPPED_BENCHMARKS, builtin_prompts, shipped_benchmark

log = logging.getLogger(__name__)

HF_PREFIX = "hf:"
_ROLES = {"user": "user", "human": "user", "system": "system", "assistant": "assistant", "gpt": "assistant"}
# Single-string columns that hold the prompt in common instruction datasets, in preference order.
_TEXT_COLUMNS = ("prompt", "instruction", "question", "query", "input", "text")


@dataclass(frozen=True)
class Prompt:
    turns: tuple[str, ...]  # user turns, in order
    domain: str | None = None
    source: str = ""  # "file:line", "builtin:domain:index" or "hf:name:split:index"
    system: str | None = None  # system message, when the record has one

    @property
    def key(self) -> str:
        """Content id: a hash of the system message and the whitespace-stripped turns.

        Two records that ask the same thing share a key, whatever file they came from.
        """
        content = json.dumps([self.system or "", [t.strip() for t in self.turns]], ensure_ascii=False)
        return hashlib.sha256(content.encode()).hexdigest()[:20]

    def as_record(self) -> dict[str, Any]:
        """The JSONL record ``dspark data prompts`` writes (read back by :func:`load_prompts`)."""
        record: dict[str, Any] = {"id": self.key, "turns": list(self.turns), "domain": self.domain}
        if self.system:
            record["system"] = self.system
        record["source"] = self.source
        return record


@dataclass(frozen=True)
class PromptSplit:
    train: list[Prompt]
    eval: list[Prompt]


# -- one record -> one prompt ---------------------------------------------------------------


def check_text(value: str, source: str) -> str:
    """``value`` if it is valid Unicode: JSON's ``"\\ud800"`` decodes to a lone surrogate
    that no tokenizer or UTF-8 file can take."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DsparkError(f"{source}: the text holds an invalid character ({e.reason})") from None
    return value


def _from_messages(messages: Any, source: str) -> tuple[list[str], str | None]:
    if not isinstance(messages, list):
        raise DsparkError(f"{source}: the messages must be a list, got {type(messages).__name__}")
    turns, system = [], None
    for m in messages:
        if not isinstance(m, Mapping):
            raise DsparkError(f"{source}: a message must be an object, got {type(m).__name__}: {m!r:.60}")
        role = _ROLES.get(m.get("role", m.get("from")))
        content = m.get("content", m.get("value"))
        if role is None or not isinstance(content, str):
            raise DsparkError(f"{source}: bad message {dict(m)!r}")
        if role == "user":
            turns.append(content)
        elif role == "system" and system is None:
            system = content
    return turns, system


def _from_record(record: Mapping, source: str, domain: str | None) -> Prompt:
    system = record.get("system")
    if "turns" in record:
        turns = record["turns"]
    elif "conversations" in record or "messages" in record:
        turns, system = _from_messages(record.get("conversations", record.get("messages")), source)
    elif text_column := next((c for c in _TEXT_COLUMNS if isinstance(record.get(c), str)), None):
        turns = [record[text_column]]
    else:
        raise DsparkError(
            f"{source}: expected a 'turns', 'conversations' or 'messages' field "
            f"(or one of {', '.join(_TEXT_COLUMNS)})"
        )
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise DsparkError(f"{source}: the turns must be a non-empty list of strings")
    if system is not None and not isinstance(system, str):
        raise DsparkError(f"{source}: 'system' must be a string")
    for text in (*turns, system or ""):
        check_text(text, source)
    tag = record.get("domain")
    return Prompt(tuple(turns), tag if isinstance(tag, str) and tag else domain, source, system or None)


# -- one set ----------------------------------------------------------------------------------


def _load_jsonl(path: Path, on_bad_line: str, limit: int | None = None) -> list[Prompt]:
    """Read line by line, stopping at ``limit`` good prompts: a huge file is never read whole."""
    prompts: list[Prompt] = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            if limit is not None and len(prompts) >= limit:
                break
            if not raw.strip():
                continue
            try:
                prompts.append(_from_record(parse_record(raw, f"{path}:{n}"), f"{path}:{n}", path.stem))
            except DsparkError as e:
                if on_bad_line == "stop":
                    raise
                log.warning("skipping a bad line: %s", e)
    return prompts


def _load_hf(spec: str) -> list[Prompt]:
    name, _, split = spec[len(HF_PREFIX) :].partition(":")
    split = split or "train"
    try:
        import datasets
    except ImportError:
        raise DsparkError(
            f"{spec}: reading a Hugging Face dataset needs the 'datasets' package (pip install datasets)"
        ) from None
    try:
        rows = datasets.load_dataset(name, split=split)
    except Exception as e:  # datasets raises many unrelated types (network, offline mode, not found)
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DsparkError(
            f"cannot load Hugging Face dataset {name!r} split {split!r} (offline? no such dataset?): {reason}"
        ) from None
    domain = name.rsplit("/", 1)[-1]
    return [_from_record(row, f"{spec}:{i}", domain) for i, row in enumerate(rows)]


BAD_LINE_POLICIES = ("stop", "skip")


def load_prompts(spec: str, limit: int | None = None, *, on_bad_line: str = "stop") -> list[Prompt]:
    """Prompts of a built-in set name, a JSONL path or ``hf:NAME[:SPLIT]``; ``limit`` keeps the first N.

    A JSONL line that is not a valid record stops the load with an error naming
    ``file:line`` (``on_bad_line="stop"``), or is logged with that name and skipped
    (``"skip"``; ``limit`` then counts good prompts).
    """
    if on_bad_line not in BAD_LINE_POLICIES:
        raise ValueError(f"on_bad_line must be one of {BAD_LINE_POLICIES}, got {on_bad_line!r}")
    if spec in PROMPT_DOMAINS:
        records = builtin_prompts(spec)
        prompts = [_from_record(r, f"builtin:{spec}:{i}", spec) for i, r in enumerate(records)]
    elif spec in SHIPPED_BENCHMARKS:
        prompts = _load_jsonl(shipped_benchmark(spec), on_bad_line)
    elif spec.startswith(HF_PREFIX):
        prompts = _load_hf(spec)
    else:
        path = Path(spec)
        if not path.is_file():
            raise DsparkError(
                f"no prompt set {spec!r}: not a built-in set "
                f"({', '.join(PROMPT_DOMAINS + SHIPPED_BENCHMARKS)}), "
                f"a file, nor {HF_PREFIX}NAME[:SPLIT]"
            )
        prompts = _load_jsonl(path, on_bad_line, limit)
    return prompts[:limit] if limit is not None else prompts


# -- several sets: dedup, domains, split --------------------------------------------------------


def dedup_prompts(prompts: Iterable[Prompt]) -> list[Prompt]:
    """The first prompt of each :attr:`Prompt.key`, in order."""
    seen: set[str] = set()
    kept = []
    for p in prompts:
        if p.key not in seen:
            seen.add(p.key)
            kept.append(p)
    return kept


def load_prompt_sets(
    specs: Iterable[str],
    *,
    limit: int | None = None,
    domains: Iterable[str] | None = None,
    dedup: bool = True,
) -> list[Prompt]:
    """The prompts of several sets, in order: ``limit`` per set, kept ``domains`` only, deduplicated."""
    prompts: list[Prompt] = []
    for spec in specs:
        prompts += load_prompts(spec, limit)
    if domains is not None:
        wanted = set(domains)
        prompts = [p for p in prompts if p.domain in wanted]
    if dedup:
        kept = dedup_prompts(prompts)
        if len(kept) < len(prompts):
            log.info("dropped %d duplicate prompts", len(prompts) - len(kept))
        prompts = kept
    if not prompts:
        raise DsparkError("no prompts left (empty sets, or no prompt in the chosen domains)")
    return prompts


def split_prompts(prompts: Sequence[Prompt], eval_fraction: float, seed: int) -> PromptSplit:
    """Deterministic train/eval split: the ``round(eval_fraction · N)`` prompts whose seeded
    key hash is smallest go to eval.

    It depends only on the seed and each prompt's content, not on file order, so adding
    prompts to a set moves few existing ones across the split.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise DsparkError(f"eval fraction must be in [0, 1), got {eval_fraction}")

    def rank(p: Prompt) -> str:
        return hashlib.sha256(f"{seed}:{p.key}".encode()).hexdigest()

    num_eval = round(eval_fraction * len(prompts))
    eval_keys = {p.key for p in sorted(prompts, key=rank)[:num_eval]}
    return PromptSplit(
        train=[p for p in prompts if p.key not in eval_keys],
        eval=[p for p in prompts if p.key in eval_keys],
    )


def domain_counts(prompts: Iterable[Prompt]) -> dict[str, int]:
    """Prompts per domain tag (``"none"`` for untagged), most frequent first."""
    return dict(Counter(p.domain or "none" for p in prompts).most_common())


def write_prompts(prompts: Iterable[Prompt], path: str | Path) -> int:
    """Write prompts as JSONL records (:meth:`Prompt.as_record`); returns how many."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps(p.as_record(), ensure_ascii=False) + "\n")
            n += 1
    return n
