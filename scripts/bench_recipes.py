"""Issue 16's training recipes beside the paper's, at an equal budget, on the tiny campaign's data.

Every recipe trains the campaign's DSpark preset (``dspark_tiny``) with the campaign's
plan (``campaign/plan.py``: global batch 8, micro-batch 4, 64 anchors, lr 1e-3, seed 0)
from the campaign's feature cache, for the same ``--steps`` optimizer steps (each run
its own warmup + cosine over those steps):

- ``paper``: from scratch, the paper's objective (0.1 CE + 0.9 TV + confidence, Eq. 12);
- ``warm-start``: the backbone from the campaign's converged DFlash (``--dflash``); the
  Markov and confidence heads start fresh. It carries DFlash's own budget on top of
  these steps (the campaign's DFlash trained 7,800 steps, 8.4 epochs);
- ``ce-first``: cross-entropy (+ confidence) for the first ``--ce-frac`` of the steps,
  then the paper's objective;
- ``head-lr``: the Markov head's learning rate × ``--head-lr-mult``.

Measured: the campaign's validation measure — expected τ on its 64 fixed cached samples
(``campaign.pipeline.TrainingEval``) — at ``--evals`` evenly spaced steps (and at step 0
for the warm start), and at the end real τ (temperature 1, seeded) on ``--real-prompts``
built-in prompts never trained on. The campaign's own DSpark curve at the same steps is
printed beside it (its schedule spans 9,310 steps, so at step N its learning rate is
still near the peak, unlike these runs' at their end).

The feature cache and the DFlash folder are only read. One torch thread.

    python scripts/bench_recipes.py --steps 400 --evals 4 --out /tmp/recipes
    python scripts/bench_recipes.py --steps 400 --evals 4 --recipes paper --seed 1 --out /tmp/recipes-seed1

(the second: the paper's recipe again with another seed, for the noise between runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

CAMPAIGN = Path.home() / ".cache/dspark/campaigns/tiny"
TAU = "eval/val_expected_tau"


def recipes(args: argparse.Namespace) -> dict[str, dict]:
    return {
        "paper": {},
        "warm-start": {"warm_start": str(args.dflash)},
        "ce-first": {"ce_warmup_frac": args.ce_frac},
        "head-lr": {"head_lr_mult": args.head_lr_mult},
    }


def curve(metrics: Path) -> dict[int, float]:
    """``{step: expected τ on the validation samples}`` of a run's metrics.jsonl."""
    out = {}
    for line in metrics.read_text().splitlines() if metrics.is_file() else []:
        record = json.loads(line)
        if isinstance(record.get(TAU), int | float):
            out[int(record["step"])] = float(record[TAU])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=500, help="optimizer steps per recipe (the equal budget)")
    ap.add_argument("--evals", type=int, default=4, help="validation points per run, evenly spaced")
    ap.add_argument("--recipes", default="paper,warm-start,ce-first,head-lr", help="comma-separated")
    ap.add_argument("--ce-frac", type=float, default=0.3, help="ce-first: fraction of steps on CE")
    ap.add_argument("--head-lr-mult", type=float, default=10.0, help="head-lr: the Markov head's lr multiple")
    ap.add_argument("--campaign", type=Path, default=CAMPAIGN, help="the tiny campaign's folder (read only)")
    ap.add_argument("--dflash", type=Path, default=None, help="DFlash folder (default: the campaign's)")
    ap.add_argument("--real-prompts", type=int, default=24, help="prompts for real τ at the end (0: off)")
    ap.add_argument(
        "--seed", type=int, default=None, help="init and data-order seed (default: the plan's, 0)"
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_recipes"), help="run folders (resumed)")
    args = ap.parse_args()
    args.dflash = args.dflash or args.campaign / "drafters" / "dflash"
    torch.set_num_threads(1)

    from dspark.campaign.pipeline import VALIDATION_SAMPLES, TrainingEval
    from dspark.campaign.plan import METHODS, PLANS
    from dspark.data.cache import FeatureCache
    from dspark.data.samples import TrainDataset
    from dspark.drafters.draft_vocab import with_draft_vocab
    from dspark.drafters.kinds import kind_of_config
    from dspark.eval.online import online_tau_eval
    from dspark.presets import drafters as presets
    from dspark.presets.tiny import resolve_target
    from dspark.targets import TargetAdapter
    from dspark.training.fresh import train_new_drafter
    from dspark.training.recipe import train_config
    from dspark.training.warm_start import warm_start_backbone

    plan = PLANS["tiny"] if args.seed is None else dataclasses.replace(PLANS["tiny"], seed=args.seed)
    target = TargetAdapter.from_pretrained(resolve_target(plan.target))
    features = FeatureCache.open(args.campaign / "cache", verify=False)  # sizes checked, 2.8 GB not hashed
    features.check_compatible(target, template_kwargs={}, max_length=plan.max_length)
    samples = TrainDataset(features.token_samples())
    preset = dict(zip(METHODS, plan.presets))["dspark"]  # dspark_tiny
    config = with_draft_vocab(getattr(presets, preset)(), plan.draft_vocab)
    every = max(1, args.steps // args.evals)
    validation = TrainingEval(features, target, plan.num_anchors, real_tau=None, every=10**9)
    real_tau = None
    if args.real_prompts:
        real_tau = online_tau_eval(target, ",".join(plan.eval_sets), count=args.real_prompts)

    rows = {}
    for name in args.recipes.split(","):
        run = recipes(args)[name]
        out = args.out / name
        val0 = None
        if "warm_start" in run:  # step 0: DFlash's backbone, fresh heads (the same seed as the run's)
            torch.manual_seed(plan.seed)
            drafter = kind_of_config(config).drafter_cls.from_target(target, config)
            warm_start_backbone(drafter, run["warm_start"], target)
            with torch.no_grad():
                val0 = validation(drafter.eval(), 0)["val_expected_tau"]
        cfg = train_config(
            out, plan, max_steps=args.steps, save_every=every, keep_last=1, log_every=every, eval_every=every,
            progress=False, **run,
        )  # fmt: skip
        cpu, wall = time.process_time(), time.perf_counter()
        drafter, result = train_new_drafter(
            cfg, target, config, samples, out / "drafter", feature_cache=features, online_eval=validation
        )
        seconds = (time.process_time() - cpu, time.perf_counter() - wall)
        with torch.no_grad():
            tau = real_tau(drafter.eval(), result.step)["tau"] if real_tau else None
        rows[name] = {"val": curve(out / "metrics.jsonl") | ({0: val0} if val0 else {}), "tau": tau}
        rows[name]["cpu_s"], rows[name]["wall_s"] = seconds
        print(json.dumps({"recipe": name, **rows[name]}), flush=True)

    campaign = curve(args.campaign / "train" / "dspark" / "metrics.jsonl")
    steps = sorted({s for r in rows.values() for s in r["val"]})
    head = ["recipe", *(f"step {s}" for s in steps), "real τ", "CPU s / step"]
    print(f"\nexpected τ on the campaign's {VALIDATION_SAMPLES} validation samples, {args.steps} steps each")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name, r in rows.items():
        vals = [f"{r['val'][s]:.3f}" if s in r["val"] else "" for s in steps]
        tau = f"{r['tau']:.3f}" if r["tau"] is not None else ""
        print(f"| {name} | " + " | ".join(vals) + f" | {tau} | {r['cpu_s'] / args.steps:.2f} |")
    vals = [f"{campaign[s]:.3f}" if s in campaign else "" for s in steps]
    print("| campaign DSpark (9,310-step schedule) | " + " | ".join(vals) + " | | |")
    dflash = curve(args.campaign / "train" / "dflash" / "metrics.jsonl")
    if dflash:
        last = max(dflash)
        print(f"\ncampaign DFlash (the warm start's source): {dflash[last]:.3f} at step {last}")


if __name__ == "__main__":
    main()
