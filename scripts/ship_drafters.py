"""Ship a campaign's converged drafters: run by a maintainer once a campaign has converged.

    python scripts/ship_drafters.py --campaign ~/.cache/dspark/campaigns/tiny --target tiny
    python scripts/ship_drafters.py --campaign ~/.cache/dspark/campaigns/smollm2 --target smollm2

For each method whose training stage finished, the campaign's drafter is loaded against
the target (full validation) and written in bf16, without the target's embedding and head
where they equal the target's, to ``<dest>/<target>/<method>/``. ``--dest`` defaults to the
package (``src/dspark/assets/drafters``) for the tiny target, whose drafters fit git, and to
the user's store (``~/.cache/dspark/drafters``, DESIGN §16) for every other target: SmolLM2's
drafters (~25 MB each) never enter git. In the package a file over ``--max-mb`` is refused
(git history keeps every binary forever).

The records go to the package's ``SHIPPED.json`` beside the target's folders (beside the
drafters when ``--dest`` is given; or ``--records``): how each was trained (steps, epochs,
training tokens, expected τ on the campaign's fixed samples, the last real τ), its learning curve
(:mod:`dspark.formats.shipped_record`), its target's fingerprint and the sha256 of its
files. Records of methods not shipped this time are kept as they are. Commit the records
(and, for the tiny target, the weights) once, when final.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
PACKAGE = ROOT / "src" / "dspark" / "assets" / "drafters"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--campaign", type=Path, required=True, help="the campaign's folder")
    p.add_argument("--target", required=True, help="the shipped target's name: tiny, smollm2")
    p.add_argument("--methods", default="dflash,dspark,eagle3")
    p.add_argument("--max-mb", type=float, default=25.0, help="largest file allowed in the package (MB)")
    p.add_argument(
        "--dest",
        type=Path,
        default=None,
        help="drafters root (default: the package for tiny, else the store)",
    )
    p.add_argument("--records", type=Path, default=None, help="SHIPPED.json (default: the package's)")
    ns = p.parse_args(argv)
    if ns.records is None:  # the package's records, unless the drafters go to a folder named here
        ns.records = (ns.dest or PACKAGE) / ns.target / "SHIPPED.json"
    if ns.dest is None:
        from dspark.formats.shipped import store_root

        ns.dest = PACKAGE if ns.target == "tiny" else store_root()
    return ns


def record_for(campaign: Path, method: str, folder: Path):
    """The ``SHIPPED.json`` record of ``method``'s finished training stage in ``campaign``,
    shipped as ``folder``."""
    from dspark.formats.shipped_record import ShippedRecord, curve_from_log, file_digests, target_record
    from dspark.pipeline.campaign.progress import read_curve

    summary = json.loads((campaign / "stages" / f"train-{method}.json").read_text())["summary"]
    cache = json.loads((campaign / "stages" / "cache.json").read_text())["summary"]
    tokens = round(summary["epochs"] * cache["tokens"])  # an epoch is every cached sample once
    logged = read_curve(campaign / "train" / method / "metrics.jsonl")
    curve = curve_from_log(
        logged.val_steps,
        logged.val_expected_tau,
        logged.eval_steps,
        logged.eval_tau,
        tokens_per_step=tokens / summary["steps"],
    )
    return ShippedRecord(
        steps=summary["steps"],
        epochs=summary["epochs"],
        training_tokens=tokens,
        val_expected_tau=summary["val_expected_tau"],
        real_tau_last=logged.eval_tau[-1] if logged.eval_tau else None,
        stopped_early=summary["stopped_early"],
        size_mb=round(sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) / 1e6, 2),
        curve=curve,
        target=target_record(folder),
        files=file_digests(folder),
    )


def main(argv: list[str] | None = None) -> int:
    import torch

    from dspark.durable import write_atomic
    from dspark.formats.folder import load_drafter, save_drafter
    from dspark.presets.tiny import resolve_target
    from dspark.targets import TargetAdapter

    args = parse_args(argv)
    target = TargetAdapter.from_pretrained(resolve_target(args.target))
    dest = args.dest / args.target
    record_path = args.records
    in_package = args.dest.resolve() == PACKAGE.resolve()
    shipped = json.loads(record_path.read_text()) if record_path.is_file() else {}
    for method in args.methods.split(","):
        stage = args.campaign / "stages" / f"train-{method}.json"
        if not stage.is_file():
            print(f"{method}: training not finished in {args.campaign}, skipped", file=sys.stderr)
            continue
        summary = json.loads(stage.read_text())["summary"]
        drafter = load_drafter(args.campaign / summary["drafter"], target)
        folder = save_drafter(dest / method, drafter, target, dtype=torch.bfloat16)
        sizes = {f.name: f.stat().st_size / 1e6 for f in folder.iterdir() if f.is_file()}
        too_big = {k: round(v, 1) for k, v in sizes.items() if v > args.max_mb}
        if too_big and in_package:
            raise SystemExit(f"{method}: files over {args.max_mb} MB: {too_big}; remove {folder}")
        record = record_for(args.campaign, method, folder)
        shipped[method] = record.as_json()
        points = len(record.curve.steps) if record.curve else 0
        print(
            f"{method}: shipped to {folder} ({record.steps} steps, {record.epochs} epochs, "
            f"curve of {points} points)"
        )
    write_atomic(record_path, json.dumps(shipped, indent=1, sort_keys=True) + "\n", mkdir=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
