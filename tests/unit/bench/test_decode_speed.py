"""The batch-1 decode benchmark: every method decodes the same tokens (greedy is lossless)."""

from dspark.bench.decode_speed import HF_ASSISTED, HF_METHOD, HF_PROMPT_LOOKUP, batch1_engine, bench_decode
from dspark.data.prompts import load_prompts
from dspark.drafters.ngram import NgramDrafter
from dspark.presets.tiny import tiny_target_dir
from dspark.targets import TargetAdapter


def test_all_methods_agree_and_ratios_are_relative_to_hf():
    target = TargetAdapter.from_pretrained(tiny_target_dir())
    prompts = load_prompts("math", 2)
    ngram = NgramDrafter(target.vocab_size)
    result = bench_decode(
        target,
        prompts,
        {"none": None, "ngram": ngram},
        max_tokens=12,
        hf_prompt_lookup=4,
        hf_assistant=target.model,
        engines={
            "ngram@fixed": batch1_engine(target, ngram, "fixed", block_size=7),
            "ngram@threshold:0.3": batch1_engine(target, ngram, "threshold:0.3", block_size=7),
        },
    )
    names = [HF_METHOD, HF_PROMPT_LOOKUP, HF_ASSISTED, "none", "ngram", "ngram@fixed", "ngram@threshold:0.3"]
    assert list(result.methods) == names
    assert all(result.identical_outputs(m) for m in result.methods)
    assert result.speedup(HF_METHOD) == 1.0
    assert result.methods["none"].tau == 1.0 and result.methods["ngram"].tau >= 1.0
    # through the engine: same tokens (checked above), rounds counted the same way
    for name in ("ngram@fixed", "ngram@threshold:0.3"):
        s = result.methods[name]
        assert s.tokens == 24 and 1.0 <= s.tau <= 8.0 and s.rounds + s.accepted == s.tokens
