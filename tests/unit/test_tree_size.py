"""The working tree travels to a GPU machine (issue 36): one transfer carries 64 MiB at most,
the tree's tracked files must stay under 48 MiB so that a device run has room beside them
(the pinned SmolLM2 GGUF in two halves, wheels, drafters carried back). Drafters too big for
git live in the user's store (DESIGN §16); generated results keep only what a reader needs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 48 * 2**20


def tracked_sizes(root: Path) -> dict[str, int]:
    """Bytes of each tracked file present in ``root``'s working tree (what a device call sends)."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    names = [n for n in out.decode().split("\0") if n]
    return {n: (root / n).stat().st_size for n in names if (root / n).is_file()}


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_tracked_files_stay_under_48_mib():
    sizes = tracked_sizes(ROOT)
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total <= LIMIT, (
        f"tracked files are {total / 2**20:.1f} MiB, over {LIMIT / 2**20:.0f} MiB; largest: "
        + ", ".join(f"{n} {s / 2**20:.1f} MiB" for n, s in largest)
        + ". Keep big drafters in the store (scripts/ship_drafters.py) and generated results out of git"
    )
