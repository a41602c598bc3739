"""The prepared device run: one resumable script, run once per device call (by device.sh on the
GPU machine; with ``--dry-run`` by tests/integration/test_device_run_dry.py on a CPU).

    bash scripts/device/device.sh --call call-1 --budget-s 180    # on the GPU machine
    python scripts/device/run.py --dry-run --call call-1 ...       # the same on a CPU (CI)

Each call first stages what it carried (``.device/<call>/``: the GGUF's parts, wheels, the
plan, results of earlier sessions) into a stash that outlives the call while the machine
stays warm, joins the GGUF once every part is there (each part's and the whole's sha256
checked), then runs the sections (:mod:`sections`) in priority order:

    env, cuda_tests, smollm2_campaign, speed, tiny_sweeps, train_shapes

skipping those already ``ok`` in an earlier call or session, and those whose needs are not
met yet (``smollm2_campaign`` needs the GGUF, ``speed`` a trained drafter), each in its own
process under the smaller of its cap and what is left of ``--budget-s``. After every
section it writes ``$OUT/results.json`` (every section's record, this session's and the
merged earlier ones), ``$OUT/artifacts.tgz`` (reports, plots, records, answers) and as many
drafter shards as a call may bring back; ``--call return`` brings back the rest.
``scripts/device/collect.py`` merges what came back; ``scripts/device/plan.py`` prepares
the calls.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import payload  # noqa: E402

# Section -> (least seconds worth starting it with, cap) on the GPU, in priority order (issue 36).
CAPS = {
    "env": (5, 20),
    "cuda_tests": (60, 150),
    "smollm2_campaign": (120, 330),
    "speed": (45, 90),  # the SPS profile of the target on its first use, then 4 drafters x 3 batches
    "tiny_sweeps": (60, 150),
    "train_shapes": (60, 180),  # the two shapes took 100 and 90 s
}
DRY_CAP = 240  # a section's cap in the dry run
RETURN_FILES = 8  # what one call may bring back: 8 files ...
RETURN_BYTES = 60 * payload.MIB  # ... 64 MiB together (a margin kept)
DEFAULT_STASH = Path("/tmp/dspark-device")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="device-run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--call", default=None, help="the call folder carried (.device/<call>), or 'return'")
    p.add_argument("--carried", type=Path, default=ROOT / ".device", help="where the call folders arrive")
    p.add_argument("--budget-s", type=float, default=420.0, help="seconds this call may spend on sections")
    p.add_argument("--sections", default=",".join(CAPS), help=f"from {','.join(CAPS)}")
    p.add_argument("--redo", default="", help="sections to run again although ok before")
    p.add_argument("--stash", type=Path, default=None, help=f"kept across calls (default {DEFAULT_STASH})")
    p.add_argument("--out", type=Path, default=None, help="what comes back (default: $OUT)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny target, miniature budgets (CI)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    ns.sections = [s for s in ns.sections.split(",") if s]
    ns.redo = {s for s in ns.redo.split(",") if s}
    unknown = sorted((set(ns.sections) | ns.redo) - set(CAPS))
    if unknown or not ns.sections:
        p.error(f"unknown sections {unknown}; choose from {','.join(CAPS)}")
    if ns.budget_s <= 0:
        p.error("--budget-s must be > 0")
    ns.stash = ns.stash or Path(os.environ.get("DSPARK_DEVICE_STASH") or DEFAULT_STASH)
    ns.out = ns.out or Path(os.environ.get("OUT") or ".")
    return ns


# -- staging: what the call carried ---------------------------------------------------------------


def stage(call_dir: Path, stash: Path) -> list[str]:
    """Copy a call's carried folder into the stash (parts, wheels, plan, state); returns names."""
    copied = []
    for src in sorted(call_dir.rglob("*")):
        if src.is_file():
            dest = stash / src.relative_to(call_dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
            copied.append(str(src.relative_to(call_dir)))
    return copied


def join_gguf(stash: Path, plan: dict) -> str:
    """Join the GGUF once all its parts are staged; what stands."""
    from sections import GGUF

    if (stash / GGUF).is_file():
        return "joined"
    if "gguf" not in plan:
        return "no plan"
    split = payload.Split.from_json(plan["gguf"])
    missing = payload.missing_pieces(split, stash / "parts")
    if missing:
        return f"parts missing: {', '.join(missing)}"
    payload.join_file(split, stash / "parts", stash / GGUF)
    shutil.rmtree(stash / "parts")
    return "joined"


# -- sections -------------------------------------------------------------------------------------


def needs_met(name: str, stash: Path) -> str | None:
    """None when ``name`` can run now, else why not."""
    from sections import GGUF

    if name == "smollm2_campaign" and not (stash / GGUF).is_file():
        return "the GGUF is not joined yet"
    if name == "speed" and not list((stash / "work" / "smollm2" / "drafters").glob("*/config.json")):
        return "no drafter trained in this session yet"
    if name == "tiny_sweeps" and not (ROOT / "src/dspark/assets/tiny_target/model.safetensors").is_file():
        return "the tiny target's weights stayed behind (a session that carries the GGUF leaves them)"
    return None


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
    """A runner that runs a section in a fresh ``python run.py --child NAME`` process."""

    def run(name: str, limit_s: float) -> dict:
        cmd = [sys.executable, __file__, "--child", name, "--stash", str(ns.stash)]
        cmd += ["--dry-run"] if ns.dry_run else []
        return run_process(cmd, limit_s, os.environ | {"DEVICE_SECTION_S": str(limit_s)})

    return run


def run_sections(
    names: list[str],
    state: dict,
    budget_s: float,
    runner: Runner,
    *,
    dry_run: bool,
    redo: set[str] = frozenset(),
    blocked: Callable[[str], str | None] = lambda name: None,
    publish: Callable[[dict], None] = lambda state: None,
    clock: Callable[[], float] = time.monotonic,
) -> dict:
    """Run ``names`` in order within ``budget_s``, into ``state["sections"]``; a section ok in
    ``state`` (an earlier call or session) is not run again unless in ``redo``; one whose
    needs are unmet, or that finds too little time left, waits for a later call."""
    started = clock()
    sections = state.setdefault("sections", {})
    for name in names:
        if sections.get(name, {}).get("status") == "ok" and name not in redo:
            continue
        why = blocked(name)
        least, cap = CAPS[name] if not dry_run else (5, DRY_CAP)
        left = budget_s - (clock() - started)
        if why is not None or left < least:
            sections.setdefault(name, {"status": "pending"})["waiting"] = why or "time budget spent"
            continue
        limit = min(cap, left)
        t0 = clock()
        try:
            record = runner(name, limit)
        except Exception as e:  # the runner itself failing must not lose the other sections
            record = {"status": "error", "stderr": repr(e)}
        if record.get("status") == "ok" and (record.get("result") or {}).get("done") is False:
            record["status"] = "partial"  # its finished stages are kept; a later call goes on
        record |= {"limit_s": round(limit, 1), "seconds": round(clock() - t0, 1), "at": time.time()}
        sections[name] = record
        publish(state)
    return state


# -- the way back ---------------------------------------------------------------------------------


def publish(state: dict, stash: Path, out: Path) -> None:
    """Write what this call brings back into ``out``: results.json, artifacts.tgz, and the drafter
    shards not yet brought back, as many as the call's file and byte limits allow (counting
    what earlier publishes of this call left there)."""
    out.mkdir(parents=True, exist_ok=True)
    art = stash / "return" / "artifacts"
    if art.is_dir():
        with tarfile.open(out / "artifacts.tgz", "w:gz") as tar:
            tar.add(art, arcname="artifacts")
    there = [f for f in out.iterdir() if f.is_file() and f.name != "results.json"]
    files, used = len(there) + 1, sum(f.stat().st_size for f in there) + payload.MIB  # + results.json
    sent = set(state.setdefault("returned_shards", []))
    for shard in sorted((stash / "return" / "shards").glob("*.part-*")):
        if shard.name in sent:
            continue
        size = shard.stat().st_size
        if files + 1 > RETURN_FILES or used + size > RETURN_BYTES:
            break
        shutil.copy2(shard, out / shard.name)
        state["returned_shards"].append(shard.name)
        files, used = files + 1, used + size
    payload.write_json(stash / "results.json", state)
    payload.write_json(out / "results.json", state)


def load_state(stash: Path) -> dict:
    """This session's state, else the merged results of earlier sessions that the call carried."""
    for path in (stash / "results.json", stash / "state" / "results.json"):
        if path.is_file():
            state = json.loads(path.read_text())
            state["returned_shards"] = [] if path.parent.name == "state" else state.get("returned_shards", [])
            return state
    return {"sections": {}}


def child(name: str, ns: argparse.Namespace) -> None:
    import sections

    if not ns.dry_run:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device (use --dry-run on a CPU)")
    else:
        import torch

        torch.set_num_threads(1)
    ctx = sections.Context(
        scale=sections.DRY if ns.dry_run else sections.GPU,
        dry_run=ns.dry_run,
        stash=ns.stash,
        limit_s=float(os.environ.get("DEVICE_SECTION_S", "120")),
    )
    print(json.dumps(sections.SECTIONS[name](ctx)), flush=True)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    if ns.child:
        child(ns.child, ns)
        return 0
    ns.stash.mkdir(parents=True, exist_ok=True)
    call = {"call": ns.call, "dry_run": ns.dry_run, "started": time.time()}
    if ns.call and ns.call != "return":
        call["staged"] = len(stage(ns.carried / ns.call, ns.stash))
    state = load_state(ns.stash)
    plan = json.loads((ns.stash / "plan.json").read_text()) if (ns.stash / "plan.json").is_file() else {}
    try:
        call["gguf"] = join_gguf(ns.stash, plan)
    except ValueError as e:
        call["gguf"] = f"refused: {e}"
    state.setdefault("calls", []).append(call)
    write = lambda s: publish(s, ns.stash, ns.out)  # noqa: E731
    if ns.call != "return":
        run_sections(
            ns.sections,
            state,
            ns.budget_s,
            run_child(ns),
            dry_run=ns.dry_run,
            redo=ns.redo,
            blocked=lambda name: needs_met(name, ns.stash),
            publish=write,
        )
    write(state)
    pending = [n for n, r in state["sections"].items() if r.get("status") != "ok"]
    left = len(list((ns.stash / "return" / "shards").glob("*.part-*"))) - len(state["returned_shards"])
    print(
        f"device run: sections not ok: {pending or 'none'}; shards still to bring back: {left}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
    )
    raise SystemExit(main())
