"""Mistakes that need no model fail at parse time: one ``dspark: error:`` line, nothing loaded.

The target loader is patched to raise, so a check that ran only after loading would fail
these tests with the loader's error instead of the expected line.
"""

from __future__ import annotations

import argparse
import time

import pytest

from dspark.cli import main
from dspark.commands import argtypes

MISSING = "/no/such/path"
CASES = [
    (["generate", "--prompt", "hi", "--drafter", MISSING], "--drafter", "no such drafter folder"),
    (["generate", "--prompt", "hi", "--target", "/nonexistent"], "--target", "no such model folder"),
    (["generate", "--prompt", "hi", "--top-p", "2"], "--top-p", "(0, 1]"),
    (["generate", "--prompt", "hi", "--top-p", "0"], "--top-p", "(0, 1]"),
    (["generate", "--prompt", "hi", "--temperature", "-1"], "--temperature", ">= 0"),
    (["generate", "--prompt", "hi", "--max-tokens", "0"], "--max-tokens", "positive integer"),
    (["generate", "--prompt", "hi", "--top-k", "-3"], "--top-k", ">= 0"),
    (["serve", "--drafter", MISSING], "--drafter", "no such drafter folder"),
    (["serve", "--target", "./no-such-target"], "--target", "no such model folder"),
    (["serve", "--port", "-5"], "--port", "0 to 65535"),
    (["serve", "--port", "70000"], "--port", "0 to 65535"),
    (["eval", "--drafters", f"dspark,mine={MISSING}", "--out", "{tmp}/e"], "--drafters", MISSING),
    (["eval", "--drafters", "ngram", "--target", "/nonexistent", "--out", "{tmp}/e"], "--target", "folder"),
    (["calibrate", "--drafter", MISSING, "--out", "{tmp}/c"], "--drafter", "no such drafter folder"),
    (["export", "--format", "hf", "--drafter", MISSING, "--out", "{tmp}/x"], "--drafter", "no such"),
    (["bench", "decode", "--drafters", f"none,{MISSING}"], "--drafters", "no such drafter folder"),
    (["bench", "serve", "--target", "/nonexistent"], "--target", "no such model folder"),
    (["bench", "round", "--drafter", MISSING], "--drafter", "no such drafter folder"),
    (["bench", "tree", "--drafters", f"dspark,{MISSING}"], "--drafters", "no such drafter folder"),
    (
        ["eval", "--drafters", "ngram", "--bench", "math,/no/such.jsonl", "--out", "{tmp}/e"],
        "--bench",
        "no such",
    ),
    (["bench", "decode", "--bench", "gsm8k.jsonl"], "--bench", "no such prompt file"),
    (["bench", "matrix", "--prompts", "code,./p.jsonl"], "--prompts", "no such prompt file"),
    (["bench", "serve", "--prompts", MISSING], "--prompts", "no such prompt file"),
    (
        ["data", "regenerate", "--prompts", "math", "--out", "{tmp}/a.jsonl", "--drafter", MISSING],
        "--drafter",
        "no such drafter folder",
    ),  # fmt: skip
    (
        ["data", "regenerate", "--prompts", "/missing.jsonl", "--out", "{tmp}/a.jsonl"],
        "--prompts",
        "no such prompt file",
    ),
    (
        ["data", "regenerate", "--prompts", "math", "--prompts", "answers.jsonl", "--out", "{tmp}/a.jsonl"],
        "--prompts",
        "no such prompt file: 'answers.jsonl'",
    ),  # fmt: skip
    (
        ["train", "--drafter", "dspark", "--data", "/missing.jsonl", "--out", "{tmp}/t"],
        "--data",
        "no such data file",
    ),
    (
        ["train", "--drafter", "dspark", "--data", "tiny-corpus", "/missing.jsonl", "--out", "{tmp}/t"],
        "--data",
        "no such data file: '/missing.jsonl'",
    ),  # fmt: skip
    (
        ["train", "--drafter", "dspark", "--data", "{tmp}", "--out", "{tmp}/t"],
        "--data",
        "a folder, not a JSONL file",
    ),
    (["sweep", "depth", "--data", "/missing.jsonl", "--out", "{tmp}/s"], "--data", "no such data file"),
]


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a target fails the test (every command loads its target before any drafter)."""
    from dspark.targets import TargetAdapter

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(TargetAdapter, "from_pretrained", refuse)


@pytest.mark.parametrize(
    ("argv", "flag", "needle"), CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_a_mistake_is_one_line_before_anything_loads(tmp_path, capsys, no_loading, argv, flag, needle):
    started = time.perf_counter()
    with pytest.raises(SystemExit) as exc:
        main(["--threads", "1", *(a.format(tmp=tmp_path) for a in argv)])
    seconds = time.perf_counter() - started
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith(f"dspark: error: argument {flag}: ") and err.count("\n") == 1, err
    assert needle in err and "unknown drafter" not in err, err
    assert seconds < 2, f"{seconds:.1f} s: the check ran after something slow"
    assert not any(tmp_path.iterdir())  # no output folder claimed either


def test_a_missing_folder_is_not_called_an_unknown_drafter():
    with pytest.raises(argparse.ArgumentTypeError, match="no such drafter folder: './runs/dspark/drafter'"):
        argtypes.drafter_spec("./runs/dspark/drafter")
    with pytest.raises(argparse.ArgumentTypeError, match="neither a registered drafter"):
        argtypes.drafter_spec("dspak")  # a typo of a name, not a path


def test_prompt_set_names_pass_and_missing_files_do_not(tmp_path):
    (tmp_path / "p.jsonl").write_text("{}")
    for text in ("math,code", "gsm8k,hf:openai/gsm8k:test", str(tmp_path / "p.jsonl")):
        assert argtypes.prompt_sets(text) == text  # names and hf: sets are left to the loader
    with pytest.raises(argparse.ArgumentTypeError, match="no such prompt file"):
        argtypes.prompt_sets(f"math,{tmp_path / 'q.jsonl'}")


def test_one_prompt_set_is_a_name_an_hf_set_or_an_existing_file(tmp_path):
    (tmp_path / "p.jsonl").write_text("{}")
    for text in ("math", "gsm8k", "hf:openai/gsm8k:test", str(tmp_path / "p.jsonl")):
        assert argtypes.prompt_set(text) == text  # names and hf: sets are left to the loader
    for text in (str(tmp_path / "q.jsonl"), "q.jsonl", "runs/answers"):
        with pytest.raises(argparse.ArgumentTypeError, match="no such prompt file"):
            argtypes.prompt_set(text)


def test_training_data_is_the_tiny_corpus_or_an_existing_file(tmp_path):
    (tmp_path / "a.jsonl").write_text("{}")
    for text in ("tiny-corpus", str(tmp_path / "a.jsonl")):
        assert argtypes.training_data(text) == text
    with pytest.raises(argparse.ArgumentTypeError, match="no such data file"):
        argtypes.training_data("tiny-corpuss")  # a typo of the name is a missing file too
    with pytest.raises(argparse.ArgumentTypeError, match="a folder, not a JSONL file"):
        argtypes.training_data(str(tmp_path))


def test_what_exists_or_names_a_hub_model_passes(tmp_path):
    (tmp_path / "drafter").mkdir()
    (tmp_path / "file").write_text("x")
    assert argtypes.drafter_spec(str(tmp_path / "drafter")) == str(tmp_path / "drafter")
    assert argtypes.drafter_spec("dspark") == "dspark" and argtypes.drafter_spec("none") == "none"
    assert (
        argtypes.drafter_specs(f"ngram,mine={tmp_path / 'drafter'}") == f"ngram,mine={tmp_path / 'drafter'}"
    )
    for spec in ("tiny", "smollm2", "Qwen/Qwen3-8B", "gpt2", str(tmp_path)):
        assert argtypes.target_spec(spec) == spec  # names and hub ids are left to the loader
    with pytest.raises(argparse.ArgumentTypeError, match="a file, not a model folder"):
        argtypes.target_spec(str(tmp_path / "file"))
    with pytest.raises(argparse.ArgumentTypeError, match="a file, not a drafter folder"):
        argtypes.drafter_spec(str(tmp_path / "file"))


@pytest.mark.parametrize("text", ["0.5", "1", "1e-3"])
def test_top_p_takes_a_mass_in_zero_one(text):
    assert argtypes.probability(text) == float(text)


@pytest.mark.parametrize("text", ["0", "-0.1", "1.01", "nan", "inf", "x"])
def test_top_p_refuses_what_is_not_a_mass(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"\(0, 1\]"):
        argtypes.probability(text)
