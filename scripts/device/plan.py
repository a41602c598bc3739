"""Prepare the device run's calls here, before the machine starts: run by a maintainer (or a
session) before a GPU run.

    python scripts/device/plan.py                  # .device/call-N/ and the calls to make, in order
    python scripts/device/plan.py --no-sparse      # if a sparse checkout cannot be used

One device call carries the working tree plus named ignored paths, 64 MiB at most, and the
machine stays warm only ~30 s after a call. Until SmolLM2's campaign and speed sections are
done, the pinned SmolLM2 GGUF (98 MB) goes over in parts, one per call, each as large as the
call's room allows, and a sparse checkout leaves behind what the machine does not need
meanwhile: the shipped drafters' weights, docs/, and the tiny target's weights (only the
tiny target's sweeps, priority 4, need them: they wait for a session without the GGUF,
whose single call carries them). The first call also carries the wheels the machine lacks
(gguf; transformers >= 5.20, which dspark needs and the machine's 5.17 is not) and what
earlier sessions brought back (results, the regenerated answers), so a resumed run skips
what is done.

Writes ``.device/call-N/`` (parts, wheels, state, plan.json; ignored by git) and prints, per
call, what to do here before it, the ``run`` arguments (command, carry, timeout_s) and the
device-time estimate. Make the calls back to back: a gap over ~30 s loses the machine and
what it stashed (the run then says which parts are missing). Before the last call, compare
its --budget-s with ``status``'s budget_left_s and lower it if need be.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import payload  # noqa: E402

MIB = payload.MIB
CALL_LIMIT = 64 * MIB
MARGIN = MIB  # files that appear between the plan and the call
DEVICE_S = 900  # device time of a session, start and transfers included
START_S, TRANSFER_S, GAP_S, RETURN_S, SLACK_S = 120, 20, 30, 30, 30
OVERHEAD_S = 20  # a call's staging and wheel install, beside its sections
LAST_OVERHEAD_S = 30  # the last carrying call also joins and checks the GGUF
FIRST_BUDGET_S = 170  # env + cuda_tests
DRAFTER_WEIGHTS = "src/dspark/assets/drafters/*/*/model.safetensors"
TINY_WEIGHTS = "src/dspark/assets/tiny_target/model.safetensors"
DOCS = "docs/*"  # reports and DESIGN: nothing on the machine reads them
# The machine's image lacks gguf (transformers' GGUF reader) and has transformers 5.17, under
# dspark's floor (5.20: sanitize_control_tokens); 5.20.0 needs nothing newer than the image has.
WHEELS = ("gguf==0.19.0", "transformers==5.20.0")


@dataclass(frozen=True, kw_only=True)
class Call:
    name: str
    before: str  # what to run here before the call
    command: str
    carry: list[str]
    timeout_s: int
    travels_mib: float  # tree + carried


def tree_bytes(root: Path, exclude: list[str]) -> int:
    """Bytes of what a call sends from ``root``: the tracked files present and not matched by
    ``exclude`` (a sparse checkout leaves those behind), and the untracked files git does not
    ignore (other work in progress travels too)."""
    names = []
    for extra in ([], ["--others", "--exclude-standard"]):
        out = subprocess.run(["git", "ls-files", "-z", *extra], cwd=root, capture_output=True, check=True)
        listed = [n for n in out.stdout.decode().split("\0") if n]
        names += [n for n in listed if not extra and not any(fnmatch.fnmatch(n, p) for p in exclude)]
        names += listed if extra else []
    return sum((root / n).stat().st_size for n in names if (root / n).is_file())


def sparse_command(exclude: list[str]) -> str:
    pats = " ".join(f"'!/{p}'" for p in exclude)
    return f"git sparse-checkout set --no-cone '/*' {pats}"


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def fetch_wheels(dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp", "-d", str(dest), *WHEELS]
    subprocess.run(cmd, check=True)


def copy_state(state: Path, dest: Path) -> None:
    """Earlier sessions' merged results and regenerated answers (collect.py's folder)."""
    for rel in (
        "results.json",
        "artifacts/smollm2_campaign/data/answers.jsonl",
        "artifacts/smollm2_campaign/stages/regenerate.json",
    ):
        src = state / rel
        if src.is_file():
            target = dest / "state" / rel.replace("artifacts/", "")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def plan_calls(*, gguf_bytes: int, tree: int, first_extra: int, limit: int = CALL_LIMIT) -> list[int]:
    """Bytes of the GGUF carried by each call, as few calls as fit (each call's room is the
    limit less the tree, the call's other carried files and a margin)."""
    for calls in range(1, 16):
        rooms = [limit - MARGIN - tree - first_extra] + [limit - MARGIN - tree] * (calls - 1)
        try:
            return payload.split_sizes(gguf_bytes, rooms)
        except ValueError:
            continue
    raise SystemExit("the GGUF does not fit 15 calls: the tree is too big (tests/unit/test_tree_size.py)")


def needs_gguf(state: Path) -> bool:
    """Whether the sections that need SmolLM2 are not all done (collect.py's results)."""
    path = state / "results.json"
    sections = json.loads(path.read_text()).get("sections", {}) if path.is_file() else {}
    return any(sections.get(s, {}).get("status") != "ok" for s in ("smollm2_campaign", "speed"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="device-plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--gguf", type=Path, default=None, help="the pinned GGUF (default: fetched once into the cache)"
    )
    p.add_argument("--dest", type=Path, default=ROOT / ".device", help="the call folders (ignored by git)")
    p.add_argument("--state", type=Path, default=ROOT / "runs" / "device", help="collect.py's folder")
    p.add_argument("--no-sparse", action="store_true", help="every call carries the whole tree")
    p.add_argument("--no-wheels", action="store_true", help="carry no wheel (the dry run)")
    p.add_argument("--limit-mib", type=float, default=64.0, help="what one call may carry")
    p.add_argument("--device-s", type=float, default=DEVICE_S, help="device time left to the session")
    p.add_argument("--json", action="store_true", help="print the calls as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    gguf = needs_gguf(ns.state)
    if gguf and ns.gguf is None:
        sys.path.insert(0, str(ROOT / "src"))
        from dspark.targets.smollm2 import smollm2_gguf

        ns.gguf = smollm2_gguf()
    limit = int(ns.limit_mib * MIB)
    shutil.rmtree(ns.dest, ignore_errors=True)
    first = ns.dest / "call-1"
    first.mkdir(parents=True)
    if not ns.no_wheels:
        fetch_wheels(first / "whl")
    copy_state(ns.state, first)
    exclude = [] if ns.no_sparse else [DRAFTER_WEIGHTS, DOCS] + ([TINY_WEIGHTS] if gguf else [])
    tree = tree_bytes(ROOT, exclude)
    plan: dict = {}
    sizes = (
        plan_calls(gguf_bytes=ns.gguf.stat().st_size, tree=tree, first_extra=folder_bytes(first), limit=limit)
        if gguf
        else [0]
    )
    if gguf:
        split = payload.split_file(ns.gguf, sizes, ns.dest / "parts", name="smollm2.gguf")
        plan["gguf"] = split.as_json()
    calls, spent = [], START_S
    for i in range(1, len(sizes) + 1):
        folder = ns.dest / f"call-{i}"
        if gguf:
            piece = split.pieces[i - 1].name
            (folder / "parts").mkdir(parents=True, exist_ok=True)
            (ns.dest / "parts" / piece).replace(folder / "parts" / piece)
        payload.write_json(folder / "plan.json", plan)
        last = i == len(sizes)
        if not last:  # the first call: env and the CUDA tests; the middle ones only stage
            budget = FIRST_BUDGET_S if i == 1 else 0
        else:
            # what is left once this call's transfer and overheads, the return call and a slack are paid
            after = TRANSFER_S + GAP_S + OVERHEAD_S + LAST_OVERHEAD_S + RETURN_S + TRANSFER_S + SLACK_S
            budget = int(ns.device_s - spent - after)
        args = f"--call call-{i} --budget-s {max(budget, 1)}" + ("" if budget else " --sections env")
        timeout = budget + OVERHEAD_S + (LAST_OVERHEAD_S if last else 0)
        calls.append(
            Call(
                name=f"call-{i}",
                before=sparse_command(exclude) if i == 1 and not ns.no_sparse else "",
                command=f"bash scripts/device/device.sh {args}",
                carry=[f".device/call-{i}"],
                timeout_s=timeout,
                travels_mib=round((tree + folder_bytes(folder)) / MIB, 1),
            )
        )
        spent += timeout + TRANSFER_S + GAP_S
    if gguf:
        (ns.dest / "parts").rmdir()
    calls.append(
        Call(
            name="return",
            before="only if the last call printed 'shards still to bring back: N' with N > 0",
            command="bash scripts/device/device.sh --call return",
            carry=[],
            timeout_s=RETURN_S,
            travels_mib=round(tree / MIB, 1),
        )
    )
    spent += RETURN_S + TRANSFER_S
    over = [c.name for c in calls if c.travels_mib * MIB > limit]
    report = {
        "calls": [asdict(c) for c in calls],
        "after": ("git sparse-checkout disable; " if not ns.no_sparse else "")
        + "python scripts/device/collect.py <files_at of each call, in order>",
        "device_s_estimate": spent,
        "over_limit": over,
    }
    payload.write_json(ns.dest / "calls.json", report)
    if ns.json:
        print(json.dumps(report, indent=1))
    else:
        for c in calls:
            print(f"{c.name}: {c.travels_mib} MiB, timeout_s {c.timeout_s}, carry {c.carry}")
            if c.before:
                print(f"  here first: {c.before}")
            print(f"  run: {c.command}")
        print(f"then: {report['after']}\ndevice time, start included: ~{spent} s of {ns.device_s:.0f}")
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
