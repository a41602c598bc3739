"""Chains and token trees side by side on the batch-1 loops: τ, verified nodes per round, speed.

Each *arm* decodes every prompt once: a chain (``decoding/loop.py``, γ drafts a round) or
a tree (``decoding/tree_loop.py``) under a :class:`~dspark.decoding.tree_loop.TreeBudget`
(a fixed node count, Algorithm 1 over an SPS table, or the whole tree). Arms run
interleaved prompt by prompt, so a slow drift of a shared machine spreads over all of
them. Terms (DESIGN §2): τ = tokens emitted per verification round (accepted drafts + 1);
*nodes* = drafts verified per round (γ for a full chain). Speed is tokens per second of
the decoding thread's CPU time (one thread: what the wall clock reads on an idle
machine; a shared machine's wall clock is kept beside it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dspark.decoding.loop import speculative_generate
from dspark.decoding.tree_loop import TreeBudget, tree_generate
from dspark.protocols import GenerationResult, SamplingParams
from dspark.sampling.tree import TreeConfig
from dspark.scheduler.profile import SpsTable, measure_sps
from dspark.targets import TargetAdapter


@dataclass(frozen=True, kw_only=True)
class Arm:
    """One way of decoding: ``tree`` None is the chain of ``block_size`` drafts."""

    name: str
    drafter: str  # a key of the drafters passed to :func:`compare`
    tree: TreeConfig | None = None
    budget: TreeBudget = TreeBudget()
    block_size: int = 7

    @property
    def shape(self) -> str:
        return "chain" if self.tree is None or max(self.tree.widths) == 1 else "tree"

    @property
    def sizing(self) -> str:
        """How many drafts a round verifies: ``"7"`` (fixed), ``"alg1"`` or ``"all"``."""
        if self.tree is None:
            return str(self.block_size)
        if self.budget.nodes is not None:
            return str(self.budget.nodes)
        return "alg1" if self.budget.sps is not None else "all"


@dataclass(frozen=True, kw_only=True)
class ArmResult:
    """An arm's totals over the prompts."""

    arm: str
    drafter: str
    shape: str  # "chain" | "tree"
    sizing: str  # Arm.sizing
    rounds: int
    tokens: int
    nodes: int  # drafts verified, over all rounds
    accepted: int
    seconds: float  # thread CPU time
    wall_seconds: float

    @property
    def tau(self) -> float:
        return self.tokens / max(self.rounds, 1)

    @property
    def nodes_per_round(self) -> float:
        return self.nodes / max(self.rounds, 1)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    def as_dict(self) -> dict:
        return {
            "arm": self.arm,
            "drafter": self.drafter,
            "shape": self.shape,
            "sizing": self.sizing,
            "tau": self.tau,
            "nodes_per_round": self.nodes_per_round,
            "tokens_per_s": self.tokens_per_s,
            "wall_seconds": self.wall_seconds,
            "rounds": self.rounds,
            "tokens": self.tokens,
            "seconds": self.seconds,
        }


def tree_arms(
    drafters: Sequence[str],
    tree: TreeConfig,
    *,
    block_size: int = 7,
    node_budgets: Sequence[int] = (7,),
    sps: SpsTable | None = None,
) -> list[Arm]:
    """Per drafter: the chain of ``n`` drafts and the tree at ``n`` verified nodes for each
    ``n`` of ``node_budgets`` (a tree against a chain at the same verification budget), and,
    with an SPS table, the chain and the tree sized by Algorithm 1 (block ``block_size``)."""
    width_1 = TreeConfig(widths=(1,), frontier=1)
    arms = []
    for name in drafters:
        for n in node_budgets:
            arms.append(Arm(name=f"{name} chain {n}", drafter=name, block_size=n))
            arms.append(
                Arm(
                    name=f"{name} tree {n}",
                    drafter=name,
                    tree=tree,
                    budget=TreeBudget(nodes=n),
                    block_size=block_size,
                )
            )
        if sps is not None:
            budget = TreeBudget(sps=sps)
            arms.append(
                Arm(
                    name=f"{name} chain alg1",
                    drafter=name,
                    tree=width_1,
                    budget=budget,
                    block_size=block_size,
                )
            )
            arms.append(
                Arm(name=f"{name} tree alg1", drafter=name, tree=tree, budget=budget, block_size=block_size)
            )
    return arms


def run_arm(
    target: TargetAdapter, drafter, arm: Arm, prompt_ids: list[int], params: SamplingParams
) -> GenerationResult:
    if arm.tree is None:
        return speculative_generate(target, drafter, prompt_ids, params, block_size=arm.block_size)
    return tree_generate(
        target, drafter, prompt_ids, params, config=arm.tree, budget=arm.budget, block_size=arm.block_size
    )


def compare(
    target: TargetAdapter,
    drafters: dict,
    arms: Sequence[Arm],
    prompts: Sequence[list[int]],
    params: SamplingParams,
    *,
    progress: Callable[[int], None] | None = None,
) -> list[ArmResult]:
    """Decode every prompt with every arm, interleaved; one :class:`ArmResult` per arm.

    ``rounds`` and ``tokens`` count emitted tokens as the rounds report them, so τ is the
    mean emitted per round (the last round may be cut by ``max_tokens``).
    """
    totals = {a.name: [0, 0, 0, 0, 0.0, 0.0] for a in arms}  # rounds, tokens, nodes, accepted, cpu s, wall s
    for i, ids in enumerate(prompts):
        for arm in arms:
            started, cpu_started = time.perf_counter(), time.thread_time()
            out = run_arm(target, drafters[arm.drafter], arm, ids, params)
            t = totals[arm.name]
            t[0] += len(out.rounds)
            t[1] += sum(r.emitted for r in out.rounds)
            t[2] += sum(r.proposed for r in out.rounds)
            t[3] += sum(r.accepted for r in out.rounds)
            t[4] += time.thread_time() - cpu_started
            t[5] += time.perf_counter() - started
        if progress is not None:
            progress(i)
    return [
        ArmResult(
            arm=a.name,
            drafter=a.drafter,
            shape=a.shape,
            sizing=a.sizing,
            rounds=t[0],
            tokens=t[1],
            nodes=t[2],
            accepted=t[3],
            seconds=t[4],
            wall_seconds=t[5],
        )
        for a in arms
        for t in [totals[a.name]]
    ]


def batch1_sps(
    target: TargetAdapter, *, context: int = 256, max_tokens: int = 64, repeats: int = 5
) -> SpsTable:
    """SPS(B) of the batch-1 loop's verification forward: B tokens after ``context`` cached ones,
    with a tree mask (a chain's, which costs what any tree's does), rolled back after each step."""
    cache = target.new_cache()
    ids = torch.randint(5, min(100, target.vocab_size), (1, context + max_tokens))
    target.forward(ids[:, :context], cache, with_features=False)

    def step(B: int) -> None:
        mask = torch.ones(1, 1, B, context + B, dtype=torch.bool)
        mask[0, 0, :, context:] = torch.ones(B, B, dtype=torch.bool).tril()
        target.forward(ids[:, context : context + B], cache, with_features=False, attention_mask=mask)
        target.rollback(cache, context)

    sizes = list(range(1, 17)) + [s for s in (20, 24, 32, 40, 48, 64) if s <= max_tokens]
    meta = {"context": context, "loop": "batch-1", "clock": "thread"}
    return measure_sps(step, sizes, repeats=repeats, meta=meta, clock=time.thread_time)
