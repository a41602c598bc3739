"""SHIPPED.json: written by scripts/ship_drafters.py from a campaign folder, read back whole,
and old records (no curve) still readable."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from dspark.formats.shipped_record import MEASURE, RECORD, ShippedRecord, read_records, thin

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "ship_drafters.py"
_spec = importlib.util.spec_from_file_location("ship_drafters", SCRIPT)
ship = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ship)


def test_thin_keeps_both_ends_and_at_most_max_points():
    steps = list(range(20, 10_001, 20))  # 500 points
    keep = thin(steps, 40)
    assert len(keep) <= 40 and keep[0] == 0 and keep[-1] == len(steps) - 1
    assert keep == sorted(set(keep))
    gaps = [steps[b] - steps[a] for a, b in zip(keep, keep[1:])]
    assert max(gaps) - min(gaps) <= 40  # evenly spread over the step range
    assert thin([5, 6, 7], 40) == [0, 1, 2]


def _campaign(root: Path, target) -> Path:
    """A hand-made campaign folder: stage markers, a metrics log and a (random) drafter."""
    import dataclasses

    from dspark.drafters.kinds import kind_of_config
    from dspark.formats.folder import save_drafter
    from dspark.presets import drafters as presets

    camp = root / "campaign"
    (camp / "stages").mkdir(parents=True)
    (camp / "stages" / "cache.json").write_text(json.dumps({"summary": {"tokens": 50_000}}))
    summary = {"steps": 600, "epochs": 2.4, "stopped_early": True, "val_expected_tau": 2.7}
    summary["drafter"] = "drafters/dflash"
    (camp / "stages" / "train-dflash.json").write_text(json.dumps({"summary": summary}))
    lines = []
    for step in range(20, 601, 20):  # training records every 20 steps, validation every 100
        record = {"step": step, "expected_tau": 1.0 + step / 1000, "loss": 1.0}
        if step % 100 == 0:
            record[MEASURE] = 1.5 + step / 500
        if step in (300, 600):
            record["eval/tau"] = 1.4 + step / 1000
        lines.append(json.dumps(record))
    lines.append(json.dumps({"step": 600, MEASURE: 2.7}))  # a resumed run re-logs its last step
    (camp / "train" / "dflash").mkdir(parents=True)
    (camp / "train" / "dflash" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    config = dataclasses.replace(presets.dflash_tiny(), block_size=7)
    drafter = kind_of_config(config).drafter_cls.from_target(target, config)
    save_drafter(camp / "drafters" / "dflash", drafter, target)
    return camp


@pytest.fixture(scope="module")
def tiny():
    from dspark.presets.tiny import resolve_target
    from dspark.targets import TargetAdapter

    return TargetAdapter.from_pretrained(resolve_target("tiny"))


def test_the_script_writes_a_curve_that_round_trips(tmp_path, tiny):
    camp = _campaign(tmp_path, tiny)
    dest = tmp_path / "assets"
    old = {"eagle3": {"steps": 300, "epochs": 0.3, "training_tokens": 300_000, "val_expected_tau": None}}
    (dest / "tiny").mkdir(parents=True)
    (dest / "tiny" / RECORD).write_text(json.dumps(old))  # a record from before curves
    assert (
        ship.main(["--campaign", str(camp), "--target", "tiny", "--dest", str(dest), "--methods", "dflash"])
        == 0
    )
    assert (dest / "tiny" / "dflash" / "model.safetensors").is_file()
    records = read_records(dest / "tiny")
    assert set(records) == {"dflash", "eagle3"}
    assert records["eagle3"].curve is None and records["eagle3"].steps == 300  # kept, still readable
    r = records["dflash"]
    assert (r.steps, r.epochs, r.training_tokens, r.stopped_early) == (600, 2.4, 120_000, True)
    c = r.curve
    assert c.measure == MEASURE and c.tokens_per_step == pytest.approx(200.0)
    assert c.steps == (100, 200, 300, 400, 500, 600)  # validation points only, step 600 once
    assert c.expected_tau == pytest.approx((1.7, 1.9, 2.1, 2.3, 2.5, 2.7))
    assert c.real_tau_steps == (300, 600) and c.real_tau == pytest.approx((1.7, 2.0))
    assert r.real_tau_last == pytest.approx(2.0)
    raw = json.loads((dest / "tiny" / RECORD).read_text())
    assert raw["dflash"]["curve"]["tokens"] == [20_000, 40_000, 60_000, 80_000, 100_000, 120_000]
    assert ShippedRecord.from_json(raw["dflash"]) == r  # the JSON holds the whole record
    assert ShippedRecord.from_json(json.loads(json.dumps(r.as_json()))) == r
