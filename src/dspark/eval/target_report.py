"""How structured is a target's greedy text? (DESIGN §11: a drafter is only as meaningful
as the target's text is structured; a target that loops flatters every drafter.)

For each built-in domain: the share of math answers ending in ``\\boxed{...}``, of code
answers whose fenced block parses with :func:`ast.parse`, and of answers caught in a
greedy repetition loop; plus a few sample answers.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from tqdm import tqdm

from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.decoding import speculative_generate
from dspark.drafters.ngram import NgramDrafter
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter

_BOXED = re.compile(r"\\boxed\{[^{}]+\}\s*$")
_FENCE = re.compile(r"```(?:python)?\n(.*?)(?:```|$)", re.S)


def ends_boxed(text: str) -> bool:
    return bool(_BOXED.search(text.strip()))


def code_parses(text: str) -> bool:
    """The first fenced block (or the whole text) is valid Python."""
    match = _FENCE.search(text)
    try:
        ast.parse(match.group(1) if match else text)
    except SyntaxError:
        return False
    return True


def is_looping(tokens: list[int], n: int = 8, repeats: int = 3) -> bool:
    """The answer ends in (or contains) an n-gram repeated back to back ``repeats`` times."""
    for start in range(0, max(0, len(tokens) - n * repeats) + 1):
        gram = tokens[start : start + n]
        if all(tokens[start + i * n : start + (i + 1) * n] == gram for i in range(1, repeats)):
            return True
    return False


@dataclass
class DomainReport:
    domain: str
    prompts: int = 0
    well_formed: int = 0  # math: ends boxed; code: parses; chat: finished with EOS
    looping: int = 0
    finished: int = 0
    samples: list[tuple[str, str]] = field(default_factory=list)  # (prompt, answer)

    def as_dict(self) -> dict:
        return {
            "domain": self.domain,
            "prompts": self.prompts,
            "well_formed_share": self.well_formed / max(self.prompts, 1),
            "looping_share": self.looping / max(self.prompts, 1),
            "finished_share": self.finished / max(self.prompts, 1),
        }


def target_report(
    target: TargetAdapter, *, limit: int = 40, max_tokens: int = 384, samples: int = 3
) -> list[DomainReport]:
    """Greedy answers of ``target`` on the built-in sets, checked per domain."""
    checks = {
        "math": lambda text, fin: ends_boxed(text),
        "code": lambda text, fin: code_parses(text),
        "chat": lambda text, fin: fin,
    }
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    drafter = NgramDrafter(target.vocab_size)  # lossless, so only faster than plain decoding
    reports = []
    for domain, check in checks.items():
        report = DomainReport(domain)
        for prompt in tqdm(load_prompts(domain, limit), desc=f"report {domain}", unit="prompt"):
            result = speculative_generate(
                target,
                drafter,
                prompt_ids(target.tokenizer, prompt),
                params,
                decode=lambda ids: target.tokenizer.decode(ids, skip_special_tokens=True),
            )
            finished = result.finish_reason == "stop"
            report.prompts += 1
            report.finished += finished
            report.well_formed += bool(check(result.text, finished))
            report.looping += is_looping(result.token_ids)
            if len(report.samples) < samples:
                report.samples.append((prompt.turns[0], result.text))
        reports.append(report)
    return reports
