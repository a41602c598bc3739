"""The batch-1 decode benchmark: every method decodes the same tokens (greedy is lossless)."""

from dspark.data.prompts import load_prompts
from dspark.drafters.ngram import NgramDrafter
from dspark.eval.decode_bench import HF_ASSISTED, HF_METHOD, HF_PROMPT_LOOKUP, bench_decode
from dspark.presets.tiny import tiny_target_dir
from dspark.targets import TargetAdapter


def test_all_methods_agree_and_ratios_are_relative_to_hf():
    target = TargetAdapter.from_pretrained(tiny_target_dir())
    prompts = load_prompts("math", 2)
    result = bench_decode(
        target,
        prompts,
        {"none": None, "ngram": NgramDrafter(target.vocab_size)},
        max_tokens=12,
        hf_prompt_lookup=4,
        hf_assistant=target.model,
    )
    assert list(result.methods) == [HF_METHOD, HF_PROMPT_LOOKUP, HF_ASSISTED, "none", "ngram"]
    assert all(result.identical_outputs(m) for m in result.methods)
    assert result.speedup(HF_METHOD) == 1.0
    assert result.methods["none"].tau == 1.0 and result.methods["ngram"].tau >= 1.0
