"""Merge what device calls brought back, and install the drafters they trained.

Run by a maintainer (or a session) here, after the last device call of the prepared GPU run.

    python scripts/device/collect.py /work/.device/<call-1 files> /work/.device/<call-2 files> ...

Each folder is one call's returned files (``files_at``), in call order. Into ``--dest``
(default ``runs/device/``, ignored by git):

- ``results.json``: every section's latest record across calls and sessions (an ``ok``
  record is never replaced by a worse one); ``plan.py`` carries it to the next session, whose
  run then skips what is done;
- ``artifacts/``: the reports, plots, records and regenerated answers;
- ``drafters/<method>/``: once every shard of the drafters' tar is here, joined and checked
  (each shard's and the whole's sha256), then each file against the device's record.

``--install`` methods (default DFlash and Eagle3; the GPU DSpark is the control of the CPU
one and stays in ``drafters/`` unless named) are copied into the user's store
(``~/.cache/dspark/drafters/<target>/<method>``, where ``--drafter <method>`` finds them) and
their records merged into the package's ``SHIPPED.json`` (commit it when final).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))

import payload  # noqa: E402

RANK = {"ok": 4, "partial": 3, "timeout": 2, "error": 1, "pending": 0}


def merge_results(old: dict, new: dict) -> dict:
    """``new``'s records over ``old``'s, except that an ``ok`` is not replaced by a worse one."""
    calls = old.get("calls", [])
    # each call brings back the whole session so far: its earlier calls once
    calls = calls + [c for c in new.get("calls", []) if c not in calls]
    merged = {"sections": dict(old.get("sections", {})), "calls": calls}
    for name, record in new.get("sections", {}).items():
        before = merged["sections"].get(name)
        if before is None or RANK.get(record.get("status"), 0) >= RANK.get(before.get("status"), 0):
            merged["sections"][name] = record
    return merged


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="device-collect", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("returned", type=Path, nargs="+", help="each call's returned folder, in order")
    p.add_argument("--dest", type=Path, default=ROOT / "runs" / "device")
    p.add_argument("--install", default="dflash,eagle3", help="methods to install into the store ('' none)")
    p.add_argument(
        "--records", type=Path, default=None, help="SHIPPED.json to merge (default: the package's)"
    )
    return p.parse_args(argv)


def collect_files(folder: Path, dest: Path) -> dict:
    """One call's files into ``dest``; returns its results.json (empty when it has none)."""
    for shard in folder.glob("*.part-*"):
        (dest / "shards").mkdir(parents=True, exist_ok=True)
        shutil.copy2(shard, dest / "shards" / shard.name)
    if (folder / "artifacts.tgz").is_file():
        with tarfile.open(folder / "artifacts.tgz") as tar:
            tar.extractall(dest, filter="data")
    path = folder / "results.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def join_drafters(results: dict, dest: Path) -> tuple[str | None, list[str], str]:
    """(target, methods, what stands): the drafters' tar joined, checked and extracted."""
    campaign = results.get("sections", {}).get("smollm2_campaign", {}).get("result") or {}
    if "shards" not in campaign:
        return None, [], "no drafters in the results yet"
    split = payload.Split.from_json(campaign["shards"])
    missing = payload.missing_pieces(split, dest / "shards")
    if missing:
        return None, [], f"shards still on the machine: {', '.join(missing)} (run the 'return' call)"
    tar = payload.join_file(split, dest / "shards", dest / "drafters.tar")
    shutil.rmtree(dest / "drafters", ignore_errors=True)
    methods = payload.extract_tar(tar, dest / "drafters")
    tar.unlink()
    return campaign.get("target_name"), methods, "joined"


def install(target: str, methods: list[str], dest: Path, records_path: Path) -> list[str]:
    """Copy ``methods`` into the store after checking their files against the device's record."""
    from dspark.durable import write_atomic
    from dspark.formats.shipped import store_root

    device_records = json.loads((dest / "artifacts" / "smollm2_campaign" / "SHIPPED.json").read_text())
    records = json.loads(records_path.read_text()) if records_path.is_file() else {}
    done = []
    for method in methods:
        folder, record = dest / "drafters" / method, device_records[method]
        for name, digest in (record.get("files") or {}).items():
            if payload.sha256(folder / name) != digest:
                raise SystemExit(f"{method}: {name} does not match the device's record; not installed")
        final = store_root() / target / method
        staging = final.with_name(f".{method}.installing")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(folder, staging)
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        records[method] = record
        done.append(method)
    if done:
        write_atomic(records_path, json.dumps(records, indent=1, sort_keys=True) + "\n", mkdir=True)
    return done


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    ns.dest.mkdir(parents=True, exist_ok=True)
    results_path = ns.dest / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for folder in ns.returned:
        results = merge_results(results, collect_files(folder, ns.dest))
    payload.write_json(results_path, results)
    target, methods, status = join_drafters(results, ns.dest)
    wanted = [m for m in ns.install.split(",") if m]
    installed = []
    if target and methods:
        records = ns.records or ROOT / "src" / "dspark" / "assets" / "drafters" / target / "SHIPPED.json"
        installed = install(target, [m for m in wanted if m in methods], ns.dest, records)
    for name, record in results.get("sections", {}).items():
        print(
            f"{name}: {record.get('status')}" + (f" ({record['waiting']})" if record.get("waiting") else "")
        )
    print(
        f"drafters: {status}; returned {methods or 'none'}; installed into the store: {installed or 'none'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
