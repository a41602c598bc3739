"""Benchmarks as ``dspark eval`` reads them: prompts, a name, the paper's domain (DESIGN §12).

A benchmark is a built-in prompt set (``math``, ``code``, ``chat``) or a JSONL file; its
name is the file's stem. DeepSpec's benchmark names (``gsm8k.jsonl``, ``mt-bench.jsonl``
...) pick DeepSpec's per-benchmark prompt caps, for comparable numbers, and the paper's
domain (Table 1: math, code, chat), over which figures are macro-averaged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from dspark.data.prompts import Prompt, load_prompts
from dspark.errors import DsparkError
from dspark.presets.tiny import PROMPT_DOMAINS

# DeepSpec's per-benchmark prompt caps (DESIGN §12), used when no --limit is given.
DEEPSPEC_CAPS = {
    "gsm8k": 500,
    "math500": 500,
    "aime25": 30,
    "humaneval": 164,
    "mbpp": 256,
    "livecodebench": 500,
    "mt-bench": 80,
    "alpaca": 500,
    "arena-hard-v2": 500,
}
# The paper's domains (Table 1); built-in sets are named after theirs.
BENCHMARK_DOMAINS = {
    **{name: "math" for name in ("gsm8k", "math500", "aime25")},
    **{name: "code" for name in ("humaneval", "mbpp", "livecodebench")},
    **{name: "chat" for name in ("mt-bench", "alpaca", "arena-hard-v2")},
    **{d: d for d in PROMPT_DOMAINS},
}


@dataclass(frozen=True)
class Benchmark:
    name: str
    domain: str
    prompts: tuple[Prompt, ...]


def load_benchmark(spec: str, *, limit: int | None = None, on_bad_line: str = "stop") -> Benchmark:
    """A built-in set or a JSONL file, capped at ``limit`` prompts (default: DeepSpec's cap).

    The domain is the paper's for a known benchmark name, else the most common domain
    tag of the prompts.
    """
    name = Path(spec).stem if spec.endswith(".jsonl") else spec
    cap = limit if limit is not None else DEEPSPEC_CAPS.get(name.lower())
    prompts = load_prompts(spec, cap, on_bad_line=on_bad_line)
    if not prompts:
        raise DsparkError(f"benchmark {spec!r} has no prompts")
    tags = Counter(p.domain for p in prompts if p.domain)
    domain = BENCHMARK_DOMAINS.get(name.lower()) or (tags.most_common(1)[0][0] if tags else "other")
    return Benchmark(name, domain, tuple(prompts))
