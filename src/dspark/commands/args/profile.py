"""``dspark profile``: its arguments and ``--help`` text; the run is :mod:`dspark.commands.profile`."""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.commands.options import add_block_size, add_dtype, add_force, add_target


def add_profile_args(p: argparse.ArgumentParser) -> None:
    """Profile SPS(B), target steps per second for a forward of B tokens, and save the table.

    The thread count (``dspark --threads N profile``) is part of the profile's key: run the
    engine with the same setting to have it load this table.
    """
    add_target(p)
    add_dtype(p)
    p.add_argument("--max-batch", type=int, default=32, help="engine KV slots (requests at once)")
    add_block_size(p)
    p.add_argument("--max-seq-len", type=int, default=None, help="tokens per KV slot (default: the engine's)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per batch size (the fastest counts)")
    p.add_argument("--out", type=Path, default=None, help="where to save (default: the engine's cache path)")
    add_force(p, "an --out file that no `dspark profile` wrote")
