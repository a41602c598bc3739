"""Decoders compared side by side with an outside engine (issue 17: dspark beside llama.cpp).

The pure part of ``scripts/bench_llamacpp.py``, kept here so that it is tested without
llama.cpp: per-method tallies (speed with and without the prefill, τ), the method order
rotated every turn, how far two greedy token sequences agree, the ratios and the table, and
the τ a drafter needs to reach a given speed. Nothing here imports llama-cpp-python.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

LLAMA = "llama.cpp"
LLAMA_LOOKUP = "llama.cpp+lookup"
OURS_FP32 = "dspark-fp32"
OURS_BF16 = "dspark-bf16"
DRAFT_COSTS = (0.0, 0.1, 0.25, 0.5)  # a drafting round's cost in target decode steps, for the τ needed


@dataclass(frozen=True, kw_only=True)
class Decoded:
    """One answer and its timing: ``first_s`` until the first emission (prefill + first step),
    which held ``first_tokens`` tokens (a first round may emit several)."""

    ids: list[int]
    seconds: float
    first_s: float
    first_tokens: int
    rounds: int = 0
    accepted: int = 0


@dataclass
class Tally:
    """One method's totals over every timed run."""

    tokens: int = 0
    seconds: float = 0.0
    first_seconds: float = 0.0
    first_tokens: int = 0
    runs: int = 0
    rounds: int = 0
    accepted: int = 0
    outputs: dict[tuple[str, int], list[int]] = field(default_factory=dict)  # (set, prompt) -> ids

    def add(self, key: tuple[str, int], d: Decoded) -> None:
        self.tokens += len(d.ids)
        self.seconds += d.seconds
        self.first_seconds += d.first_s
        self.first_tokens += d.first_tokens
        self.runs += 1
        self.rounds += d.rounds
        self.accepted += d.accepted
        self.outputs[key] = d.ids  # greedy: every repeat decodes the same ids

    @property
    def tokens_per_s(self) -> float:
        """Every token over the whole time, prefill included."""
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """The tokens after the first emission over the time after it: decoding without the prefill."""
        rest = self.seconds - self.first_seconds
        return (self.tokens - self.first_tokens) / rest if rest > 0 else 0.0

    @property
    def first_ms(self) -> float:
        """Mean time to the first emission (prefill + first step), ms."""
        return 1e3 * self.first_seconds / self.runs if self.runs else 0.0

    @property
    def tau(self) -> float:
        """Tokens per verification round, bonus included (SPEC §2); 0 without rounds."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0


def rotated(methods: list[str], turn: int) -> list[str]:
    """``methods`` started at ``turn`` (mod their count): each method leads in turn."""
    s = turn % len(methods)
    return methods[s:] + methods[:s]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (the first divergence's index)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def agreement(outputs: dict, reference: dict) -> dict:
    """Over the prompts both decoded: identical ones, and matching tokens before the first
    divergence (summed, and the fewest on one prompt), out of the reference's tokens."""
    keys = sorted(set(outputs) & set(reference))
    prefixes = [common_prefix(outputs[k], reference[k]) for k in keys]
    return {
        "prompts": len(keys),
        "identical": sum(outputs[k] == reference[k] for k in keys),
        "prefix_tokens": sum(prefixes),
        "reference_tokens": sum(len(reference[k]) for k in keys),
        "min_prefix": min(prefixes, default=0),
    }


def tau_needed(speed_ratio: float, verify_ratio: float, draft_ratio: float = 0.0) -> float:
    """Tokens per round a drafter needs for speculative decoding to reach ``speed_ratio`` × our
    plain speed, when a round costs a verification (``verify_ratio`` decode steps) plus drafting
    (``draft_ratio`` decode steps): the speedup is τ / (verify_ratio + draft_ratio) (SPEC §2)."""
    return speed_ratio * (verify_ratio + draft_ratio)


def own_plain(method: str) -> str | None:
    """The plain decoding a speculative method must reproduce: ``dspark-bf16+ngram`` -> ``dspark-bf16``."""
    plain, sep, _ = method.partition("+")
    return plain if sep else None


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


def table_rows(tallies: dict[str, Tally], baseline: str = LLAMA, exact: str = OURS_FP32) -> list[dict]:
    """One row per method: speeds (all / decoding only) and their ratios to ``baseline``, the time
    to the first emission, τ, and agreement with ``baseline``, with the method's own plain
    decoding (losslessness) and with ``exact``."""
    base = tallies[baseline]
    rows = []
    for name, t in tallies.items():
        row = {
            "method": name,
            "tokens": t.tokens,
            "seconds": round(t.seconds, 3),
            "tokens_per_s": round(t.tokens_per_s, 2),
            "ratio": _ratio(t.tokens_per_s, base.tokens_per_s),
            "decode_tokens_per_s": round(t.decode_tokens_per_s, 2),
            "decode_ratio": _ratio(t.decode_tokens_per_s, base.decode_tokens_per_s),
            "first_ms": round(t.first_ms, 1),
            "tau": round(t.tau, 3),
            "vs_" + baseline: agreement(t.outputs, base.outputs),
        }
        if own_plain(name) in tallies:
            row["vs_own_plain"] = agreement(t.outputs, tallies[own_plain(name)].outputs)
        if exact in tallies:
            row["vs_" + exact] = agreement(t.outputs, tallies[exact].outputs)
        rows.append(row)
    return rows


def _agree_cell(a: dict) -> str:
    same = f"{a['identical']}/{a['prompts']}"
    return f"{same}, {a['prefix_tokens']}/{a['reference_tokens']} (min {a['min_prefix']})"


def markdown_table(rows: list[dict], baseline: str = LLAMA, exact: str = OURS_FP32) -> str:
    """The rows as the BENCHMARKS.md table; agreement cells read ``identical/prompts, matching
    tokens before the first divergence / tokens (fewest on one prompt)``."""
    lines = [
        f"| method | tok/s | × {baseline} | decode tok/s | × {baseline} | 1st emission ms | τ "
        f"| same as {baseline} | same as own plain | same as {exact} |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            _agree_cell(r[k]) if k in r else "–" for k in ("vs_" + baseline, "vs_own_plain", "vs_" + exact)
        ]
        tau = f"{r['tau']:.2f}" if r["tau"] else "–"
        speeds = [f"{r['tokens_per_s']:.1f}", f"{r['ratio']:.3f}", f"{r['decode_tokens_per_s']:.1f}"]
        speeds += [f"{r['decode_ratio']:.3f}", f"{r['first_ms']:.0f}", tau]
        lines.append(f"| {r['method']} | " + " | ".join(speeds + cells) + " |")
    return "\n".join(lines)


def prepare_prompts(tokenizer, prompt_sets: dict[str, list], max_tokens: int, context: int) -> list:
    """``[(set, index, ids)]``: each prompt's first turn through the chat template, the same ids
    for every method; prompts whose ids plus ``max_tokens`` exceed ``context`` are left out."""
    from dspark.data.chat import prompt_ids

    out = []
    for name, prompts in prompt_sets.items():
        for i, prompt in enumerate(prompts):
            ids = prompt_ids(tokenizer, prompt)
            if len(ids) + max_tokens <= context:
                out.append((name, i, ids))
            else:
                logger.warning("%s #%d: %d prompt tokens do not fit; left out", name, i, len(ids))
    return out
