"""The embedded tiny target through the real loading path, decoding and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from dspark.cli import main
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.decoding import speculative_generate
from dspark.drafters.ngram import NgramDrafter
from dspark.presets.tiny import tiny_target_dir
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter
from tests.unit.decoding.conftest import hf_greedy
from tests.unit.decoding.drafters_for_tests import RandomDrafter


@pytest.fixture(scope="module")
def tiny() -> TargetAdapter:
    return TargetAdapter.from_pretrained(tiny_target_dir())


def test_loads_like_a_hub_model(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir())
    tok = AutoTokenizer.from_pretrained(tiny_target_dir())
    assert model.config.model_type == "qwen3"
    assert tok.convert_tokens_to_ids("<|mask|>") < model.config.vocab_size
    assert tiny.eos_token_ids == (tok.convert_tokens_to_ids("<|im_end|>"),)
    assert sum(p.numel() for p in model.parameters()) < 15_000_000


@pytest.mark.parametrize("drafter_name", ["ngram", "random"])
def test_greedy_equals_hf_generate_for_256_tokens(tiny, drafter_name):
    prompt = prompt_ids(tiny.tokenizer, load_prompts("code", 1)[0])
    saved = tiny.eos_token_ids
    tiny.eos_token_ids = ()  # run the full length on both sides
    try:
        reference = hf_greedy(tiny, prompt, 260)
        drafter = NgramDrafter(tiny.vocab_size) if drafter_name == "ngram" else RandomDrafter(tiny.vocab_size)
        result = speculative_generate(tiny, drafter, prompt, SamplingParams(temperature=0.0, max_tokens=260))
    finally:
        tiny.eos_token_ids = saved
    assert result.token_ids == reference


def test_seeded_sampling_is_reproducible(tiny):
    prompt = prompt_ids(tiny.tokenizer, load_prompts("chat", 1)[0])
    params = SamplingParams(temperature=1.0, max_tokens=40, seed=11)
    a = speculative_generate(tiny, NgramDrafter(tiny.vocab_size), prompt, params).token_ids
    b = speculative_generate(tiny, NgramDrafter(tiny.vocab_size), prompt, params).token_ids
    assert a == b
    torch.manual_seed(0)  # the global RNG must not matter
    c = speculative_generate(tiny, NgramDrafter(tiny.vocab_size), prompt, params).token_ids
    assert a == c


def test_cli_generate_json(capsys):
    assert (
        main(
            [
                "generate",
                "--prompt",
                "Explain the assert statement in Python.",
                "--max-tokens",
                "24",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"text", "num_tokens", "tau", "tokens_per_s"}
    assert 1 <= out["num_tokens"] <= 24 and out["tau"] >= 1.0 and out["tokens_per_s"] > 0


def test_cli_generate_streams_text_and_reports_tau(capsys):
    assert (
        main(["generate", "--prompt", "Explain the assert statement in Python.", "--max-tokens", "16"]) == 0
    )
    captured = capsys.readouterr()
    assert captured.out.strip()
    assert "τ =" in captured.err and "tokens/s" in captured.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "/no/such/folder"], "no such model folder"),
        (["--drafter", "nonsense"], "neither a registered drafter"),
        (["--top-p", "1.5"], "--top-p: expected a number in (0, 1]"),
        (["--prompt", "word " * 3000], "context"),
    ],
)
def test_cli_user_errors_are_one_line(capsys, args, message):
    argv = ["generate", "--prompt", "hi", "--max-tokens", "4", *args]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_cli_bad_number_exits_without_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "dspark", "generate", "--prompt", "hi", "--max-tokens", "zero"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "positive integer" in proc.stderr and "Traceback" not in proc.stderr
