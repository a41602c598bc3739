"""Start-up time of ``dspark --help`` and of an argument error, as ratios to baselines.

Each measurement is a fresh interpreter (``python -m dspark ...``); the baselines run
interleaved with it in the same process of this script, so a busy machine slows all of
them alike:

- ``python -c pass``: the interpreter alone (the floor);
- ``python -c "import torch, transformers"``: what every command paid before the
  heavy imports became lazy.

    python scripts/bench_startup.py                      # this checkout's sources
    python scripts/bench_startup.py --src /work/main/src # another tree, for a before/after

Prints the median seconds of each and the ratios; no figure is asserted anywhere.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _time(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=REPO / "src", help="the dspark sources to time")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command (the median counts)")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(args.src), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    py = sys.executable
    commands = {
        "python -c pass": [py, "-c", "pass"],
        "import torch, transformers": [py, "-c", "import torch, transformers"],
        "dspark --help": [py, "-m", "dspark", "--help"],
        "dspark generate --help": [py, "-m", "dspark", "generate", "--help"],
        "dspark train --drafter bad (error)": [py, "-m", "dspark", "train", "--drafter", "bad"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeats):  # interleaved: the machine's load hits every command alike
        for name, cmd in commands.items():
            times[name].append(_time(cmd, env))
    median = {name: statistics.median(ts) for name, ts in times.items()}
    load = os.getloadavg()[0]
    print(f"sources: {args.src}   repeats: {args.repeats}   load average (1 min) at the end: {load:.2f}")
    floor, heavy = median["python -c pass"], median["import torch, transformers"]
    print(f"{'command':<38}{'median s':>10}{'/ heavy imports':>17}{'- interpreter s':>17}")
    for name, t in median.items():
        print(f"{name:<38}{t:>10.3f}{t / heavy:>17.2f}{t - floor:>17.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
