"""The sections of the prepared device run, in priority order (imported by run.py); each runs in its own
process under a time limit (``scripts/device/run.py``) and returns a JSON-able dict.

``Scale`` is :data:`GPU` on the device and :data:`DRY` for the CPU dry run that CI exercises:
the same code paths with the tiny target in SmolLM2's place and miniature budgets. What a
section makes for the way back goes under ``<stash>/return/``: ``artifacts/<section>/``
(reports, plots, records, the regenerated answers) and the drafters' tar shards.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "scripts"))

import payload  # noqa: E402

GGUF = "smollm2.gguf"  # the name of the joined pinned GGUF in the stash
CAMPAIGN_METHODS = ("dflash", "eagle3", "dspark")  # DSpark last: the GPU-vs-CPU control


@dataclass(frozen=True, kw_only=True)
class Scale:
    """How big each section's work is: the GPU run or the CPU dry run."""

    target: str  # the real target of section 2 (smollm2), or tiny in the dry run
    plan_changes: dict = field(default_factory=dict)  # CampaignPlan fields replaced for this machine
    speed_batches: tuple[int, ...] = (1, 8, 32)
    speed_max_tokens: int = 128
    speed_prompts: int = 32  # per shared set
    sweep_args: tuple[str, ...] = ("--methods", "dflash,dspark", "--sweeps", "depth,block-size")
    shard_bytes: int = 15 * payload.MIB  # a returned file is at most 16 MiB
    pack_reserve_s: float = 45.0  # of section 2's limit, kept for packing after the campaign


SHARED_SETS = ("gsm8k", "humaneval", "mt-bench")  # the shared sets of Table 1 and Fig. 2
GPU = Scale(
    target="smollm2",
    # The full equal budget of the CPU campaign (10 epochs, plateau stop); on the GPU the
    # 3,000 answers are regenerated 256 at a time, and Table 1 / Fig. 2 use the shared sets.
    plan_changes={"regen_batch": 256, "eval_sets": SHARED_SETS},
)
DRY = Scale(
    target="tiny",
    plan_changes={
        "prompts": 8,
        "epochs": 0.02,
        "plateau_min_epochs": 0.0,
        "eval_sets": ("gsm8k",),
        "eval_prompts": 1,
        "eval_max_tokens": 4,
        "regen_max_tokens": 16,
    },
    speed_batches=(1, 2),
    speed_max_tokens=4,
    speed_prompts=2,
    sweep_args=("--sweeps", "depth", "--prompts", "8", "--epochs", "0.02", "--eval-prompts", "2")
    + ("--eval-max-tokens", "8"),
    shard_bytes=payload.MIB,  # more shards than one call brings back: the return call is exercised
    pack_reserve_s=20.0,
)


@dataclass(frozen=True, kw_only=True)
class Context:
    scale: Scale
    dry_run: bool
    stash: Path  # persists across the calls of one warm machine
    limit_s: float  # this section's time limit

    @property
    def returned(self) -> Path:
        return self.stash / "return"

    def artifacts(self, section: str) -> Path:
        path = self.returned / "artifacts" / section
        path.mkdir(parents=True, exist_ok=True)
        return path

    def work(self, name: str) -> Path:
        return self.stash / "work" / name


def _dspark(args: list[str], *, timeout: float) -> dict:
    """``python -m dspark ARGS`` with a timeout; the tail of its stderr."""
    cmd = [sys.executable, "-m", "dspark", *args]
    try:
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(timeout, 5))
        return {"rc": run.returncode, "tail": run.stderr[-2000:]}
    except subprocess.TimeoutExpired as e:
        tail = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        return {"rc": "timeout", "tail": tail[-2000:]}


# -- 0. env, 1. CUDA tests ----------------------------------------------------------------------


def env(ctx: Context) -> dict:
    import gpu_sections

    return gpu_sections.env(gpu_sections.DRY if ctx.dry_run else gpu_sections.FULL)


def cuda_tests(ctx: Context) -> dict:
    """Losslessness in bf16 and fp32 and the engine on CUDA: the ``gpu``-marked tests."""
    import gpu_sections

    return gpu_sections.gpu_tests(gpu_sections.FULL)


# -- 2. the SmolLM2 campaign --------------------------------------------------------------------


def campaign_target(ctx: Context) -> dict:
    """Convert the joined, checked GGUF into the stash's cache (the GPU run), once."""
    if ctx.dry_run:
        return {"target": "tiny", "gguf": "joined and checked; conversion skipped in the dry run"}
    from dspark.targets.smollm2 import ensure_smollm2

    started = time.perf_counter()
    folder = ensure_smollm2(gguf=ctx.stash / GGUF)
    return {"target": str(folder), "convert_s": round(time.perf_counter() - started, 1)}


def _restore_state(ctx: Context, work: Path) -> list[str]:
    """An earlier session's regenerated answers, carried back (so regeneration is not repeated)."""
    state = ctx.stash / "state" / "smollm2_campaign"
    restored = []
    for rel in ("data/answers.jsonl", "stages/regenerate.json"):
        src = state / rel
        if src.is_file() and not (work / rel).is_file():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / rel)
            restored.append(rel)
    return restored


def smollm2_campaign(ctx: Context) -> dict:
    """Regenerate, train DFlash, Eagle3 and DSpark at the equal budget, evaluate (Table 1,
    Fig. 2 on the shared sets); whatever finished inside the limit is packed for the way back."""
    result = campaign_target(ctx)
    work = ctx.work("smollm2")
    work.mkdir(parents=True, exist_ok=True)
    result["restored"] = _restore_state(ctx, work)
    changes = json.dumps(ctx.scale.plan_changes)
    driver = [sys.executable, str(HERE / "sections.py"), "campaign", ctx.scale.target, str(work), changes]
    budget = ctx.limit_s - ctx.scale.pack_reserve_s
    try:
        run = subprocess.run(driver, cwd=ROOT, capture_output=True, text=True, timeout=max(budget, 5))
        result |= {"rc": run.returncode, "tail": run.stderr[-2000:]}
    except subprocess.TimeoutExpired:
        result["rc"] = "timeout"  # finished stages stay; a later session resumes the rest
    result["stages"] = sorted(p.stem for p in (work / "stages").glob("*.json") if "." not in p.stem)
    result["done"] = result["rc"] == 0  # else "partial": a later call or session goes on
    result |= pack_campaign(ctx, work)
    return result


def run_campaign_driver(target: str, out: str, changes: str) -> None:
    """The campaign itself (a child process of :func:`smollm2_campaign`, killed at its limit)."""
    from dspark.pipeline.campaign.pipeline import run_campaign
    from dspark.pipeline.campaign.plan import PLANS

    plan = dataclasses.replace(PLANS[target], **json.loads(changes))
    announce = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    run_campaign(plan, Path(out), methods=CAMPAIGN_METHODS, progress=False, announce=announce)


def pack_campaign(ctx: Context, work: Path) -> dict:
    """The finished drafters in shipped form (bf16, records with sha256) as a sharded tar, and
    the campaign's reports, stage records and answers as artifacts."""
    import ship_drafters

    art = ctx.artifacts("smollm2_campaign")
    staged = ctx.stash / "ship"
    shutil.rmtree(staged, ignore_errors=True)
    done = [m for m in CAMPAIGN_METHODS if (work / "stages" / f"train-{m}.json").is_file()]
    out: dict = {"drafters": done, "target_name": ctx.scale.target}
    if done:
        args = ["--campaign", str(work), "--target", ctx.scale.target, "--methods", ",".join(done)]
        ship_drafters.main([*args, "--dest", str(staged), "--records", str(staged / "SHIPPED.json")])
        shutil.copy2(staged / "SHIPPED.json", art / "SHIPPED.json")
        tar = payload.tar_folders(
            {m: staged / ctx.scale.target / m for m in done}, ctx.stash / "drafters.tar"
        )
        shards = ctx.returned / "shards"
        shutil.rmtree(shards, ignore_errors=True)
        out["shards"] = payload.shard(tar, shards, shard_bytes=ctx.scale.shard_bytes).as_json()
        tar.unlink()
        out["control"] = _control(staged / "SHIPPED.json", ctx.scale.target)
    for rel in ("summary.json", "learning_curves.png", "eval", "stages", "data/answers.jsonl"):
        src = work / rel
        if src.is_dir():
            shutil.copytree(
                src, art / rel, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.lock", "*.claims")
            )
        elif src.is_file():
            (art / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, art / rel)
    for metrics in (work / "train").glob("*/metrics.jsonl"):
        shutil.copy2(metrics, art / f"metrics-{metrics.parent.name}.jsonl")
    return out


def _control(records: Path, target: str) -> dict:
    """GPU DSpark against the CPU-trained one the package records: the two trainings agree
    when their validation expected τ (same samples, same budget) are close."""
    from dspark.formats.shipped_record import read_records

    gpu = json.loads(records.read_text()).get("dspark")
    cpu = read_records(ROOT / "src" / "dspark" / "assets" / "drafters" / target).get("dspark")
    if gpu is None or cpu is None:
        return {}
    return {"gpu_val_expected_tau": gpu["val_expected_tau"], "cpu_val_expected_tau": cpu.val_expected_tau}


# -- 3. speed with those drafters ---------------------------------------------------------------


def speed(ctx: Context) -> dict:
    """Tokens/s of the engine at batch 1 and batched, each trained drafter against plain decoding."""
    from dspark.bench.step_costs import engine_overhead
    from dspark.data.chat import prompt_ids
    from dspark.data.prompts import load_prompts
    from dspark.formats.folder import load_drafter
    from dspark.presets.tiny import resolve_target
    from dspark.targets import TargetAdapter

    folders = {m: ctx.work("smollm2") / "drafters" / m for m in CAMPAIGN_METHODS}
    folders = {m: f for m, f in folders.items() if (f / "config.json").is_file()}
    if not folders:
        raise RuntimeError("no trained drafter: section smollm2_campaign has not trained one yet")
    target = TargetAdapter.from_pretrained(resolve_target(ctx.scale.target))
    sets = SHARED_SETS[:1] if ctx.dry_run else SHARED_SETS
    prompts = [
        prompt_ids(target.tokenizer, p) for s in sets for p in load_prompts(s, ctx.scale.speed_prompts)
    ]
    while len(prompts) < max(ctx.scale.speed_batches) + 2:
        prompts = prompts + prompts
    rows = []
    for name, folder in {"none": None, **folders}.items():
        drafter = load_drafter(folder, target) if folder else None
        for batch in ctx.scale.speed_batches:
            report = engine_overhead(
                target,
                drafter,
                prompts,
                batch=batch,
                policy="fixed" if drafter is None else "prefix",
                max_tokens=ctx.scale.speed_max_tokens,
                temperature=1.0,
            )
            rows.append({"drafter": name, **report.as_dict()})
    plain = {r["batch"]: r["tokens_per_s"] for r in rows if r["drafter"] == "none"}
    for r in rows:
        r["speedup"] = round(r["tokens_per_s"] / plain[r["batch"]], 3) if plain.get(r["batch"]) else None
    return {"target": ctx.scale.target, "device": str(target.device), "temperature": 1.0, "rows": rows}


# -- 4. the tiny target's sweeps, 5. training throughput at Qwen3 shapes --------------------------


def tiny_sweeps(ctx: Context) -> dict:
    """Figs. 3 (depth) and 4 (block size) on the tiny target at the campaign's budget."""
    work = ctx.work("tiny")
    args = ["campaign", "--target", "tiny", "--out", str(work), *ctx.scale.sweep_args, "--no-progress"]
    result = _dspark(args, timeout=ctx.limit_s - 15)
    art = ctx.artifacts("tiny_sweeps")
    for rel in ("sweeps", "eval", "summary.json"):
        src = work / rel
        if src.is_dir():
            shutil.copytree(src, art / rel, dirs_exist_ok=True)
        elif src.is_file():
            shutil.copy2(src, art / rel)
    result["reports"] = sorted(str(p.relative_to(work)) for p in (work / "sweeps").glob("*/report.md"))
    result["done"] = result["rc"] == 0
    return result


def train_shapes(ctx: Context) -> dict:
    """Training tokens/s and peak memory at the Qwen3-8B and -4B drafter shapes."""
    import gpu_sections as g

    scale = g.DRY if ctx.dry_run else g.FULL
    return {"qwen3_8b": g.train_qwen3_8b(scale), "qwen3_4b": g.train_qwen3_4b(scale)}


SECTIONS = {
    "env": env,
    "cuda_tests": cuda_tests,
    "smollm2_campaign": smollm2_campaign,
    "speed": speed,
    "tiny_sweeps": tiny_sweeps,
    "train_shapes": train_shapes,
}


if __name__ == "__main__" and sys.argv[1:2] == ["campaign"]:
    sys.path.insert(0, str(ROOT / "src"))
    run_campaign_driver(*sys.argv[2:5])
