"""The campaign's stages, each resumable (:mod:`dspark.pipeline.stages`), for one target.

Layout of a campaign folder (keep it outside git; ``dspark campaign`` defaults to the
user cache)::

    data/answers.jsonl      the target's own answers to its training prompts
    cache/                  the offline feature cache of those answers (built once)
    train/<method>/         trainer output: checkpoints/, metrics.jsonl
    drafters/<method>/      the trained drafters (HF folders)
    eval/                   results.json, report.md, plots
    stages/<stage>.json     resume markers

A kill at any moment loses at most the work since the last record (regeneration),
checkpoint (training) or the stage in flight (cache, evaluation); a rerun of the same
command resumes there. Deleting the folder restarts from nothing.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from dspark.data.cache import FeatureCache
from dspark.data.cache_build import CacheBuildConfig
from dspark.data.cache_pieces import build_cache_in_pieces
from dspark.data.prompts import Prompt
from dspark.data.records import read_jsonl
from dspark.data.regenerate import InProcessBackend, RegenerateConfig, regenerate
from dspark.data.samples import TrainDataset
from dspark.drafters.draft_vocab import with_draft_vocab
from dspark.errors import DsparkError
from dspark.eval.benchmarks import load_benchmark
from dspark.eval.online import online_tau_eval
from dspark.eval.report import write_eval_report
from dspark.eval.runner import EvalConfig, run_eval
from dspark.formats.build import build_drafter
from dspark.formats.folder import file_sha256, load_drafter
from dspark.pipeline.campaign.plateau import plateaued
from dspark.pipeline.campaign.progress import plot_learning_curves
from dspark.pipeline.campaign.prompts import synthetic_prompts
from dspark.pipeline.campaign.sweeps import run_sweep
from dspark.pipeline.presets import METHODS, CampaignPlan
from dspark.pipeline.quickstart.validation import expected_tau
from dspark.pipeline.stages import Stages, claim_run_folder
from dspark.presets import drafters as presets
from dspark.presets.tiny import resolve_target
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter
from dspark.targets.dtype import inference_dtype
from dspark.tiny.corpus import training_records
from dspark.training.fresh import train_new_drafter
from dspark.training.recipe import train_config
from dspark.training.run_identity import pad_id

# The layout's top-level names (module docstring, and `--sweeps`'): what the campaign folder claims.
OUTPUTS = (
    "data",
    "cache",
    "train",
    "drafters",
    "eval",
    "sweeps",
    "stages",
    "summary.json",
    "learning_curves.png",
)
TAU = "eval/val_expected_tau"  # what the stop rule watches: expected τ on fixed samples (see TrainingEval)
VALIDATION_SAMPLES = 64
REAL_TAU_EVERY = 5  # evaluations; real τ (decoding) is the costly part


def _sha(path: Path) -> str:
    return file_sha256(path)[:16]


class PlateauStop:
    """The trainer's stop rule: expected τ rose < ``gain`` over the last ``tail`` of the steps.

    The history comes from the run's ``metrics.jsonl`` (read once, up to the step the run
    resumed from) plus every record logged since, so a resumed run decides as an
    uninterrupted one would.
    """

    def __init__(self, metrics: Path, *, tail: float, gain: float, min_step: int, window: int = 2) -> None:
        self.metrics, self.tail, self.gain, self.min_step, self.window = metrics, tail, gain, min_step, window
        self.steps: list[int] | None = None
        self.values: list[float] = []

    def _load(self, before: int) -> None:
        self.steps = []
        lines = self.metrics.read_text().splitlines() if self.metrics.is_file() else []
        for line in lines:
            record = json.loads(line)
            if record.get("step", before) < before and isinstance(record.get(TAU), int | float):
                self.steps.append(int(record["step"]))
                self.values.append(float(record[TAU]))

    def __call__(self, step: int, record: Mapping[str, float]) -> bool:
        if self.steps is None:
            self._load(before=step)
        if isinstance(record.get(TAU), int | float):
            self.steps.append(step)
            self.values.append(float(record[TAU]))
        return plateaued(
            self.steps,
            self.values,
            tail=self.tail,
            min_gain=self.gain,
            min_step=self.min_step,
            window=self.window,
        )


class TrainingEval:
    """The campaign's evaluation hook: expected τ on fixed samples, and now and then real τ.

    The expected τ the trainer logs comes from each step's 8 samples and swings by ±15 %
    from batch to batch — far too noisy to see a 1 % plateau (a first campaign stopped
    on that noise after 2 epochs). Here the same ``VALIDATION_SAMPLES`` cached samples,
    with the same anchors, are scored at every evaluation, so the curve only moves when
    the weights do. They are training samples (the cache is one dataset): the curve
    measures fit, which at 2 M parameters on 7 k samples is what τ on new text tracks.
    Every ``REAL_TAU_EVERY``-th evaluation also decodes held-out prompts (real τ).
    """

    def __init__(self, features, target, num_anchors: int, real_tau, every: int) -> None:

        step = max(1, len(features) // VALIDATION_SAMPLES)
        indices = list(range(0, len(features), step))[:VALIDATION_SAMPLES]
        self.batches = [
            features.target_batch(
                indices[i : i + 4],
                pad_id=pad_id(target),
                num_anchors=num_anchors,
                generator=torch.Generator().manual_seed(i),
                dtype=torch.float32,
            )
            for i in range(0, len(indices), 4)
        ]
        self.target, self.real_tau, self.every, self.calls = target, real_tau, every, 0

    def __call__(self, drafter, step: int) -> dict[str, float]:

        result = {"val_expected_tau": expected_tau(drafter, self.target, self.batches)}
        self.calls += 1
        if self.calls % self.every == 0:
            result |= self.real_tau(drafter, step)
        return result


def corpus_prompts(limit: int | None):
    """The tiny target's training prompts, in corpus order (the evaluation sets never occur there)."""

    prompts = [
        Prompt((r["conversations"][0]["content"],), r["domain"], f"tiny-corpus:{i}")
        for i, r in enumerate(training_records())
    ]
    return prompts[:limit] if limit else prompts


def training_prompts(plan: CampaignPlan):
    """The prompts the target answers to make its training data."""
    if plan.prompt_source == "tiny-corpus":
        return corpus_prompts(plan.prompts)
    if plan.prompt_source == "synthetic":
        return synthetic_prompts(plan.prompts or 3000, plan.seed)
    raise DsparkError(f"unknown prompt source {plan.prompt_source!r} (tiny-corpus or synthetic)")


def target_dtype(source: Path) -> torch.dtype:
    """The dtype of the campaign's target: the one dspark serves it in on this machine.

    ``targets/dtype.py``: bf16 on CUDA and on CPUs with native bf16 for hidden >= 512, so
    SmolLM2 but not the tiny target. The target then answers the prompts and gives the
    features in the dtype it verifies drafts in, and its forward over a long sequence runs
    3.7x faster in bf16 on a CPU with AMX (BENCHMARKS.md). It is in no stage key:
    a campaign resumed on another machine keeps what it has.
    """

    hidden = json.loads((source / "config.json").read_text()).get("hidden_size")
    return inference_dtype("auto", hidden_size=hidden)


class Campaign:
    """One target's campaign: the plan, its folder, the loaded target and the stages."""

    def __init__(
        self, plan: CampaignPlan, out: Path, *, progress: bool, announce: Callable[[str], None]
    ) -> None:

        self.plan, self.out, self.progress = plan, out, progress
        self.stages = Stages(out, announce=announce)
        source = Path(resolve_target(plan.target))
        dtype = target_dtype(source)
        self.target = TargetAdapter.from_pretrained(str(source), dtype=dtype)
        announce(f"target {plan.target} in {str(dtype).removeprefix('torch.')}")
        self.target_id = _sha(source / "model.safetensors")

    # -- 1. the target's own answers -----------------------------------------------------------

    def regenerate(self) -> dict[str, Any]:
        p = self.plan
        key = {"target": self.target_id} | p.part(
            "prompts", "regen_max_tokens", "regen_temperature", "max_length", "seed"
        )  # fmt: skip
        if p.prompt_source != "tiny-corpus":  # keys of earlier tiny campaigns stay valid
            key["prompt_source"] = p.prompt_source
        answers = self.out / "data" / "answers.jsonl"
        errors = answers.with_name("answers.errors.jsonl")
        claims = answers.with_name("answers.jsonl.claims")

        def answer(*, wait_for_others: bool):
            # Every campaign process on this folder answers the prompts together, each
            # prompt once: the one running the stage until all are answered, the others
            # while any is left that nobody is answering (then they wait for the stage).

            params = SamplingParams(
                temperature=p.regen_temperature, max_tokens=p.regen_max_tokens, seed=p.seed
            )
            backend = InProcessBackend(self.target, max_batch=p.regen_batch, max_seq_len=p.max_length)
            config = RegenerateConfig(
                concurrency=p.regen_batch,
                progress=self.progress,
                shared=True,
                wait_for_others=wait_for_others,
            )
            return regenerate(training_prompts(p), backend, answers, errors, params, config)

        def run() -> dict[str, Any]:

            summary = answer(wait_for_others=True)
            records = read_jsonl(answers, log=True)
            failed = summary.total - len({r.get("id") for r in records})  # by whichever process
            if failed > 0.01 * summary.total:
                raise DsparkError(f"{failed} prompts failed (reasons in {errors}); rerun to retry")
            return {
                "prompts": summary.total,
                "failed": failed,
                "completion_tokens": sum(sum(n or 0 for n in r["num_tokens"]) for r in records),
                "tokens_per_s": round(summary.tokens_per_s, 1),  # this process's, in its last run
                "answers": str(answers.relative_to(self.out)),
                "data_id": _sha(answers),
            }

        summary = self.stages.run_shared(
            "regenerate",
            key,
            run,
            lambda: answer(wait_for_others=False),
            "answering beside it",
            outputs=(answers, errors, claims),
        )
        shutil.rmtree(claims, ignore_errors=True)  # a late helper may have made it again
        return summary

    # -- 2. the feature cache ------------------------------------------------------------------

    def cache(self, data: dict[str, Any]) -> dict[str, Any]:
        p = self.plan
        key = {"target": self.target_id, "data": data["data_id"]} | p.part("cache_dtype", "max_length")
        root = self.out / "cache"

        def build(*, wait_for_others: bool) -> dict[str, Any] | None:
            # Piece by piece: a kill loses at most the piece in flight, and every campaign
            # process on this folder writes the pieces nobody else holds.

            config = CacheBuildConfig(dtype=p.cache_dtype, max_length=p.max_length, progress=self.progress)
            records = read_jsonl(self.out / data["answers"])
            return build_cache_in_pieces(self.target, records, root, config, wait_for_others=wait_for_others)

        def run() -> dict[str, Any]:
            manifest = build(wait_for_others=True)
            return {
                "samples": manifest["data"]["num_samples"],
                "tokens": manifest["data"]["num_tokens"],
                "supervised_tokens": manifest["data"]["num_supervised_tokens"],
                "seconds": manifest["build_seconds"],
                "cache_id": manifest["data"]["fingerprint"][:16],
            }

        return self.stages.run_shared(
            "cache",
            key,
            run,
            lambda: build(wait_for_others=False),
            "writing pieces beside it",
            outputs=(root,),
        )

    # -- 3. training, equal budgets --------------------------------------------------------------

    def train(
        self,
        method: str,
        preset: str,
        cache: dict[str, Any],
        *,
        name: str | None = None,
        changes: tuple[tuple[str, int], ...] = (),
        plan: CampaignPlan | None = None,
    ) -> dict[str, Any]:
        """Train ``method`` from ``preset``; a sweep variant passes its ``name`` (stage and
        folders), the ``changes`` to the preset's config and its ``plan`` (the sweep's budget)."""
        p = plan or self.plan
        name = name or method
        key = {"target": self.target_id, "cache": cache["cache_id"], "preset": preset} | p.part(
            "epochs", "batch_size", "micro_batch_size", "num_anchors", "lr", "seed",
            "plateau_tail", "plateau_gain", "plateau_min_epochs",
        )  # fmt: skip
        if p.draft_vocab is not None:  # keys of plans without one stay as they were (resume)
            key |= p.part("draft_vocab")
        if changes:
            key["changes"] = [list(c) for c in changes]
        run_dir = self.out / "train" / name
        folder = self.out / "drafters" / name

        def run() -> dict[str, Any]:

            features = FeatureCache.open(self.out / "cache")
            features.check_compatible(self.target, template_kwargs={}, max_length=p.max_length)
            samples = TrainDataset(features.token_samples())
            max_steps = p.steps(len(samples))
            cfg = train_config(
                run_dir,
                p,
                max_steps=max_steps,
                save_every=p.save_every,
                keep_last=2,
                log_every=p.log_every,
                eval_every=p.save_every,
                progress=self.progress,
            )
            stop = PlateauStop(
                run_dir / "metrics.jsonl",
                tail=p.plateau_tail,
                gain=p.plateau_gain,
                min_step=round(p.plateau_min_epochs * len(samples) / p.batch_size),
            )
            drafter, result = train_new_drafter(
                cfg,
                self.target,
                with_draft_vocab(
                    dataclasses.replace(getattr(presets, preset)(), **dict(changes)), p.draft_vocab
                ),
                samples,
                folder,
                feature_cache=features,
                stop=stop,
                online_eval=TrainingEval(
                    features,
                    self.target,
                    p.num_anchors,
                    online_tau_eval(self.target, ",".join(p.eval_sets)),
                    REAL_TAU_EVERY,
                ),
            )
            last = _last_record(run_dir / "metrics.jsonl")
            return {
                "method": method,
                "steps": result.step,
                "max_steps": max_steps,
                "epochs": round(result.step * p.batch_size / len(samples), 3),
                "stopped_early": result.step < max_steps,
                "expected_tau": last.get("expected_tau"),
                "val_expected_tau": stop.values[-1] if stop.values else None,
                "tokens_per_s": last.get("tokens_per_s"),
                "trainable_parameters": sum(x.numel() for x in drafter.parameters() if x.requires_grad),
                "drafter": str(folder.relative_to(self.out)),
                "drafter_id": _sha(folder / "model.safetensors"),
            }

        return self.stages.run(f"train-{name}", key, run, outputs=(run_dir, folder))

    # -- 4. evaluation -----------------------------------------------------------------------

    EVAL_FIELDS = ("eval_sets", "eval_prompts", "eval_max_tokens", "temperature", "seed")  # in eval keys

    def decode_eval(self, drafters: dict[str, Any], *, baseline: bool = True):
        """``drafters`` on the plan's evaluation sets (same prompts and seeds for each): an EvalResult."""

        p = self.plan
        benches = [load_benchmark(name, limit=p.eval_prompts) for name in p.eval_sets]
        config = EvalConfig(
            temperature=p.temperature, max_tokens=p.eval_max_tokens, seed=p.seed,
            progress=self.progress, baseline=baseline,
        )  # fmt: skip
        return run_eval(self.target, drafters, benches, config)

    def evaluate(self, trained: dict[str, dict[str, Any]]) -> dict[str, Any]:
        p = self.plan
        key = {m: d["drafter_id"] for m, d in trained.items()} | p.part(*self.EVAL_FIELDS)

        def run() -> dict[str, Any]:

            drafters = {m: load_drafter(self.out / d["drafter"], self.target) for m, d in trained.items()}
            drafters["ngram"] = build_drafter("ngram", self.target)
            result = self.decode_eval(drafters)
            write_eval_report(result, self.out / "eval", {"target": p.target, "campaign": str(self.out)})
            rows = [
                {"drafter": r.drafter, "benchmark": r.benchmark, "tau": r.tau, "speedup": r.speedup}
                for r in result.rows
            ]
            return {"rows": rows, "report": "eval/report.md"}

        return self.stages.run("eval", key, run)


def _last_record(path: Path) -> dict[str, Any]:
    lines = path.read_text().splitlines() if path.is_file() else []
    return json.loads(lines[-1]) if lines else {}


def run_campaign(
    plan: CampaignPlan,
    out: Path,
    *,
    methods: tuple[str, ...] = METHODS,
    sweeps: tuple[str, ...] = (),
    progress: bool = True,
    announce: Callable[[str], None] = print,
    force: bool = False,
) -> dict[str, Any]:
    """Run (or resume) every stage; returns the summaries and writes ``out/summary.json``.

    ``force`` takes over the layout's names in ``out`` that no campaign claimed."""
    started = time.perf_counter()
    claim_run_folder(out, OUTPUTS, command="campaign", force=force)
    campaign = Campaign(plan, out, progress=progress, announce=announce)
    data = campaign.regenerate()
    cache = campaign.cache(data)
    presets = dict(zip(METHODS, plan.presets))
    trained = {m: campaign.train(m, presets[m], cache) for m in methods}
    evaluated = campaign.evaluate(trained)
    swept = {kind: run_sweep(campaign, kind, cache, trained) for kind in sweeps}
    summary = {"plan": plan.part(*plan.__dataclass_fields__), "data": data, "cache": cache}
    summary |= {"trained": trained, "eval": evaluated, "seconds": round(time.perf_counter() - started, 1)}
    if swept:
        summary["sweeps"] = swept
    tokens_per_step = plan.batch_size * cache["tokens"] / max(cache["samples"], 1)
    plot = plot_learning_curves(out, tokens_per_step, out / "learning_curves.png")
    summary["learning_curves"] = str(plot.relative_to(out)) if plot else None
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
