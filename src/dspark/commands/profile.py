"""``dspark profile``: measure SPS(B) of a target on this machine and save it (DESIGN §9).

The engine loads the saved table at start (same target, dtype, device, threads and
engine shape) instead of profiling again. The measuring is :func:`dspark.engine.profile.profile_sps`
(in ``engine`` rather than ``scheduler`` because it runs the target).
"""

from __future__ import annotations

import argparse
import json

from dspark.commands.loading import load_inference_target
from dspark.engine.config import DEFAULT_MAX_SEQ_LEN
from dspark.engine.profile import default_profile_path, profile_sps
from dspark.output_folders import claim_outputs
from dspark.targets.flat import KVStore


def main_profile(args: argparse.Namespace) -> int:
    """Run ``dspark profile`` (arguments: :mod:`~dspark.commands.args.profile`)."""

    def claim(write: bool) -> None:  # a file the user names; the default cache path is dspark's own
        if args.out is not None:
            claim_outputs(args.out.parent, [args.out.name], command="profile", force=args.force, write=write)

    claim(write=False)
    target = load_inference_target(args.target, args.dtype)
    capacity = min(args.max_seq_len or DEFAULT_MAX_SEQ_LEN, target.max_context)
    store = KVStore.for_target(target, num_slots=args.max_batch, capacity=capacity)
    table = profile_sps(target, store, block_size=args.block_size, repeats=args.repeats)
    path = args.out or default_profile_path(table.meta)
    claim(write=True)
    table.save(path)
    rows = [
        {"B": b, "steps_per_s": round(s, 2), "tokens_per_s": round(b * s, 1)}
        for b, s in zip(table.tokens, table.steps_per_s)
    ]
    print(json.dumps({"path": str(path), "meta": table.meta, "table": rows}, indent=1))
    return 0
