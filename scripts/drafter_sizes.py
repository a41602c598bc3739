"""Drafter folder sizes per preset and draft vocabulary, with and without the target's tensors (issue 16).

    PYTHONPATH=src python scripts/drafter_sizes.py --target smollm2 \
        --presets dflash_smollm2,dspark_smollm2,eagle3_smollm2 --vocab 8192,16384,full

Sizes do not depend on training: each drafter is built at random init, written in bf16
the way ``dspark train`` publishes it (embedding / LM head left out, ``d2t`` for a reduced
vocabulary) and the old way (every tensor), and re-loaded by the strict loader.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from dspark.commands.loading import load_target
from dspark.drafters.draft_vocab import with_draft_vocab
from dspark.drafters.kinds import kind_of_config
from dspark.formats.folder import WEIGHTS_NAME, load_drafter, save_drafter
from dspark.presets import drafters as presets


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--presets", required=True, help="comma-separated preset functions")
    p.add_argument("--vocab", default="8192,16384,full", help="comma-separated N (full = the target's)")
    args = p.parse_args()
    torch.set_num_threads(1)
    target = load_target(args.target)
    rows = []
    for preset in args.presets.split(","):
        for spec in args.vocab.split(","):
            n = None if spec == "full" else int(spec)
            config = with_draft_vocab(getattr(presets, preset)(), n)
            torch.manual_seed(0)
            drafter = kind_of_config(config).drafter_cls.from_target(target, config)
            with tempfile.TemporaryDirectory() as tmp:
                lean = save_drafter(Path(tmp) / "lean", drafter, target, dtype=torch.bfloat16)
                full = save_drafter(
                    Path(tmp) / "full", drafter, target, dtype=torch.bfloat16, keep_shared=True
                )
                load_drafter(lean, target)
                row = {
                    "preset": preset,
                    "draft_vocab": n or target.vocab_size,
                    "mb": round((lean / WEIGHTS_NAME).stat().st_size / 1e6, 2),
                    "mib": round((lean / WEIGHTS_NAME).stat().st_size / 2**20, 2),
                    "mb_with_target_tensors": round((full / WEIGHTS_NAME).stat().st_size / 1e6, 2),
                }
            rows.append(row)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
