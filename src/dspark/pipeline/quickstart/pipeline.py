"""The quickstart stages, in order, each resumable (see :mod:`dspark.pipeline.stages`).

Layout of a run folder::

    data/answers.jsonl          the target's own answers to its training prompts
    data/validation.jsonl       its answers to held-out built-in prompts (expected τ of every drafter)
    train/<method>/             trainer output (checkpoints, metrics.jsonl)
    drafters/<method>/          the trained drafters (HF folders, DESIGN §5.4)
    drafters/dspark-sts/        DSpark with its fitted STS temperatures
    calibration/                calibration.json / .md, reliability.png
    eval/                       results.json, report.md, plots (shipped_curves.png: beside the shipped)
    serve/                      results.json, throughput_vs_per_user.png
    stages/<stage>.json         resume markers
    report.md                   the summary of everything above
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dspark import conditions as run_conditions
from dspark.bench.serve_load import bench_serve, plot_load
from dspark.data.records import read_jsonl
from dspark.data.samples import tokenize_records
from dspark.eval.benchmarks import load_benchmark
from dspark.eval.report import write_eval_report
from dspark.eval.runner import EvalConfig, run_eval
from dspark.formats.build import build_drafter
from dspark.formats.folder import file_sha256, load_drafter
from dspark.pipeline.calibrate import calibrate_drafter
from dspark.pipeline.presets import DOMAINS, METHODS, QuickstartPlan
from dspark.pipeline.quickstart.answers import answer, errors_file, mean_tokens, summary_of, training_prompts
from dspark.pipeline.quickstart.references import REFERENCES, shipped_references
from dspark.pipeline.quickstart.report import write_report
from dspark.pipeline.quickstart.validation import read_samples, score_folders
from dspark.pipeline.stages import Stages, claim_run_folder
from dspark.presets import drafters as presets
from dspark.presets.tiny import tiny_target_dir
from dspark.targets import TargetAdapter
from dspark.targets.dtype import inference_dtype
from dspark.training.fresh import train_new_drafter
from dspark.training.recipe import train_config

# The layout's top-level names (module docstring): what the run folder claims.
OUTPUTS = ("data", "train", "drafters", "calibration", "eval", "serve", "stages", "report.md", "summary.json")
CALIBRATED = "dspark-sts"
ROW_FIELDS = ("drafter", "benchmark", "domain", "tau", "tokens_per_s", "speedup", "num_rounds", "tokens")
ROW_FIELDS += ("conditional_acceptance",)  # what the eval stage keeps of each result row
__all__ = ["REFERENCES", "Quickstart", "run_quickstart", "training_prompts"]


def _sha256(path: Path) -> str:
    return file_sha256(path)[:16]


def _folder_id(folder: Path) -> str:
    """Identity of a drafter folder: its weights and config."""
    return _sha256(folder / "model.safetensors") + _sha256(folder / "config.json")


def last_metrics(run_dir: Path) -> dict[str, float]:
    """The last record of a training run's ``metrics.jsonl`` (also right when the run was resumed)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    record = json.loads(lines[-1]) if lines else {}
    return {k: v for k, v in record.items() if isinstance(v, int | float)}


class Quickstart:
    """One run: the plan, the run folder, the loaded target, and the stages."""

    def __init__(
        self,
        plan: QuickstartPlan,
        out: Path,
        *,
        progress: bool,
        announce: Callable[[str], None],
        dtype: str = "auto",
        shipped_root: Path | None = None,
    ):

        self.plan = plan
        self.out = out
        self.progress = progress
        self.stages = Stages(out, announce=announce)
        # Data and training keep the trainer's dtype (fp32 on the CPU); evaluation and
        # serving decode in the inference dtype (bf16 where native, targets/dtype.py).
        self.target = TargetAdapter.from_pretrained(str(tiny_target_dir()))
        decode_dtype = inference_dtype(dtype, self.target.device, hidden_size=self.target.hidden_size)
        self.decode_target = (
            self.target
            if decode_dtype == self.target.dtype
            else TargetAdapter.from_pretrained(str(tiny_target_dir()), dtype=decode_dtype)
        )
        self.target_id = _sha256(tiny_target_dir() / "model.safetensors")
        self.shipped = shipped_references(self.target, shipped_root)  # compared in the eval stage

    # -- 1. data ------------------------------------------------------------------------------

    def regenerate(self) -> dict[str, Any]:
        p = self.plan
        key = {"target": self.target_id} | p.part(
            "train_prompts", "regen_max_tokens", "regen_temperature", "seed"
        )
        answers = self.out / "data" / "answers.jsonl"

        def run() -> dict[str, Any]:
            prompts = training_prompts(p.train_prompts, p.seed)
            summary = answer(
                self.target,
                prompts,
                answers,
                temperature=p.regen_temperature,
                max_tokens=p.regen_max_tokens,
                seed=p.seed,
                progress=self.progress,
            )
            return summary_of(summary, answers, self.out, _sha256(answers))

        return self.stages.run("regenerate", key, run, outputs=(answers, errors_file(answers)))

    def validation_data(self) -> dict[str, Any]:
        """The target's answers to the built-in prompts after the evaluation and calibration ones."""
        p = self.plan
        key = {"target": self.target_id} | p.part(
            "eval_prompts", "calib_prompts", "val_prompts", "regen_max_tokens", "regen_temperature", "seed"
        )
        answers = self.out / "data" / "validation.jsonl"

        def run() -> dict[str, Any]:
            benches = self._builtin(skip=p.eval_prompts + p.calib_prompts, count=p.val_prompts)
            prompts = [x for group in zip(*(b.prompts for b in benches)) for x in group]
            summary = answer(
                self.target,
                prompts,
                answers,
                temperature=p.regen_temperature,
                max_tokens=p.regen_max_tokens,
                seed=p.seed + 1,
                progress=self.progress,
            )
            return summary_of(summary, answers, self.out, _sha256(answers))

        return self.stages.run("validation", key, run, outputs=(answers, errors_file(answers)))

    # -- 2. training --------------------------------------------------------------------------

    def train(self, method: str, data: dict[str, Any]) -> dict[str, Any]:
        p = self.plan
        key = {"target": self.target_id, "data": data["data_id"], "method": method} | p.part(
            "train_steps",
            "batch_size",
            "micro_batch_size",
            "num_anchors",
            "max_length",
            "lr",
            "block_size",
            "seed",
        )
        run_dir = self.out / "train" / method
        folder = self.out / "drafters" / method

        def run() -> dict[str, Any]:
            import dataclasses

            config = dataclasses.replace(getattr(presets, f"{method}_tiny")(), block_size=p.block_size)
            samples = tokenize_records(
                read_jsonl(self.out / data["answers"]), self.target.tokenizer, max_length=p.max_length
            )
            cfg = train_config(
                run_dir,
                p,
                max_steps=p.train_steps,
                save_every=max(1, p.train_steps // 3),
                keep_last=1,
                log_every=max(1, p.train_steps // 10),
                progress=self.progress,
            )
            drafter, result = train_new_drafter(cfg, self.target, config, samples, folder)
            metrics = {
                k: round(v, 4) for k, v in last_metrics(run_dir).items() if not k.startswith("acceptance/")
            }
            return {
                "method": method,
                "steps": result.step,
                "samples": len(samples),
                "trainable_parameters": sum(p.numel() for p in drafter.parameters() if p.requires_grad),
                "train_seconds": round(result.seconds, 1),
                "metrics": metrics,
                "drafter": str(folder.relative_to(self.out)),
                "drafter_id": _folder_id(folder),
            }

        return self.stages.run(f"train-{method}", key, run, outputs=(run_dir, folder))

    # -- 3. calibration -----------------------------------------------------------------------

    def _builtin(self, skip: int, count: int):

        benches = []
        for domain in DOMAINS:
            bench = load_benchmark(domain, limit=skip + count)
            benches.append(type(bench)(bench.name, bench.domain, bench.prompts[skip:]))
        return benches

    def _eval_config(self, max_tokens: int, baseline: bool):

        p = self.plan
        return EvalConfig(
            temperature=p.temperature,
            max_tokens=max_tokens,
            seed=p.seed,
            baseline=baseline,
            progress=self.progress,
        )

    def calibrate(self, dspark: dict[str, Any]) -> dict[str, Any]:
        p = self.plan
        key = {"drafter": dspark["drafter_id"]} | p.part(
            "calib_prompts", "eval_prompts", "eval_max_tokens", "temperature", "seed"
        )
        saved = self.out / "drafters" / CALIBRATED

        def run() -> dict[str, Any]:

            benches = self._builtin(skip=p.eval_prompts, count=p.calib_prompts)
            summary = calibrate_drafter(
                self.target,
                self.out / dspark["drafter"],
                benches,
                self._eval_config(p.eval_max_tokens, baseline=False),
                self.out / "calibration",
                holdout_fraction=0.25,
                seed=p.seed,
                save_to=saved,
            )
            keep = (
                "temperatures",
                "fit_rounds",
                "report_rounds",
                "report_set",
                "mean_ece_before",
                "mean_ece_after",
                "fitted_temperatures",
                "kept",
                "improved",
            )
            per_position = [
                {"position": b["position"], "ece_before": b["ece"], "ece_after": a["ece"], "auc": b["auc"]}
                for b, a in zip(summary["before"], summary["after"])
            ]
            return {k: summary[k] for k in keep} | {
                "positions": per_position,
                "drafter": str(saved.relative_to(self.out)),
                "drafter_id": _folder_id(saved),
            }

        return self.stages.run("calibrate", key, run)

    # -- 4. evaluation ------------------------------------------------------------------------

    def evaluate(self, drafters: dict[str, dict[str, Any]], data: dict, validation: dict) -> dict[str, Any]:
        """Every drafter on the same prompts (τ, speed) and the same validation set (expected τ)."""
        p = self.plan
        key = {m: d["drafter_id"] for m, d in drafters.items()} | p.part(
            "eval_prompts", "eval_max_tokens", "temperature", "seed"
        )
        key |= {"references": list(REFERENCES), "dtype": str(self.decode_target.dtype)}
        key |= {
            "shipped": {r.row: [_folder_id(r.folder), r.record and r.record.as_json()] for r in self.shipped}
        }
        key |= {"validation": validation["data_id"], "data": data["data_id"]} | p.part(
            "num_anchors", "max_length"
        )

        def run() -> dict[str, Any]:

            target = self.decode_target
            folders = {m: self.out / d["drafter"] for m, d in drafters.items()}
            folders |= {r.row: r.folder for r in self.shipped}  # what the shipped budget reaches
            loaded = {m: load_drafter(f, target) for m, f in folders.items()}
            loaded[REFERENCES[0]] = build_drafter("ngram", target)  # what no training reaches
            benches = self._builtin(skip=0, count=p.eval_prompts)
            result = run_eval(target, loaded, benches, self._eval_config(p.eval_max_tokens, baseline=True))
            meta = {"target": "tiny", "drafters": {m: d["drafter"] for m, d in drafters.items()}}
            write_eval_report(result, self.out / "eval", meta)
            rows = [{f: getattr(r, f) for f in ROW_FIELDS} for r in result.rows]

            # expected τ on the validation set, in the training dtype, every drafter on the same blocks
            val = read_samples(self.out / validation["answers"], self.target, p.max_length)
            val_tau = score_folders(self.target, folders, val, num_anchors=p.num_anchors, seed=p.seed)
            train = read_samples(self.out / data["answers"], self.target, p.max_length)
            return {
                "rows": rows,
                "report": "eval/report.md",
                "validation": {
                    "samples": len(val),
                    "tokens": sum(len(s.input_ids) for s in val),
                    "expected_tau": val_tau,
                },
                # mean tokens of one training step here (batch × mean sample length): for the estimate
                "train_tokens_per_step": p.batch_size * mean_tokens(train),
                "shipped": {
                    r.row: {"method": r.method, "record": r.record and r.record.as_json()}
                    for r in self.shipped
                },
            }

        return self.stages.run("eval", key, run)

    # -- 5. serving ---------------------------------------------------------------------------

    def serve(self, dspark: dict[str, Any]) -> dict[str, Any]:
        p = self.plan
        key = (
            {"drafter": dspark["drafter_id"]}
            | p.part("serve_policies", "serve_concurrency", "serve_max_tokens", "block_size", "eval_prompts")
            | {"dtype": str(self.decode_target.dtype)}
        )

        def run() -> dict[str, Any]:

            drafter = load_drafter(self.out / dspark["drafter"], self.decode_target)
            sets = [[pr.turns[0] for pr in b.prompts] for b in self._builtin(skip=0, count=40)]
            prompts = [x for group in zip(*sets) for x in group]  # math, code, chat, math, ...
            points = bench_serve(
                self.decode_target,
                drafter,
                p.serve_policies,
                p.serve_concurrency,
                prompts,
                max_tokens=p.serve_max_tokens,
                requests_per_client=3,
                block_size=p.block_size,
                max_seq_len=512,
                sps_path=self.out / "serve" / "sps.json",
            )
            (self.out / "serve").mkdir(parents=True, exist_ok=True)
            plot_load(points, self.out / "serve" / "throughput_vs_per_user.png")
            return {"points": [pt.as_dict() for pt in points], "plot": "serve/throughput_vs_per_user.png"}

        return self.stages.run("serve", key, run)


def run_quickstart(
    plan: QuickstartPlan,
    out: Path,
    *,
    progress: bool = True,
    announce: Callable[[str], None] = print,
    dtype: str = "auto",
    shipped_root: Path | None = None,
    force: bool = False,
) -> Path:
    """Run (or resume) every stage and write ``out/report.md``; returns its path.

    ``dtype`` is what evaluation and serving decode in (``--dtype``); training keeps its own.
    ``shipped_root`` holds the shipped drafters to compare with (default: the package's).
    ``force`` takes over the layout's names in ``out`` that no quickstart claimed.
    """

    started = time.perf_counter()
    claim_run_folder(out, OUTPUTS, command="quickstart", force=force)
    qs = Quickstart(plan, out, progress=progress, announce=announce, dtype=dtype, shipped_root=shipped_root)
    conditions = run_conditions.for_target(qs.decode_target)
    data = qs.regenerate()
    trained = {m: qs.train(m, data) for m in METHODS}
    calibration = qs.calibrate(trained["dspark"])
    validation = qs.validation_data()
    evaluated = qs.evaluate(
        {"dflash": trained["dflash"], "dspark": calibration, "eagle3": trained["eagle3"]}, data, validation
    )
    serving = qs.serve(calibration)
    return write_report(
        out,
        plan,
        data=data,
        trained=trained,
        calibration=calibration,
        evaluated=evaluated,
        serving=serving,
        log=qs.stages.log,
        wall_seconds=time.perf_counter() - started,
        conditions=conditions.ended(),
    )
