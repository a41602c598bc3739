"""The tiny target's GGUF tokenizes real prompts to dspark's ids in llama.cpp (issue 35).

dspark writes the embedded tiny target as llama.cpp's ``gpt2`` vocabulary with the
``gpt-2`` pre-tokenizer (``formats/export/gguf_target.py``); a drafter is only served
right if llama.cpp feeds the target the ids the drafter was trained on, so this pins
``llama-tokenize`` against the HF tokenizer on every built-in prompt (through the chat
template, as dspark feeds them) and on raw texts with awkward whitespace and digits.
SmolLM2's own GGUF is checked the same way when its pinned file is cached.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.interop import llamacpp

AWKWARD = (
    "x = [1, 22, 333]\n\n\n    return  x  ",
    "Ünïcödé — naïve café 3.14159 × 10^-3\t\ttabs",
    "def f(a):\n\tif a:\n\t\treturn 'it''s'  # done\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    r"print('a\nb') and $\frac{1}{2} \overline{AB}$",  # backslashes stay text, as in LaTeX and code
)


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    return llamacpp.require_bin()


def _texts(tokenizer) -> list[tuple[str, list[int]]]:
    from dspark.data.chat import prompt_ids
    from dspark.data.prompts import load_prompts

    out = []
    for name in ("math", "code", "chat", "gsm8k", "humaneval", "mt-bench"):
        for prompt in load_prompts(name, limit=6):
            ids = prompt_ids(tokenizer, prompt)
            out.append((tokenizer.decode(ids, skip_special_tokens=False), ids))
    out += [(t, tokenizer.encode(t, add_special_tokens=False)) for t in AWKWARD]
    return out


def test_tiny_target_gguf_tokenizes_like_dspark(bin_dir, tmp_path):
    from transformers import AutoTokenizer

    from dspark.formats.export.gguf_target import write_target_gguf
    from dspark.presets.tiny import tiny_target_dir

    folder = Path(tiny_target_dir())
    model = write_target_gguf(folder, tmp_path / "tiny.gguf")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = _texts(tokenizer)
    assert len(texts) >= 20
    for text, ids in texts:
        assert llamacpp.tokenize(bin_dir, model, text) == ids, text[:120]


def test_smollm2_gguf_tokenizes_like_dspark_but_for_indented_digits(bin_dir):
    """dspark's SmolLM2 tokenizer is the one transformers rebuilds from the GGUF: GPT-2's regex.
    llama.cpp reads the GGUF's ``smollm`` pre-tokenizer, which splits a newline + indent before
    a digit otherwise (``"\\n    0"``: one token, then ``0``; GPT-2's regex leaves a space to the
    digit). Every other text gets the same ids; that one difference is pinned here."""
    from transformers import AutoTokenizer

    from dspark.targets.smollm2 import is_ready, smollm2_dir
    from dspark.user_cache import cache_root

    gguf = cache_root() / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not (gguf.is_file() and is_ready()):
        pytest.skip(
            "SmolLM2's pinned GGUF is not cached (dspark export --format gguf --target smollm2 fetches it)"
        )
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir())
    differ = 0
    for text, ids in _texts(tokenizer):
        theirs = llamacpp.tokenize(bin_dir, gguf, text)
        if theirs != ids:
            differ += 1
            i = next(k for k, (a, b) in enumerate(zip(theirs, ids, strict=False)) if a != b)
            run = tokenizer.decode(theirs[i : i + 1])  # llama.cpp: "\n" + the whole indent
            assert run.startswith("\n") and run.strip() == "" and tokenizer.decode(ids[i : i + 2]) == run, (
                text
            )
            assert tokenizer.decode(ids[i + 2 : i + 3]).isdigit(), text  # before a digit
    assert differ <= 4, differ
