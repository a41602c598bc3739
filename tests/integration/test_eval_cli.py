"""``dspark eval``, ``dspark calibrate`` and ``dspark sweep`` end to end through the CLI table.

A random-init tiny chat target (tests/unit/data/tiny_chat_target.py) and random-init
drafters saved as folders stand in for trained ones: the commands are the same, only
the numbers are meaningless. One test runs the shipped tiny drafters on built-in
prompts when the package assets are there.
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from dspark.cli import main
from dspark.drafters.dflash import DFlashConfig
from dspark.drafters.dspark import DSparkConfig
from dspark.drafters.eagle3 import Eagle3Config
from dspark.drafters.kinds import KINDS
from dspark.formats.folder import load_drafter, save_drafter
from dspark.formats.shipped import shipped_drafter_dir
from dspark.presets.tiny import assets_dir
from dspark.targets import TargetAdapter

GAMMA = 4
PNG = b"\x89PNG"


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny target, a DSpark / DFlash / Eagle3 drafter for it, 5 prompts, training records."""
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target, mask_token_id

    root = tmp_path_factory.mktemp("eval")
    target_dir = build_tiny_chat_target(root / "target")
    target = TargetAdapter.from_pretrained(target_dir)
    mask = mask_token_id(target.tokenizer)
    configs = {
        "dspark": DSparkConfig(num_layers=1, block_size=GAMMA, mask_token_id=mask, markov_rank=8),
        "dflash": DFlashConfig(num_layers=1, block_size=GAMMA, mask_token_id=mask),
        "eagle3": Eagle3Config(block_size=GAMMA),
    }
    for name, config in configs.items():
        torch.manual_seed(0)
        save_drafter(root / name, KINDS[name].drafter_cls.from_target(target, config), target)
    with open(root / "bench.jsonl", "w") as f:
        for i in range(5):
            f.write(json.dumps({"turns": [f"Explain how topic {i} works.", "Say it again, shorter."]}) + "\n")
    with open(root / "train.jsonl", "w") as f:
        for i in range(4):
            answer = "The quick brown fox jumps over the lazy dog. " * 2
            messages = [
                {"role": "user", "content": f"Explain {i}."},
                {"role": "assistant", "content": answer},
            ]
            f.write(json.dumps({"conversations": messages}) + "\n")
    return root


def _run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _eval_args(setup, out, *extra):
    drafters = ",".join(f"{n}={setup / n}" for n in ("dspark", "dflash", "eagle3"))
    return [
        "eval", "--drafters", drafters, "--bench", setup / "bench.jsonl", "--target", setup / "target",
        "--max-tokens", "12", "--no-progress", "--out", out, *extra,
    ]  # fmt: skip


def test_eval_writes_results_plots_and_report(setup, tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, _ = _run(capsys, *_eval_args(setup, out, "--multi-turn"))
    assert code == 0, stdout
    results = json.loads((out / "results.json").read_text())
    rows = {r["drafter"]: r for r in results["rows"]}
    assert set(rows) == {"none", "dspark", "dflash", "eagle3"}
    for name in ("dspark", "dflash", "eagle3"):
        r = rows[name]
        assert r["benchmark"] == "bench" and r["num_prompts"] == 5 and r["num_rounds"] > 0
        assert 1.0 <= r["tau"] <= GAMMA + 1 and r["speedup"] > 0 and r["tokens_per_s"] > 0
        assert len(r["conditional_acceptance"]) == GAMMA and len(r["histogram"]) == GAMMA + 1
        assert sum(r["histogram"]) == r["num_rounds"]
    assert rows["none"]["tau"] == 1.0 and rows["none"]["speedup"] == pytest.approx(1.0)
    # Only DSpark reports confidences: it alone gets a threshold sweep (paper Fig. 5).
    assert [t["drafter"] for t in results["thresholds"]] == ["dspark"]
    report = (out / "report.md").read_text()
    for png in ("tau.png", "conditional_acceptance.png", "prefix_survival.png", "threshold_dspark.png"):
        assert (out / png).read_bytes()[:4] == PNG
        assert f"({png})" in report
    assert "| dspark |" in report and "report:" in stdout


def test_eval_is_reproducible_with_fixed_seeds(setup, tmp_path, capsys):
    taus = []
    for run in ("a", "b"):
        args = _eval_args(setup, tmp_path / run, "--no-baseline", "--limit", "2")
        assert _run(capsys, *args)[0] == 0
        taus.append([r["tau"] for r in json.loads((tmp_path / run / "results.json").read_text())["rows"]])
    assert taus[0] == taus[1]


def test_broken_benchmark_line_stops_or_is_skipped(setup, tmp_path, capsys, caplog):
    bench = tmp_path / "broken.jsonl"
    lines = (setup / "bench.jsonl").read_text().splitlines()
    bench.write_text("\n".join([lines[0], "{not json", lines[1]]) + "\n")
    args = _eval_args(setup, tmp_path / "out", "--limit", "2")
    args[args.index("--bench") + 1] = bench
    code, _, err = _run(capsys, *args)
    assert code == 2 and err.strip().splitlines()[-1].startswith(f"dspark: error: {bench}:2: not valid JSON")
    assert not (tmp_path / "out").exists()
    with caplog.at_level(logging.WARNING):
        code, _, _ = _run(capsys, *args, "--on-bad-line", "skip")
    assert code == 0 and f"{bench}:2" in caplog.text
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert rows[0]["num_prompts"] == 2  # the two good lines


def test_drafter_for_another_target_is_refused_before_any_work(setup, tmp_path, capsys):
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    # Same shape, other weights: only the shared embedding / LM head tell them apart.
    other = build_tiny_chat_target(tmp_path / "other", seed=1)
    args = _eval_args(setup, tmp_path / "out")
    args[args.index("--target") + 1] = other
    code, _, err = _run(capsys, *args)
    assert code == 2 and "trained for another target" in err
    # Another shape: the folder loader refuses it.
    wide = build_tiny_chat_target(tmp_path / "wide", hidden_size=96)
    args[args.index("--target") + 1] = wide
    code, _, err = _run(capsys, *args)
    assert code == 2 and "does not fit this target" in err
    assert not (tmp_path / "out").exists()


def test_calibrate_fits_and_writes_temperatures(setup, tmp_path, capsys):
    drafter = tmp_path / "dspark"
    shutil.copytree(setup / "dspark", drafter)
    out = tmp_path / "cal"
    code, stdout, _ = _run(
        capsys, "calibrate", "--drafter", drafter, "--bench", setup / "bench.jsonl", "--target",
        setup / "target", "--max-tokens", "24", "--no-progress", "--out", out,
    )  # fmt: skip
    assert code == 0, stdout
    summary = json.loads((out / "calibration.json").read_text())
    assert len(summary["temperatures"]) == GAMMA and summary["written_to"] == str(drafter)
    assert len(summary["before"]) == len(summary["after"]) == GAMMA
    assert (out / "reliability.png").read_bytes()[:4] == PNG and "reliability.png" in (
        out / "calibration.md"
    ).read_text()
    config = json.loads((drafter / "config.json").read_text())
    assert config["sts_temperatures"] == pytest.approx(summary["temperatures"])
    target = TargetAdapter.from_pretrained(setup / "target")
    assert load_drafter(drafter, target).config.sts_temperatures == pytest.approx(
        tuple(summary["temperatures"])
    )
    # A drafter without a confidence head has nothing to calibrate: refused up front.
    code, _, err = _run(
        capsys, "calibrate", "--drafter", setup / "dflash", "--target", setup / "target", "--out", out
    )
    assert code == 2 and "no confidence head" in err


def test_calibrate_never_rewrites_a_shipped_drafter_in_place(tmp_path, capsys):
    shipped = assets_dir() / "drafters" / "tiny" / "dspark" / "config.json"
    before = shipped.read_bytes() if shipped.is_file() else None
    code, _, err = _run(capsys, "calibrate", "--drafter", "dspark", "--out", tmp_path / "cal")
    assert code == 2 and "part of the package; pass --save-to DIR" in err
    assert not (tmp_path / "cal").exists()
    assert (shipped.read_bytes() if shipped.is_file() else None) == before


@pytest.mark.parametrize("kind", ["depth", "block-size"])
def test_sweeps_train_evaluate_and_plot(setup, tmp_path, capsys, kind):
    out = tmp_path / kind
    specific = (
        ["--layers", "1", "--baseline-layers", "1", "--gamma", "2"]
        if kind == "depth"
        else ["--lengths", "2,3", "--layers", "1"]
    )
    code, stdout, _ = _run(
        capsys, "sweep", kind, *specific, "--data", setup / "train.jsonl", "--steps", "2",
        "--batch-size", "2", "--micro-batch-size", "1", "--num-anchors", "4", "--max-length", "64",
        "--bench", setup / "bench.jsonl", "--limit", "2", "--target", setup / "target",
        "--max-tokens", "8", "--no-progress", "--out", out,
    )  # fmt: skip
    assert code == 0, stdout
    sweep = json.loads((out / "sweep.json").read_text())
    labels = {v["label"] for v in sweep["variants"]}
    expected = (
        {"dspark 1L", "dflash 1L"}
        if kind == "depth"
        else {f"{m} L={n}" for m in ("dspark", "dflash") for n in (2, 3)}
    )
    assert labels == expected and {p["label"] for p in sweep["points"]} == expected
    figure = "depth.png" if kind == "depth" else "block_size.png"
    assert (out / figure).read_bytes()[:4] == PNG and (out / "eval" / "results.json").is_file()
    if kind == "block-size":
        gammas = {v["label"]: v["config"]["block_size"] for v in sweep["variants"]}
        assert gammas["dspark L=3"] == 2  # draft length = γ + 1


@pytest.mark.skipif(
    not (shipped_drafter_dir("dspark") / "config.json").is_file() or not (assets_dir() / "prompts").is_dir(),
    reason="the shipped tiny drafters / built-in prompts are not in this checkout yet",
)
def test_shipped_drafters_on_builtin_prompts(tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, _ = _run(
        capsys, "eval", "--drafters", "dspark,dflash,eagle3", "--bench", "math,code,chat", "--limit", "2",
        "--max-tokens", "16", "--no-progress", "--out", out,
    )  # fmt: skip
    assert code == 0, stdout
    results = json.loads((out / "results.json").read_text())
    assert {(r["drafter"], r["domain"]) for r in results["rows"]} >= {
        (d, dom) for d in ("dspark", "dflash", "eagle3") for dom in ("math", "code", "chat")
    }
    assert {(d["drafter"], d["domain"]) for d in results["domains"]} >= {("dspark", "math")}
    assert (out / "report.md").is_file() and (out / "conditional_acceptance.png").is_file()
