"""``dspark bench llamacpp``'s own logic without llama.cpp: methods interleaved prompt by prompt,
totals and ratios per method, the tables, the figure, and one-line errors."""

from __future__ import annotations

import json

import pytest

from dspark.bench import llamacpp_serve as bench
from dspark.bench.llamacpp import LlamacppError, PlainRun, SpecRun, _generated
from dspark.cli import main
from dspark.errors import DsparkError


def _fake_runs(monkeypatch, calls):
    def plain_run(bin_dir, model, text, max_tokens, *, threads, temp):
        calls.append(("plain", text))
        return PlainRun(text="x", n_decoded=10, decode_s=1.0)  # 10 tokens/s

    def speculative(bin_dir, model, draft, text, max_tokens, *, spec_type="draft-dspark", p_min=0.0, **kw):
        calls.append((spec_type if draft is None else f"dspark p={p_min:g}", text))
        # 10 tokens in 5 rounds (5 accepted of 8 drafted), twice plain's speed
        return SpecRun(text="x", n_predict=10, n_drafted=8, n_accept=5, decode_s=0.5)

    monkeypatch.setattr(bench, "plain_run", plain_run)
    monkeypatch.setattr(bench, "speculative", speculative)


def test_methods_alternate_their_order_and_are_totalled(monkeypatch, tmp_path):
    calls = []
    _fake_runs(monkeypatch, calls)
    config = bench.LlamacppConfig(p_mins=(0.5,))
    texts = [("gsm8k", "a"), ("gsm8k", "b")]
    cell = bench.run_cell(tmp_path, tmp_path / "m.gguf", tmp_path / "d.gguf", texts, config, 1, 0.0)
    # the second prompt starts with the second method: drift weighs on all methods alike
    assert [m for m, t in calls if t == "a"] == ["plain", "ngram-simple", "dspark p=0.5"]
    assert [m for m, t in calls if t == "b"] == ["ngram-simple", "dspark p=0.5", "plain"]
    assert cell["plain"]["speedup"] == pytest.approx(1.0) and cell["plain"]["tau"] == pytest.approx(1.0)
    assert cell["dspark p=0.5"]["speedup"] == pytest.approx(2.0)
    assert cell["dspark p=0.5"]["tau"] == pytest.approx(2.0)  # 20 tokens over 10 verification steps
    assert cell["lookup"]["accepted"] == 10 and cell["lookup"]["drafted"] == 16


def test_markdown_has_a_row_per_method_and_the_verify_costs():
    methods = {
        "plain": {"tau": 1.0, "tps": 10.0, "speedup": 1.0},
        "lookup": {"tau": 1.5, "tps": 12.0, "speedup": 1.2},
    }
    verify = {"decode_tps": 10.0, "cost": {k: float(k) for k in bench.VERIFY_K}}
    cell = {"quant": "q4_1", "threads": 2, "temp": 0.0, "verify": verify, "methods": methods}
    text = bench.markdown([cell])
    assert "| q4_1 | 2 | 0 | lookup | 1.50 | 12.0 | 1.20 |" in text
    assert "| q4_1 | 2 | 10.0 | 1.00 | 2.00 | 4.00 | 8.00 |" in text


def test_the_figure_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    verify = {"decode_tps": 10.0, "cost": {str(k): float(k) for k in bench.VERIFY_K}}
    methods = {"plain": {"speedup": 1.0}, "dspark p=0": {"speedup": 0.7}}
    cell = {"quant": "q4_1", "threads": 1, "temp": 0.0, "verify": verify, "methods": methods}
    run = {"manifest": {"target": "/x/smollm2-135m"}, "results": [cell]}
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert main(["bench", "llamacpp-plot", str(tmp_path / "run.json"), "--out", str(tmp_path / "f.png")]) == 0
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"


def test_unknown_target_file_type_is_refused():
    with pytest.raises(DsparkError, match="q3_k"):
        bench.LlamacppConfig(quants=("q3_k",))


def test_a_folder_that_is_not_an_export_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "llamacpp", "--bin", str(tmp_path), "--export", str(tmp_path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "not a `dspark export --format gguf` folder" in err
    assert err.count("\n") == 1


def test_a_missing_prompt_echo_is_an_error_not_an_assert():
    assert _generated("the prompt and more", "the prompt") == " and more"
    with pytest.raises(LlamacppError, match="not echoed"):
        _generated("something else", "the prompt")
