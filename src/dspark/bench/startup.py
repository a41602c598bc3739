"""Start-up time of ``dspark --help`` and of an argument error, against two baselines.

Each measurement is a fresh interpreter (``python -m dspark ...``); the baselines run
interleaved with it, so a busy machine slows all of them alike:

- ``python -c pass``: the interpreter alone (the floor);
- ``python -c "import torch, transformers"``: what every command paid before the heavy
  imports became lazy.

Pointing ``src`` at another tree's sources times that tree (a before/after).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

FLOOR, HEAVY = "python -c pass", "import torch, transformers"


@dataclass(frozen=True)
class StartupTimes:
    """Median seconds per command over ``repeats`` interleaved runs."""

    median_s: dict[str, float]
    repeats: int
    load_average: float  # 1-minute load average at the end

    def rows(self) -> list[tuple[str, float, float, float]]:
        """(command, median s, ratio to the heavy imports, seconds over the interpreter)."""
        floor, heavy = self.median_s[FLOOR], self.median_s[HEAVY]
        return [(name, t, t / heavy, t - floor) for name, t in self.median_s.items()]


def commands(python: str = sys.executable) -> dict[str, list[str]]:
    """The command lines timed, baselines first."""
    return {
        FLOOR: [python, "-c", "pass"],
        HEAVY: [python, "-c", "import torch, transformers"],
        "dspark --help": [python, "-m", "dspark", "--help"],
        "dspark generate --help": [python, "-m", "dspark", "generate", "--help"],
        "dspark train --drafter bad (error)": [python, "-m", "dspark", "train", "--drafter", "bad"],
    }


def _seconds(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def time_startup(
    src: Path | None = None, repeats: int = 5, cmds: dict[str, list[str]] | None = None
) -> StartupTimes:
    """Time ``cmds`` (default :func:`commands`) ``repeats`` times each, interleaved; ``src``: the
    dspark sources to put first on ``PYTHONPATH`` (default: the installed ones)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    cmds = cmds or commands()
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(repeats):  # interleaved: the machine's load hits every command alike
        for name, cmd in cmds.items():
            times[name].append(_seconds(cmd, env))
    return StartupTimes({n: statistics.median(ts) for n, ts in times.items()}, repeats, os.getloadavg()[0])


def table(result: StartupTimes) -> str:
    """The timings as aligned text."""
    lines = [f"{'command':<38}{'median s':>10}{'/ heavy imports':>17}{'- interpreter s':>17}"]
    lines += [f"{n:<38}{t:>10.3f}{r:>17.2f}{d:>17.3f}" for n, t, r, d in result.rows()]
    return "\n".join(lines)
