"""Real speculative decoding of benchmarks with several drafters, side by side (DESIGN §12).

Every drafter answers the same prompts with the same seeds (one seed per prompt and
turn), and the plain target answers them too, interleaved prompt by prompt, so that
machine noise hits every method alike and the speedup is a ratio from one run. Each
answer is the first user turn through the target's chat template (every turn, feeding
back the method's own answers, with ``multi_turn``). Rounds are summarised with the
metrics of DESIGN §2 (:mod:`dspark.eval.metrics`); drafters that report confidences also
get the static threshold sweep of paper Fig. 5, and their rounds are kept for
calibration (:mod:`dspark.calibration`).

Every answer, the plain target's too, runs through the engine (DESIGN §10) as a request
alone that verifies every draft (:mod:`dspark.eval.engine_answer`): the τ and acceptance
tables measure the drafter, and greedy answers are those of the batch-1 reference loop.
The speed columns (tokens/s, speedup) come from a second decode of the same request
under the payoff controller, as every command serves it (``payoff_speed``; off: from the
verify-everything pass).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from dspark import conditions as run_conditions
from dspark.calibration.collect import ConfidenceRounds
from dspark.calibration.threshold import ThresholdSweep, threshold_sweep
from dspark.conditions import RunConditions
from dspark.data.chat import chat_prompt_ids, first_turn_messages
from dspark.data.prompts import Prompt
from dspark.errors import DsparkError
from dspark.eval.benchmarks import Benchmark
from dspark.eval.engine_answer import engine_answer, payoff_answer
from dspark.eval.metrics import acceptance_stats, macro_average, mean_defined
from dspark.protocols import Drafter, RoundLog, SamplingParams
from dspark.targets import TargetAdapter

log = logging.getLogger(__name__)

PLAIN = "none"  # the registry's name for plain decoding: the speedup baseline


# -- configuration and results ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    temperature: float = 1.0  # the paper's setting; 0 = greedy
    max_tokens: int = 256
    multi_turn: bool = False
    seed: int = 0
    block_size: int | None = None  # drafts per round; None = each drafter's own γ
    baseline: bool = True  # also decode with the plain target (for the speedup)
    template_kwargs: Mapping = field(default_factory=dict)  # passed to the chat template (DESIGN §7.4)
    progress: bool = True
    strict: bool = False  # a prompt that does not fit the context is an error instead of skipped
    payoff_speed: bool = True  # speed columns from a decode under payoff control


@dataclass(frozen=True)
class EvalRow:
    """One method on one benchmark (metric definitions: :mod:`dspark.eval.metrics`)."""

    drafter: str
    benchmark: str
    domain: str
    num_prompts: int
    block_size: int
    tau: float
    num_rounds: int
    tokens: int
    seconds: float
    tokens_per_s: float
    speedup: float | None  # tokens/s over the plain target's on the same prompts; None without baseline
    histogram: list[int]  # [γ+1] rounds emitting 1..γ+1 tokens
    prefix_survival: list[float | None]  # [γ]
    conditional_acceptance: list[float | None]  # [γ]
    verify_rate: float | None
    verified_per_round: float


@dataclass(frozen=True)
class DomainRow:
    """Macro averages over the benchmarks of one domain: each benchmark weighs the same."""

    drafter: str
    domain: str
    benchmarks: list[str]
    tau: float
    speedup: float | None
    tokens_per_s: float
    prefix_survival: list[float | None]
    conditional_acceptance: list[float | None]
    verify_rate: float | None


@dataclass(frozen=True)
class ThresholdRow:
    """The threshold sweep of one drafter over the pooled rounds of one domain (paper Fig. 5)."""

    drafter: str
    domain: str
    sweep: ThresholdSweep


@dataclass
class EvalResult:
    config: EvalConfig
    rows: list[EvalRow]
    domains: list[DomainRow]
    thresholds: list[ThresholdRow]
    # (drafter, benchmark) -> rounds with confidences, for drafters that report them.
    confidence_rounds: dict[tuple[str, str], ConfidenceRounds] = field(default_factory=dict)
    conditions: RunConditions | None = None  # threads, dtype, load while the speeds were measured
    skipped: dict[str, int] = field(default_factory=dict)  # benchmark -> prompts that did not fit

    def row(self, drafter: str, benchmark: str) -> EvalRow:
        return next(r for r in self.rows if r.drafter == drafter and r.benchmark == benchmark)


# -- decoding ----------------------------------------------------------------------------------


@dataclass
class _Tally:
    """What one method produced on one benchmark so far."""

    rounds: list[RoundLog] = field(default_factory=list)
    confidence: list[ConfidenceRounds] = field(default_factory=list)
    tokens: int = 0  # of the decodes whose rounds are in ``rounds`` (τ = tokens / rounds)
    timed_tokens: int = 0  # of the decodes timed for the speed columns (``seconds``)
    seconds: float = 0.0


def _seed(base: int, prompt_index: int, turn: int) -> int:
    return base * 1_000_003 + prompt_index * 64 + turn


def block_size_of(drafter: Drafter | None, config: EvalConfig) -> int:
    """Drafts per round: the configured γ, else the drafter's own (0 for plain decoding)."""
    if drafter is None:
        return 0
    if config.block_size is not None:
        return config.block_size
    return int(drafter.block_size)


def _answer(
    target: TargetAdapter,
    drafter: Drafter | None,
    prompt: Prompt,
    index: int,
    config: EvalConfig,
    tally: _Tally,
    max_tokens: int | None = None,
) -> None:
    """Decode one prompt (all its turns with ``multi_turn``) and add the rounds to ``tally``."""
    block_size = block_size_of(drafter, config)
    messages = first_turn_messages(prompt)
    turns = prompt.turns if config.multi_turn else prompt.turns[:1]
    for turn, text in enumerate(turns):
        if turn > 0:
            messages.append({"role": "user", "content": text})
        ids = chat_prompt_ids(target.tokenizer, messages, config.template_kwargs)
        if len(ids) + 1 > target.max_context:
            log.warning(
                "%s: turn %d no longer fits the context; stopping this conversation", prompt.source, turn
            )
            return
        params = SamplingParams(
            temperature=config.temperature,
            max_tokens=max_tokens or config.max_tokens,
            seed=_seed(config.seed, index, turn),
        )
        answer = engine_answer(target, drafter, ids, params, block_size=block_size, group=index)
        result = answer.result
        tally.rounds += result.rounds
        timed = result
        if config.payoff_speed and drafter is not None:
            timed = payoff_answer(target, drafter, ids, params, block_size=block_size)
        tally.tokens += len(result.token_ids)
        tally.timed_tokens += len(timed.token_ids)
        tally.seconds += timed.seconds
        if answer.confidence.num_rounds:
            tally.confidence.append(answer.confidence)
        messages.append({"role": "assistant", "content": result.text})


def fitting_prompts(
    target: TargetAdapter, benchmarks: Sequence[Benchmark], config: EvalConfig
) -> tuple[list[Benchmark], dict[str, int]]:
    """The benchmarks without prompts whose first turn leaves no room in the target's context,
    and how many each lost; with ``config.strict`` such a prompt is an error instead."""
    kept, skipped = [], {}
    for bench in benchmarks:
        fit = []
        for prompt in bench.prompts:
            n = len(chat_prompt_ids(target.tokenizer, first_turn_messages(prompt), config.template_kwargs))
            if n + 1 <= target.max_context:
                fit.append(prompt)
            elif config.strict:
                raise DsparkError(
                    f"{prompt.source}: the prompt has {n} tokens; the target's context is "
                    f"{target.max_context} (without --strict such prompts are skipped and counted)"
                )
        if len(fit) < len(bench.prompts):
            skipped[bench.name] = len(bench.prompts) - len(fit)
            log.warning(
                "%s: skipped %d of %d prompts that do not fit the target's context of %d tokens",
                bench.name, skipped[bench.name], len(bench.prompts), target.max_context,
            )  # fmt: skip
        if fit:
            kept.append(dataclasses.replace(bench, prompts=tuple(fit)))
    if not kept:
        raise DsparkError(f"no prompt fits the target's context of {target.max_context} tokens")
    return kept, skipped


# -- summaries ---------------------------------------------------------------------------------


def _row(name: str, bench: Benchmark, tally: _Tally, block_size: int, plain_tps: float | None) -> EvalRow:
    stats = acceptance_stats(tally.rounds, block_size)
    tps = tally.timed_tokens / tally.seconds if tally.seconds > 0 else 0.0
    return EvalRow(
        drafter=name,
        benchmark=bench.name,
        domain=bench.domain,
        num_prompts=len(bench.prompts),
        block_size=block_size,
        tau=stats.tau,
        num_rounds=stats.num_rounds,
        tokens=tally.tokens,
        seconds=tally.seconds,
        tokens_per_s=tps,
        speedup=tps / plain_tps if plain_tps else None,
        histogram=stats.histogram,
        prefix_survival=stats.prefix_survival,
        conditional_acceptance=stats.conditional_acceptance,
        verify_rate=stats.verify_rate,
        verified_per_round=stats.verified_per_round,
    )


def domain_rows(rows: Sequence[EvalRow]) -> list[DomainRow]:
    """Macro averages of ``rows`` per (drafter, domain), in first-seen order."""
    groups: dict[tuple[str, str], list[EvalRow]] = defaultdict(list)
    for r in rows:
        groups[(r.drafter, r.domain)].append(r)
    out = []
    for (drafter, domain), group in groups.items():
        out.append(
            DomainRow(
                drafter=drafter,
                domain=domain,
                benchmarks=[r.benchmark for r in group],
                tau=sum(r.tau for r in group) / len(group),
                speedup=mean_defined([r.speedup for r in group]),
                tokens_per_s=sum(r.tokens_per_s for r in group) / len(group),
                prefix_survival=macro_average([r.prefix_survival for r in group]),
                conditional_acceptance=macro_average([r.conditional_acceptance for r in group]),
                verify_rate=mean_defined([r.verify_rate for r in group]),
            )
        )
    return out


def _threshold_rows(
    confidence: Mapping[tuple[str, str], ConfidenceRounds], benchmarks: Sequence[Benchmark]
) -> list[ThresholdRow]:
    domain_of = {b.name: b.domain for b in benchmarks}
    pooled: dict[tuple[str, str], list[ConfidenceRounds]] = defaultdict(list)
    for (drafter, bench), rounds in confidence.items():
        pooled[(drafter, domain_of[bench])].append(rounds)
    return [
        ThresholdRow(drafter, domain, threshold_sweep(ConfidenceRounds.concat(parts, parts[0].block_size)))
        for (drafter, domain), parts in pooled.items()
    ]


# -- the run -----------------------------------------------------------------------------------


@torch.no_grad()
def run_eval(
    target: TargetAdapter,
    drafters: Mapping[str, Drafter | None],
    benchmarks: Sequence[Benchmark],
    config: EvalConfig,
) -> EvalResult:
    """Decode every benchmark with every drafter (and the plain target); see the module docstring."""
    if not drafters:
        raise DsparkError("no drafters to evaluate")
    benchmarks, skipped = fitting_prompts(target, benchmarks, config)
    methods: dict[str, Drafter | None] = dict(drafters)
    if config.baseline and PLAIN not in methods:
        methods = {PLAIN: None, **methods}
    conditions = run_conditions.for_target(target)
    # One short untimed answer per method first: lazy initialisation must not bill the first one.
    warmup = benchmarks[0].prompts[0]
    for drafter in methods.values():
        _answer(target, drafter, warmup, 0, config, _Tally(), max_tokens=min(8, config.max_tokens))

    total = sum(len(b.prompts) for b in benchmarks) * len(methods)
    rows: list[EvalRow] = []
    confidence: dict[tuple[str, str], ConfidenceRounds] = {}
    with tqdm(total=total, desc="eval", unit="answer", disable=not config.progress) as bar:
        for bench in benchmarks:
            tallies = {name: _Tally() for name in methods}
            for i, prompt in enumerate(bench.prompts):
                for name, drafter in methods.items():
                    bar.set_postfix_str(f"{bench.name} · {name}", refresh=False)
                    _answer(target, drafter, prompt, i, config, tallies[name])
                    bar.update(1)
            plain = tallies.get(PLAIN)
            plain_tps = plain.tokens / plain.seconds if plain is not None and plain.seconds > 0 else None
            for name, drafter in methods.items():
                block_size = block_size_of(drafter, config)
                rows.append(_row(name, bench, tallies[name], block_size, plain_tps))
                if tallies[name].confidence:
                    confidence[(name, bench.name)] = ConfidenceRounds.concat(
                        tallies[name].confidence, block_size
                    )
    return EvalResult(
        config=config,
        rows=rows,
        domains=domain_rows(rows),
        thresholds=_threshold_rows(confidence, benchmarks),
        confidence_rounds=confidence,
        conditions=conditions.ended(),
        skipped=skipped,
    )
