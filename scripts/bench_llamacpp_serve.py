"""Issue 35: what dspark's drafters do for llama.cpp's users, measured with llama.cpp's own binaries.

For each target GGUF (SmolLM2's pinned Q4_1 and the Q8_0 / BF16 / F32 files llama-quantize
makes from it; or the tiny target's F32 GGUF and its quantizations), each thread count and
temperature, on held-out prompt sets, one process per prompt, methods interleaved prompt by
prompt so that the shared machine's drift weighs on all alike:

- ``plain``: ``llama-completion`` (decoding speed from its own eval timer);
- ``lookup``: ``llama-speculative-simple --spec-type ngram-simple`` (prompt lookup);
- ``dspark p=P``: ``llama-speculative-simple -md draft.gguf --spec-type draft-dspark
  --spec-draft-p-min P`` with a ``dspark export --format gguf`` folder.

τ = emitted tokens / target verification steps; tokens/s over decoding only (prompt
processing excluded on every side). ``llama-bench -p k -n 64`` gives the cost of verifying
k tokens in one batch against one decode step (``k · tg / pp_k``) per quantization, and
with it the τ a drafter needs to pay: τ > cost(γ + 1) + draft cost, in decode steps. Run::

    B=$(bash .ci/llamacpp_build.sh | tail -1)
    dspark export --format gguf --target smollm2 --drafter dspark --out /tmp/sm-gguf
    PYTHONPATH=. python scripts/bench_llamacpp_serve.py --bin $B --export /tmp/sm-gguf \\
        --quants q4_1,q8_0,bf16 --threads 1,2 --temps 0,1 --limit 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path

from tests.interop import llamacpp

log = logging.getLogger("bench_llamacpp_serve")
SETS = {"gsm8k": "math", "humaneval": "code"}  # held-out: no drafter trained on them
QUANT_TYPES = {"q8_0": "Q8_0", "bf16": "BF16", "f32": "F32", "q4_1": "Q4_1"}
VERIFY_K = (1, 2, 4, 8)


def quantized(bin_dir: Path, source: Path, quant: str, source_quant: str) -> Path:
    """``source`` re-quantized to ``quant`` with llama-quantize (cached beside it)."""
    if quant == source_quant:
        return source
    out = source.with_name(f"{source.stem}.{quant}.gguf")
    if not out.is_file():
        subprocess.run(
            [str(bin_dir / "llama-quantize"), "--allow-requantize", str(source), str(out), QUANT_TYPES[quant]],  # noqa: E501
            check=True, capture_output=True,
        )  # fmt: skip
    return out


def verify_costs(bin_dir: Path, model: Path, threads: int) -> dict:
    """Decode tokens/s and the cost of processing k tokens in one batch, in decode steps."""
    done = subprocess.run(
        [
            str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads), "-o", "json", "-r", "3",
            "-p", ",".join(str(k) for k in VERIFY_K), "-n", "64",
        ],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    rows = json.loads(done.stdout)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0)
    pp = {r["n_prompt"]: r["avg_ts"] for r in rows if r["n_prompt"] > 0}
    return {"decode_tps": tg, "cost": {k: k * tg / pp[k] for k in VERIFY_K}}


def prompts(tokenizer_folder: Path | None, sets: list[str], limit: int) -> list[tuple[str, str]]:
    """(set, prompt text through the chat template) of the first ``limit`` prompts of each set."""
    from transformers import AutoTokenizer

    from dspark.data.chat import prompt_ids
    from dspark.data.prompts import load_prompts

    tok = AutoTokenizer.from_pretrained(tokenizer_folder)
    out = []
    for name in sets:
        records = load_prompts(name, limit=limit)
        out += [(name, tok.decode(prompt_ids(tok, r), skip_special_tokens=False)) for r in records]
    return out


def run_cell(bin_dir, model, draft, texts, args, threads, temp, p_mins) -> dict:
    """Every method over ``texts``, interleaved prompt by prompt: totals per method."""
    methods = ["plain", "lookup", *(f"dspark p={p:g}" for p in p_mins)]
    tally = {m: {"tokens": 0, "seconds": 0.0, "rounds": 0, "accepted": 0, "drafted": 0} for m in methods}
    for i, (_, text) in enumerate(texts):
        order = methods[i % len(methods) :] + methods[: i % len(methods)]
        for m in order:
            t = tally[m]
            if m == "plain":
                r = llamacpp.plain_run(bin_dir, model, text, args.max_tokens, threads=threads, temp=temp)
                t["tokens"] += r.n_decoded
                t["seconds"] += r.decode_s
                t["rounds"] += r.n_decoded
                continue
            kw = {"threads": threads, "temp": temp, "n_max": args.block_size}
            if m == "lookup":
                r = llamacpp.speculative(
                    bin_dir, model, None, text, args.max_tokens, spec_type="ngram-simple", **kw
                )
            else:
                p = float(m.split("=")[1])
                r = llamacpp.speculative(bin_dir, model, draft, text, args.max_tokens, p_min=p, **kw)
            t["tokens"] += r.n_predict
            t["seconds"] += r.decode_s
            t["rounds"] += r.rounds
            t["accepted"] += r.n_accept
            t["drafted"] += r.n_drafted
    plain_tps = tally["plain"]["tokens"] / tally["plain"]["seconds"]
    return {
        m: {
            **t,
            "tau": t["tokens"] / t["rounds"],
            "tps": t["tokens"] / t["seconds"],
            "speedup": t["tokens"] / t["seconds"] / plain_tps,
        }
        for m, t in tally.items()
    }


def dspark_engine(target_name: str, drafter_source: str, texts, args, threads: int) -> dict:
    """dspark's own engine on the same prompts and drafter, greedy, batch 1, as ``dspark
    generate`` runs it (payoff control on, γ = ``--block-size``), and its plain decoding;
    tokens/s over the whole generate call (its prefill is a small share at these lengths)."""
    import time

    import torch

    from dspark.commands.loading import load_target
    from dspark.engine import Engine, EngineConfig
    from dspark.formats.build import build_drafter
    from dspark.protocols import SamplingParams

    torch.set_num_threads(threads)
    target = load_target(target_name, dtype=getattr(torch, args.dspark_dtype))
    ids = [target.tokenizer.encode(t, add_special_tokens=False) for _, t in texts]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    out = {}
    for label, drafter, payoff in (
        ("dspark engine plain", None, False),
        ("dspark engine", drafter_source, True),
    ):
        d = build_drafter(drafter, target) if drafter else None
        config = EngineConfig(block_size=args.block_size if d else 0, max_batch=1, payoff=payoff)
        engine = Engine(target, d, config)
        engine.generate([ids[0]], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
        tokens = rounds = 0
        started = time.perf_counter()
        for x in ids:
            (res,) = engine.generate([x], params)
            tokens += len(res.token_ids)
            rounds += len(res.rounds)
        seconds = time.perf_counter() - started
        out[label] = {
            "tokens": tokens,
            "seconds": seconds,
            "rounds": rounds,
            "tau": tokens / rounds,
            "tps": tokens / seconds,
        }
    return out


def markdown(results: list[dict]) -> str:
    lines = [
        "| target | threads | T | method | τ | tokens/s | × plain |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for cell in results:
        for m, r in cell["methods"].items():
            lines.append(
                f"| {cell['quant']} | {cell['threads']} | {cell['temp']:g} | {m} | {r['tau']:.2f} | "
                f"{r['tps']:.1f} | {r['speedup']:.2f} |"
            )
    lines += ["", "| target | threads | decode tok/s | " + " | ".join(f"cost({k})" for k in VERIFY_K) + " |"]
    lines.append("|---|---:|---:|" + "---:|" * len(VERIFY_K))
    for c in {(c["quant"], c["threads"]): c for c in results}.values():
        v = c["verify"]
        lines.append(
            f"| {c['quant']} | {c['threads']} | {v['decode_tps']:.1f} | "
            + " | ".join(f"{v['cost'][k]:.2f}" for k in VERIFY_K)
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", type=Path, required=True, help="llama.cpp's bin folder (.ci/llamacpp_build.sh)")
    p.add_argument("--export", type=Path, required=True, help="a `dspark export --format gguf` folder")
    p.add_argument("--quants", default="q4_1", help="target files: q4_1 (SmolLM2's own), q8_0, bf16, f32")
    p.add_argument("--threads", default="1")
    p.add_argument("--temps", default="0")
    p.add_argument("--p-mins", default="0,0.5", help="--spec-draft-p-min values for the drafter")
    p.add_argument("--sets", default="gsm8k,humaneval")
    p.add_argument("--limit", type=int, default=4, help="prompts per set")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--block-size", type=int, default=7)
    p.add_argument("--dspark-engine", action="store_true", help="also dspark's own engine (greedy runs)")
    p.add_argument("--dspark-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    manifest = json.loads((args.export / "dspark_export.json").read_text())
    source = Path(manifest["target_gguf"])
    source_quant = "q4_1" if "Q4_1" in source.name else "f32"
    folder = Path(manifest["target"])
    texts = prompts(folder, args.sets.split(","), args.limit)
    results = []
    for quant in args.quants.split(","):
        model = quantized(args.bin, source, quant, source_quant)
        for threads in (int(t) for t in args.threads.split(",")):
            verify = verify_costs(args.bin, model, threads)
            log.info("%s, %d threads: %s", quant, threads, verify)
            for temp in (float(t) for t in args.temps.split(",")):
                p_mins = [float(x) for x in args.p_mins.split(",")]
                methods = run_cell(
                    args.bin, model, args.export / "draft.gguf", texts, args, threads, temp, p_mins
                )
                cell = {
                    "quant": quant,
                    "threads": threads,
                    "temp": temp,
                    "verify": verify,
                    "methods": methods,
                }
                results.append(cell)
                log.info("%s", json.dumps(cell))
    engine = None
    if args.dspark_engine:
        threads = int(args.threads.split(",")[0])
        engine = dspark_engine(str(folder), manifest["source"], texts, args, threads)
        log.info("dspark engine, %d threads: %s", threads, json.dumps(engine))
    print(markdown(results))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "manifest": manifest,
                    "args": vars(args) | {"bin": str(args.bin)},
                    "results": results,
                    "dspark_engine": engine,
                },
                default=str,
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
