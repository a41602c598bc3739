"""Interop: every method × format (a) parses with transformers.AutoConfig, (b) loads with
vLLM's own config classes, model class and load_weights, every parameter equal to the
file, (c) vLLM's modules agree with ours within 1e-4 fp32; SGLang / DeepSpec formats meet
the pinned expectations of their code; what an engine cannot represent is refused.

(b) and (c) run in the vLLM virtualenv that .ci/vllm_venv.sh builds; without it they skip
with the reason printed (the rest runs everywhere).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.interop.cases import DRAFTERS, export_all
from tests.interop.expectations import deepspec_problems, sglang_problems
from tests.interop.matrix import (
    PARITY_TOL,
    autoconfig_problem,
    build_rows,
    default_venv,
    markdown,
    venv_python,
)

REFUSED = {  # (drafter, format) -> the engine and reason the one-line error must name
    (
        "dspark-rnn",
        "vllm",
    ): "vLLM cannot load this drafter (--format vllm): Qwen3DSparkForCausalLM has no RNN",
    (
        "dspark-rnn",
        "speculators",
    ): "vLLM cannot load this drafter (--format speculators): Qwen3DSparkForCausalLM",
    ("dflash", "sglang"): "SGLang cannot load this drafter (--format sglang): its DSPARK algorithm requires",
    (
        "dspark-d2t",
        "sglang",
    ): "SGLang cannot load this drafter (--format sglang): this drafter proposes from a",
    (
        "dflash-d2t",
        "sglang",
    ): "SGLang cannot load this drafter (--format sglang): this drafter proposes from a",
    (
        "eagle3-d2t",
        "sglang",
    ): "SGLang cannot load this drafter (--format sglang): this drafter proposes from a",
    ("dspark-gemma2", "vllm"): "neither scale embeddings",
    ("dspark-gemma2", "sglang"): "neither scale embeddings",
    ("dspark-gemma2", "speculators"): "neither scale embeddings",
    ("dflash-unsorted-ids", "vllm"): "are not ascending",
    ("dflash-unsorted-ids", "sglang"): "are not ascending",
    ("dflash-unsorted-ids", "speculators"): "are not ascending",
    ("dflash-unsorted-ids", "hf"): "DeepSpec/vLLM cannot load this drafter",
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("interop")
    return root, export_all(root)


def test_every_case_is_exported_or_refused_as_expected(cases):
    _, all_cases = cases
    assert len(all_cases) == 4 * len(DRAFTERS)
    for c in all_cases:
        expected = REFUSED.get((c.drafter, c.fmt))
        if expected is None:
            assert c.folder is not None, f"{c.drafter} {c.fmt} refused: {c.refused}"
        else:
            assert c.refused is not None and expected in c.refused, (c.drafter, c.fmt, c.refused)
            assert "\n" not in c.refused


def test_every_export_parses_with_autoconfig(cases):
    _, all_cases = cases
    for c in all_cases:
        if c.folder is not None:
            assert autoconfig_problem(Path(c.folder)) is None, (c.drafter, c.fmt)


def test_sglang_and_deepspec_formats_meet_the_pinned_expectations(cases):
    _, all_cases = cases
    checked = 0
    for c in all_cases:
        if c.folder is None:
            continue
        folder = Path(c.folder)
        ids = json.loads((folder / "config.json").read_text())["target_layer_ids"]
        if c.fmt == "sglang":
            assert sglang_problems(folder, ids) == [], c.drafter
            checked += 1
        # DsparkFamilyDraftModel (read by dspark only): Gemma quirks, a reduced draft vocabulary
        own = c.drafter == "dspark-gemma2" or c.drafter.endswith("-d2t")
        if c.fmt == "hf" and c.method != "eagle3" and not own:
            assert deepspec_problems(folder) == [], c.drafter
            checked += 1
    assert checked >= 10


def test_the_old_export_layout_fails_the_checks(cases):
    """Negative control: the target's layer_types and an rnn_proj head are caught."""
    root, all_cases = cases
    folder = next(Path(c.folder) for c in all_cases if c.drafter == "dspark" and c.fmt == "hf")
    config = json.loads((folder / "config.json").read_text())
    config["layer_types"] = ["full_attention"] * 4  # the target's 4 layers, 2 draft layers
    bad = root / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(config))
    assert "layer_type" in autoconfig_problem(bad)
    (bad / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    assert any("layer_types" in p for p in deepspec_problems(bad))


def test_vllm_loads_every_export_and_matches_our_modules(tmp_path):
    python = venv_python()
    if python is None:
        reason = f"no vLLM venv at {default_venv()}; build it with `bash .ci/vllm_venv.sh`"
        print(f"SKIPPED vLLM interop: {reason}")
        pytest.skip(reason)
    rows, skipped = build_rows(tmp_path, python)
    assert skipped is None
    print("\n" + markdown(rows))
    bad = [r for r in rows if not r.ok]
    assert not bad, bad
    loaded = {(r.drafter, r.fmt) for r in rows if r.engine == "vLLM" and r.result == "loads exactly"}
    for drafter in (
        "dspark", "dspark-no-conf", "dflash", "eagle3", "eagle3-4-layers", "dspark-llama31-rope",
        "dspark-d2t", "dflash-d2t", "eagle3-d2t",
    ):  # fmt: skip
        assert {(drafter, "vllm"), (drafter, "speculators")} <= loaded, drafter
    parities = [r.parity for r in rows if r.parity is not None]
    assert len(parities) == len(loaded) and max(parities) <= PARITY_TOL
