"""The prepared GPU check (issue 14): one run on one GPU machine, one JSON of every figure.

Sections, in order (``scripts/gpu_check_sections.py``): ``env``; ``gpu_tests`` (the
``gpu``-marked tests: bf16 greedy equality, engine losslessness on CUDA); training
tokens/s and peak memory at the Qwen3-8B and Qwen3-4B drafter shapes on random-init
targets (real vocabulary, 6 target layers, 5 draft layers, 2,048 tokens, 512 anchors;
micro-batch 1 and 2 with the default attention — flex on CUDA —, micro-batch 1 with
activation checkpointing, and micro-batch 1 with the packed attention); SPS(B) of a
Qwen3-8B-shaped random-init target (12 of its 36 layers); the engine's overhead on it;
the tiny-target drafter campaign with whatever time is left (its drafters are copied
under ``$OUT/campaign-drafters``).

Each section runs in its own process with a time limit: the smaller of its own cap and
what is left of ``--budget-s``. A section that fails, is killed by its limit or has no
time left is recorded as such (``status`` = ``error`` / ``timeout`` / ``skipped``) and the
next one runs. The JSON is rewritten after every section, so a run killed from outside
still leaves the finished sections' figures.

Needs torch (CUDA build) and transformers, nothing from the network; runs from a copy of
the repository (``PYTHONPATH=src``, see ``scripts/gpu_check.sh``). ``--dry-run`` runs the
same code on the CPU with tiny shapes (what CI checks).

    scripts/gpu_check.sh                       # on the GPU machine: $OUT/gpu_check.json, <= 7.5 min
    python scripts/gpu_check.py --dry-run --out /tmp/check.json --sections env,train_qwen3_8b
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Per-section caps (seconds) on the GPU; what one section may take at most.
CAPS = {
    "env": 30,
    "gpu_tests": 150,
    "train_qwen3_8b": 100,
    "train_qwen3_4b": 90,
    "sps_qwen3_8b": 45,
    "engine_qwen3_8b": 60,
    "campaign": 600,
}
MIN_START_S = 10  # a section is not started with less time than this left


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="gpu_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=None, help="JSON file (default: $OUT/gpu_check.json)")
    p.add_argument("--budget-s", type=float, default=450.0, help="total time budget in seconds")
    p.add_argument("--sections", default=",".join(CAPS), help=f"comma-separated, from {','.join(CAPS)}")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: checks the script, no figures")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    names = [s for s in ns.sections.split(",") if s]
    unknown = sorted(set(names) - set(CAPS))
    if unknown or not names:
        p.error(f"unknown sections {unknown}; choose from {','.join(CAPS)}")
    if ns.budget_s <= 0:
        p.error("--budget-s must be > 0")
    ns.sections = names
    if ns.out is None:
        ns.out = Path(os.environ.get("OUT") or ".") / "gpu_check.json"
    return ns


def section_limit(name: str, remaining_s: float, *, dry_run: bool) -> float | None:
    """Seconds ``name`` may run with ``remaining_s`` left of the budget; None: do not start it."""
    if remaining_s < MIN_START_S:
        return None
    cap = CAPS[name] if not dry_run else min(CAPS[name], 120)
    return min(cap, remaining_s)


Runner = Callable[[str, float], dict]  # (section, limit_s) -> record


def run_process(cmd: list[str], limit_s: float, env: dict[str, str]) -> dict:
    """Run a section's process under ``limit_s``; its record from the JSON on its last stdout line."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, env=env)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-2000:]
        return {
            "status": "timeout",
            "stderr": tail.decode(errors="replace") if isinstance(tail, bytes) else tail,
        }
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        return {"status": "error", "rc": proc.returncode, "stderr": proc.stderr[-2000:]}
    try:
        return {"status": "ok", "result": json.loads(lines[-1])}
    except json.JSONDecodeError:
        return {"status": "error", "stderr": f"no JSON result: {lines[-1][:200]}"}


def run_child(ns: argparse.Namespace) -> Runner:
    """A runner that runs a section in a fresh ``python gpu_check.py --child NAME`` process."""

    def run(name: str, limit_s: float) -> dict:
        cmd = [sys.executable, __file__, "--child", name] + (["--dry-run"] if ns.dry_run else [])
        return run_process(cmd, limit_s, os.environ | {"GPU_CHECK_SECTION_S": str(limit_s)})

    return run


def run_sections(
    names: list[str],
    budget_s: float,
    runner: Runner,
    *,
    dry_run: bool,
    write: Callable[[dict], None] = lambda report: None,
    clock: Callable[[], float] = time.monotonic,
) -> dict:
    """Run ``names`` in order within ``budget_s``; every section gets a record, whatever happens."""
    started = clock()
    report: dict = {"dry_run": dry_run, "budget_s": budget_s, "sections": {}}
    for name in names:
        limit = section_limit(name, budget_s - (clock() - started), dry_run=dry_run)
        if limit is None:
            report["sections"][name] = {"status": "skipped", "reason": "time budget spent"}
            continue
        t0 = clock()
        try:
            record = runner(name, limit)
        except Exception as e:  # the runner itself failing must not lose the other sections
            record = {"status": "error", "stderr": repr(e)}
        report["sections"][name] = {**record, "limit_s": round(limit, 1), "seconds": round(clock() - t0, 1)}
        write(report)
    report["seconds"] = round(clock() - started, 1)
    write(report)
    return report


def write_json(path: Path) -> Callable[[dict], None]:
    def write(report: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(path)

    return write


def child(name: str, dry_run: bool) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gpu_check_sections as sections

    scale = sections.DRY if dry_run else sections.FULL
    if not dry_run:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device (use --dry-run on a CPU)")
    else:
        import torch

        torch.set_num_threads(1)
    print(json.dumps(sections.SECTIONS[name](scale)), flush=True)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    if ns.child:
        child(ns.child, ns.dry_run)
        return 0
    report = run_sections(
        ns.sections, ns.budget_s, run_child(ns), dry_run=ns.dry_run, write=write_json(ns.out)
    )
    failed = [n for n, r in report["sections"].items() if r["status"] != "ok"]
    print(f"gpu_check: {ns.out}; sections not ok: {failed or 'none'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
