"""The prepared device run (issue 36) for real on the CPU with ``--dry-run``: plan, two calls,
the return call, collect, then a next session — the tiny target in SmolLM2's place and a fake
GGUF of 300 KB in two parts, the same code paths as on the GPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEVICE = ROOT / "scripts" / "device"
sys.path.insert(0, str(DEVICE))

import payload  # noqa: E402
import plan  # noqa: E402
import run  # noqa: E402


def _device(args: list[str], env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_the_whole_device_run_dry_on_the_cpu(tmp_path):
    """plan → call-1 (part 1: the campaign waits) → call-2 (part 2: joined, campaign, speed, as
    many shards as a call brings back) → return (the rest) → collect (joined, checked,
    installed in the store) → a next session's call skips what is done."""
    env = os.environ | {
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT / "src"),
        "DSPARK_CACHE": str(tmp_path / "cache"),
        "DSPARK_DEVICE_STASH": str(tmp_path / "stash"),
    }
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(os.urandom(300_000))
    carried = tmp_path / ".device"
    limit = (plan.tree_bytes(ROOT, []) + plan.MARGIN + 200_000) / plan.MIB  # room for 200 KB a call
    common = ["--gguf", str(gguf), "--dest", str(carried), "--no-wheels", "--no-sparse"]
    made = _device([str(DEVICE / "plan.py"), *common, "--state", str(tmp_path / "none"), "--json"]
                   + ["--limit-mib", f"{limit:.4f}"], env)  # fmt: skip
    calls = json.loads(made.stdout)["calls"]
    assert [c["name"] for c in calls] == ["call-1", "call-2", "return"]
    assert all(c["command"].startswith("bash scripts/device/device.sh --call") for c in calls)
    sections = ["--sections", "env,smollm2_campaign,speed"]
    runs = [str(DEVICE / "run.py"), "--dry-run", "--carried", str(carried), "--budget-s", "500", *sections]
    outs = [tmp_path / f"out{i}" for i in range(3)]
    _device([*runs, "--call", "call-1", "--out", str(outs[0])], env)
    first = json.loads((outs[0] / "results.json").read_text())
    assert first["calls"][0]["gguf"] == "parts missing: smollm2.gguf.part-01"
    assert first["sections"]["smollm2_campaign"]["waiting"] == "the GGUF is not joined yet"
    _device([*runs, "--call", "call-2", "--out", str(outs[1])], env)
    second = json.loads((outs[1] / "results.json").read_text())
    assert second["calls"][-1]["gguf"] == "joined"
    assert all(second["sections"][s]["status"] == "ok" for s in ("env", "smollm2_campaign", "speed")), second
    assert second["sections"]["env"] == first["sections"]["env"]  # not run again
    campaign = second["sections"]["smollm2_campaign"]["result"]
    assert campaign["drafters"] == ["dflash", "eagle3", "dspark"]
    back = sorted(outs[1].iterdir())
    assert len(back) <= run.RETURN_FILES and sum(f.stat().st_size for f in back) <= 64 * plan.MIB
    assert len(campaign["shards"]["pieces"]) > len(back) - 2  # some shards wait for the return call
    speed = second["sections"]["speed"]["result"]["rows"]
    assert {r["drafter"] for r in speed} == {"none", "dflash", "eagle3", "dspark"}
    assert all(r["tokens_per_s"] > 0 for r in speed)
    _device([*runs, "--call", "return", "--out", str(outs[2])], env)
    records = tmp_path / "SHIPPED.json"
    dest = tmp_path / "collected"
    done = _device(
        [str(DEVICE / "collect.py"), *map(str, outs), "--dest", str(dest), "--records", str(records)], env
    )
    assert "installed into the store: ['dflash', 'eagle3']" in done.stdout
    store = tmp_path / "cache" / "drafters" / "tiny"
    assert sorted(p.name for p in store.iterdir()) == ["dflash", "eagle3"]
    assert (dest / "drafters" / "dspark" / "config.json").is_file()  # the control, not installed
    shipped = json.loads(records.read_text())
    assert sorted(shipped) == ["dflash", "eagle3"] and shipped["dflash"]["files"]
    for name, digest in shipped["eagle3"]["files"].items():
        assert payload.sha256(store / "eagle3" / name) == digest
    # a next session: the plan carries the merged results, and its call skips what is done
    _device([str(DEVICE / "plan.py"), *common, "--state", str(dest), "--limit-mib", f"{limit:.4f}"], env)
    assert (carried / "call-1" / "state" / "results.json").is_file()
    env["DSPARK_DEVICE_STASH"] = str(tmp_path / "stash2")
    _device([*runs, "--call", "call-1", "--out", str(tmp_path / "next")], env)
    again = json.loads((tmp_path / "next" / "results.json").read_text())
    assert again["sections"]["speed"] == second["sections"]["speed"]  # carried, not rerun
