"""``dspark data ...`` end to end through the CLI table, in this process."""

import json

import pytest

from dspark.cli import main
from dspark.data.cache import FeatureCache
from dspark.data.records import read_jsonl


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    return build_tiny_chat_target(tmp_path_factory.mktemp("t"))


def _run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_estimate_prints_bytes_per_token_and_total(capsys, target_dir):
    code, out, _ = _run(
        capsys,
        "data",
        "estimate",
        "--hidden-size",
        "2560",
        "--feature-layers",
        "5",
        "--dtype",
        "bf16",
        "--tokens",
        "1000000",
    )
    assert code == 0
    assert "= 30,725 B (30.7 KB)" in out and "total for 1,000,000 tokens = 30,725,000,000 B (30.7 GB)" in out
    code, out, _ = _run(
        capsys, "data", "estimate", "--target", str(target_dir), "--dtype", "fp8", "--tokens", "10", "--json"
    )
    assert code == 0
    # Tiny chat target: H = 64, 4 layers -> 3 feature layers.
    assert json.loads(out) | {} == {
        "hidden_size": 64,
        "num_feature_layers": 3,
        "dtype": "fp8",
        "tokens": 10,
        "bytes_per_token": 4 * 64 + 5 + 16,
        "total_bytes": 10 * (4 * 64 + 5 + 16),
    }


def test_estimate_accepts_the_readme_token_counts(capsys):
    """README: ``dspark data estimate --hidden-size 4096 --feature-layers 5 --dtype bf16 --tokens 1e9``."""
    for written, tokens in (("1e9", 10**9), ("1.25B", 1_250_000_000), ("500M", 500_000_000)):
        code, out, _ = _run(
            capsys, "data", "estimate", "--hidden-size", "4096", "--feature-layers", "5", "--tokens", written,
            "--json",
        )  # fmt: skip
        assert code == 0
        assert json.loads(out)["tokens"] == tokens
        assert json.loads(out)["total_bytes"] == tokens * (6 * 4096 * 2 + 5)
    argv = ["data", "estimate", "--hidden-size", "8", "--feature-layers", "1", "--tokens", "1.5"]
    code, _, err = _run(capsys, *argv)
    assert code == 2 and "expected a positive whole count" in err


def test_estimate_errors_are_one_line(capsys):
    code, _, err = _run(capsys, "data", "estimate", "--tokens", "5")
    assert code == 2 and err.strip() == "dspark: error: give --hidden-size and --feature-layers, or --target"


def test_prompts_command_writes_a_seeded_split(capsys, tmp_path):
    src = tmp_path / "src.jsonl"
    src.write_text(
        "".join(
            json.dumps({"turns": [f"q{i}"], "domain": "math" if i % 2 else "code"}) + "\n" for i in range(20)
        )
    )
    code, out, _ = _run(
        capsys,
        "data",
        "prompts",
        "--set",
        str(src),
        "--set",
        str(src),
        "--out",
        str(tmp_path / "train.jsonl"),
        "--eval-out",
        str(tmp_path / "eval.jsonl"),
        "--eval-fraction",
        "0.25",
        "--seed",
        "1",
    )
    assert code == 0
    report = json.loads(out)
    assert (report["train"], report["eval"]) == (15, 5)  # 40 read, 20 after dedup
    assert sum(report["train_domains"].values()) == 15
    train = read_jsonl(tmp_path / "train.jsonl", log=True)
    assert {"id", "turns", "domain", "source"} <= set(train[0])


def test_regenerate_then_cache_then_estimate(capsys, tmp_path, target_dir):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"turns": [f"explain {w}", "and more"]}) + "\n" for w in ("fox", "dog", "step"))
    )
    out = tmp_path / "regen.jsonl"
    code, stdout, _ = _run(
        capsys,
        "data",
        "regenerate",
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--target",
        str(target_dir),
        "--max-tokens",
        "8",
        "--template-kwargs",
        '{"enable_thinking": false}',
        "--seed",
        "3",
        "--temperature",
        "1.0",
        "--no-progress",
    )
    assert code == 0
    report = json.loads(stdout)
    assert (report["done"], report["failed"]) == (3, 0)
    records = read_jsonl(out, log=True)
    assert all(len(r["answers"]) == 2 and r["template_kwargs"] == {"enable_thinking": False} for r in records)

    cache = tmp_path / "cache"
    args = [
        "data",
        "cache",
        "--data",
        str(out),
        "--out",
        str(cache),
        "--target",
        str(target_dir),
        "--dtype",
        "fp16",
        "--template-kwargs",
        '{"enable_thinking": false}',
        "--no-progress",
    ]
    code, stdout, _ = _run(capsys, *args)
    assert code == 0, stdout
    manifest = FeatureCache.open(cache).manifest
    assert manifest["template"]["template_kwargs"] == {"enable_thinking": False}
    assert manifest["data"]["num_samples"] == 6  # token-faithful records: one sample per turn (3 x 2)
    code, _, err = _run(capsys, *args)
    assert code == 2 and "already holds a feature cache" in err

    code, stdout, _ = _run(
        capsys,
        "data",
        "estimate",
        "--target",
        str(target_dir),
        "--data",
        str(out),
        "--dtype",
        "fp16",
        "--template-kwargs",
        '{"enable_thinking": false}',
        "--json",
    )
    assert json.loads(stdout)["tokens"] == manifest["data"]["num_tokens"]
