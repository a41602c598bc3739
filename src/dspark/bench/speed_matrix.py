"""The speedup matrix: prompt set x drafter x concurrency -> tokens/s over plain decoding.

For every prompt set and concurrency c, the same ``max(c, requests)`` greedy requests are
decoded as one continuous batch of c KV slots by plain decoding, then by every drafter
under the payoff controller (the default of every command) and under each static policy
(every round drafts, ``fixed`` / ``fixed:k``; no payoff control), all in the same
process, so each figure is a ratio against a baseline measured minutes earlier on the
same machine. Greedy outputs are compared with plain decoding's (losslessness).

Speeds are tokens per CPU-second of this process (``time.process_time``; run with one
thread): on a shared machine wall time mostly measures the other jobs. The wall-clock
ratio is kept beside it. With ``repeats > 1`` plain decoding and every method of a
(prompt set, concurrency) pair run in turn that many times and their seconds are summed,
so a drift of the machine's load between runs weighs on the baseline and the methods alike.

Each repeat ends with plain decoding once more (the *control*): the baseline is both runs
together, symmetric around the methods, and their disagreement is an A/A test. On a
shared machine the same computation's speed moves by several percent between runs
(a 2-vCPU VM: ±13 % between two halves of one plain-vs-plain comparison at 64 requests),
so a cell's ratio is only known to within about its pair's ``noise``, and
:func:`goals` says which cells miss the floor by more than that.
"""

from __future__ import annotations

import gc
import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dspark.engine import Engine, EngineConfig
from dspark.protocols import Drafter, SamplingParams
from dspark.targets import TargetAdapter

PAYOFF = "payoff"
PLAIN = "plain"
CONTROL = "control"  # plain decoding again, last in each repeat


@dataclass(frozen=True)
class Cell:
    prompt_set: str
    drafter: str
    concurrency: int
    method: str  # PAYOFF or a static policy
    tokens_per_s: float  # per CPU-second
    speedup: float  # over plain decoding of the same requests at the same concurrency, per CPU-second
    wall_speedup: float  # the same in wall-clock time
    tau: float
    drafted_share: float  # decode rounds that drafted
    identical: bool  # greedy output equal to plain decoding's
    # |1 − control / plain| in tokens per CPU-second: how far plain decoding moved against itself
    # over the same repeats (an A/A test of this prompt set and concurrency)
    noise: float = 0.0
    # the standard error of the speedup over the repeats (each repeat's method against its own
    # plain and control runs; 0 with one repeat): how far the runs of this very method scatter,
    # which the A/A test of plain decoding does not see (A/A 0.2 % where two
    # processes read one cell 0.91× and 0.95×)
    spread: float = 0.0
    repeats: int = 1  # the repeats behind ``spread``


@dataclass(frozen=True)
class _Run:
    seconds: float  # CPU
    wall_s: float
    tokens: int
    outputs: list[list[int]] | None  # None: repeats of the same requests gave different outputs
    tau: float
    drafted_share: float

    @property
    def tokens_per_s(self) -> float:  # per CPU-second
        return self.tokens / self.seconds

    def __add__(self, other: _Run) -> _Run:
        """Two runs of the same requests: seconds and tokens summed, the first one's outputs."""
        return _Run(
            seconds=self.seconds + other.seconds,
            wall_s=self.wall_s + other.wall_s,
            tokens=self.tokens + other.tokens,
            outputs=self.outputs if self.outputs == other.outputs else None,
            tau=(self.tau + other.tau) / 2,
            drafted_share=(self.drafted_share + other.drafted_share) / 2,
        )


def _decode(engine: Engine, prompts: list[list[int]], max_tokens: int) -> _Run:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    engine.stats = type(engine.stats)()
    # The previous runs' engines (KV slots, drafter caches) are freed now, not by a garbage
    # collection in the middle of this run and charged to it
    gc.collect()
    started, cpu_started = time.perf_counter(), time.process_time()
    results = engine.generate(prompts, params)
    seconds, wall_s = time.process_time() - cpu_started, time.perf_counter() - started
    s = engine.stats
    drafted = sum(1 for res in results for r in res.rounds if r.proposed > 0)
    rounds = sum(len(res.rounds) for res in results)
    return _Run(
        seconds=seconds,
        wall_s=wall_s,
        tokens=sum(len(r.token_ids) for r in results),
        outputs=[r.token_ids for r in results],
        tau=s.tau,
        drafted_share=drafted / rounds if rounds else 0.0,
    )


def speed_matrix(
    target: TargetAdapter,
    prompt_sets: dict[str, list[list[int]]],
    drafters: dict[str, Drafter],
    concurrencies: Sequence[int],
    *,
    max_tokens: int = 32,
    requests: int = 4,
    block_size: int = 7,
    static: Sequence[str] = ("fixed",),
    max_seq_len: int = 512,
    repeats: int = 1,
    progress: Callable[[Cell], None] | None = None,
) -> list[Cell]:
    """Every cell of the matrix (see the module docstring); prompts are token ids."""
    cells = []
    for (name, ids), c in itertools.product(prompt_sets.items(), concurrencies):
        prompts = list(itertools.islice(itertools.cycle(ids), max(c, requests)))
        seq_len = min(target.max_context, max(max_seq_len, max(map(len, prompts)) + max_tokens + 1))

        def engine(drafter: Drafter | None, policy: str, payoff: bool, c: int = c, seq_len: int = seq_len):
            config = EngineConfig(
                block_size=block_size, policy=policy, max_batch=c, max_seq_len=seq_len, payoff=payoff
            )
            return Engine(target, drafter, config)

        methods = [(d, m) for d in drafters for m in (PAYOFF, *static)]
        runs: dict[tuple[str, str] | None, _Run] = {}
        ratios: dict[tuple[str, str], list[float]] = {m: [] for m in methods}  # per repeat
        for _ in range(repeats):
            this: dict[tuple[str, str] | None, _Run] = {}  # this repeat's runs
            for key in (None, *methods, CONTROL):
                if key is None or key == CONTROL:
                    run = _decode(engine(None, "fixed", False), prompts, max_tokens)
                else:
                    drafter, method = drafters[key[0]], key[1]
                    run = _decode(
                        engine(drafter, "fixed" if method == PAYOFF else method, method == PAYOFF),
                        prompts,
                        max_tokens,
                    )
                this[key] = run
                runs[key] = runs[key] + run if key in runs else run
            base = this[None] + this[CONTROL]
            for key in methods:
                ratios[key].append(this[key].tokens_per_s / base.tokens_per_s)
        plain = runs[None] + runs[CONTROL]
        plain_tps = plain.tokens_per_s
        noise = abs(runs[CONTROL].tokens_per_s / runs[None].tokens_per_s - 1)
        for drafter_name, method in methods:
            run = runs[(drafter_name, method)]
            tps = run.tokens_per_s
            cell = Cell(
                prompt_set=name,
                drafter=drafter_name,
                concurrency=c,
                method=method,
                tokens_per_s=tps,
                speedup=tps / plain_tps,
                wall_speedup=plain.wall_s / run.wall_s * run.tokens / plain.tokens,
                tau=run.tau,
                drafted_share=run.drafted_share,
                identical=run.outputs is not None and run.outputs == plain.outputs,
                noise=noise,
                spread=_standard_error(ratios[(drafter_name, method)]),
                repeats=repeats,
            )
            cells.append(cell)
            if progress is not None:
                progress(cell)
    return cells


def _standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean of ``values`` (0 for fewer than two)."""
    return statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0


def repeats_to_decide(cell: Cell, floor: float) -> int | None:
    """About how many repeats would put ``cell``'s speedup two standard errors from ``floor``, if
    it kept its reading and the scatter of one repeat (``spread · √repeats``):
    ``⌈(2·sd / |floor − speedup|)²⌉``. None without a scatter (one repeat) or on the floor.

    On a 2-vCPU VM one repeat's speedup scatters by 0.06–0.11, so a cell 3 % from the floor
    takes about 20 repeats where 3 leave it undecided (BENCHMARKS.md)."""
    gap = abs(floor - cell.speedup)
    if cell.spread <= 0 or cell.repeats < 2 or gap == 0:
        return None
    return math.ceil((2 * cell.spread * math.sqrt(cell.repeats) / gap) ** 2)


def goals(cells: list[Cell], *, floor: float = 0.97, keep: float = 0.95) -> dict:
    """Issue 17's goals over the payoff cells: every speedup >= ``floor``, and >= ``keep`` of
    the best static policy's where that one is above 1 (speculation pays). ``beyond_noise``:
    the cells below the floor by more than their pair's A/A ``noise``; ``beyond_spread``: by
    more than two standard errors of their repeats (``spread``); ``undecided``: the cells below
    the floor within two standard errors, with the repeats that would decide each
    (:func:`repeats_to_decide`)."""
    payoff = {(c.prompt_set, c.drafter, c.concurrency): c for c in cells if c.method == PAYOFF}
    below_floor, below_keep, beyond_noise, beyond_spread = [], [], [], []
    undecided: dict[tuple[str, str, int], int | None] = {}
    for key, cell in payoff.items():
        static = [
            c.speedup for c in cells if c.method != PAYOFF and (c.prompt_set, c.drafter, c.concurrency) == key
        ]
        best = max(static, default=0.0)
        if cell.speedup < floor:
            below_floor.append(key)
        if cell.speedup < floor - cell.noise:
            beyond_noise.append(key)
        if cell.speedup < floor - 2 * cell.spread:
            beyond_spread.append(key)
        elif cell.speedup < floor:
            undecided[key] = repeats_to_decide(cell, floor)
        if best > 1.0 and cell.speedup < keep * best:
            below_keep.append(key)
    return {
        "cells": len(payoff),
        "min_speedup": min((c.speedup for c in payoff.values()), default=None),
        "below_floor": below_floor,
        "below_floor_beyond_noise": beyond_noise,
        # ... and by more than two standard errors of their own repeats (``Cell.spread``)
        "below_floor_beyond_spread": beyond_spread,
        "below_floor_undecided": [{"cell": key, "repeats_to_decide": n} for key, n in undecided.items()],
        "max_noise": max((c.noise for c in payoff.values()), default=None),
        "below_95pct_of_best_static": below_keep,
        "all_identical": all(c.identical for c in cells),
    }
