"""What dspark's drafters do for llama.cpp's users, measured with llama.cpp's own binaries.

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
    dspark bench llamacpp --bin $B --export /tmp/sm-gguf \\
        --quants q4_1,q8_0,bf16 --threads 1,2 --temps 0,1 --limit 4 --json out.json
    dspark bench llamacpp-plot out.json --out speedup.png
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer

from dspark.bench.llamacpp import plain_run, speculative
from dspark.data.chat import prompt_ids
from dspark.data.prompts import load_prompts
from dspark.engine import Engine, EngineConfig
from dspark.errors import DsparkError
from dspark.formats.build import build_drafter
from dspark.protocols import SamplingParams
from dspark.targets import TargetAdapter

log = logging.getLogger(__name__)
SETS = {"gsm8k": "math", "humaneval": "code"}  # held-out: no drafter trained on them
QUANT_TYPES = {"q8_0": "Q8_0", "bf16": "BF16", "f32": "F32", "q4_1": "Q4_1"}
VERIFY_K = (1, 2, 4, 8)


@dataclass(frozen=True, kw_only=True)
class LlamacppConfig:
    """What ``dspark bench llamacpp`` measures: target files, threads, temperatures, prompts."""

    quants: tuple[str, ...] = ("q4_1",)  # target files: q4_1 (SmolLM2's own), q8_0, bf16, f32
    threads: tuple[int, ...] = (1,)
    temps: tuple[float, ...] = (0.0,)
    p_mins: tuple[float, ...] = (0.0, 0.5)  # --spec-draft-p-min values for the drafter
    sets: tuple[str, ...] = ("gsm8k", "humaneval")
    limit: int = 4  # prompts per set
    max_tokens: int = 96
    block_size: int = 7
    dspark_engine: bool = False  # also dspark's own engine (greedy runs)
    dspark_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if unknown := set(self.quants) - set(QUANT_TYPES):
            raise DsparkError(
                f"unknown target file type(s) {sorted(unknown)}: not one of {sorted(QUANT_TYPES)}"
            )


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
    tok = AutoTokenizer.from_pretrained(tokenizer_folder)
    out = []
    for name in sets:
        records = load_prompts(name, limit=limit)
        out += [(name, tok.decode(prompt_ids(tok, r), skip_special_tokens=False)) for r in records]
    return out


def run_cell(bin_dir, model, draft, texts, config: LlamacppConfig, threads: int, temp: float) -> dict:
    """Every method over ``texts``, interleaved prompt by prompt: totals per method."""
    methods = ["plain", "lookup", *(f"dspark p={p:g}" for p in config.p_mins)]
    tally = {m: {"tokens": 0, "seconds": 0.0, "rounds": 0, "accepted": 0, "drafted": 0} for m in methods}
    for i, (_, text) in enumerate(texts):
        order = methods[i % len(methods) :] + methods[: i % len(methods)]
        for m in order:
            t = tally[m]
            if m == "plain":
                r = plain_run(bin_dir, model, text, config.max_tokens, threads=threads, temp=temp)
                t["tokens"] += r.n_decoded
                t["seconds"] += r.decode_s
                t["rounds"] += r.n_decoded
                continue
            kw = {"threads": threads, "temp": temp, "n_max": config.block_size}
            if m == "lookup":
                r = speculative(bin_dir, model, None, text, config.max_tokens, spec_type="ngram-simple", **kw)
            else:
                p = float(m.split("=")[1])
                r = speculative(bin_dir, model, draft, text, config.max_tokens, p_min=p, **kw)
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


def dspark_engine(target_name: str, drafter_source: str, texts, config: LlamacppConfig, threads: int) -> dict:
    """dspark's own engine on the same prompts and drafter, greedy, batch 1, as ``dspark
    generate`` runs it (payoff control on, γ = ``--block-size``), and its plain decoding;
    tokens/s over the whole generate call (its prefill is a small share at these lengths)."""
    torch.set_num_threads(threads)
    target = TargetAdapter.from_pretrained(target_name, dtype=getattr(torch, config.dspark_dtype))
    ids = [target.tokenizer.encode(t, add_special_tokens=False) for _, t in texts]
    params = SamplingParams(temperature=0.0, max_tokens=config.max_tokens)
    out = {}
    for label, drafter, payoff in (
        ("dspark engine plain", None, False),
        ("dspark engine", drafter_source, True),
    ):
        d = build_drafter(drafter, target) if drafter else None
        engine_config = EngineConfig(block_size=config.block_size if d else 0, max_batch=1, payoff=payoff)
        engine = Engine(target, d, engine_config)
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
    """Two tables: τ, tokens/s and speed over plain per cell and method; verify costs per file."""
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


def run_llamacpp(bin_dir: Path, export: Path, config: LlamacppConfig) -> dict:
    """Every cell (target file × threads × temperature) of ``config`` for the drafter exported in
    ``export`` (a ``dspark export --format gguf`` folder): the JSON that ``--json`` writes."""
    manifest = json.loads((export / "dspark_export.json").read_text())
    source = Path(manifest["target_gguf"])
    source_quant = "q4_1" if "Q4_1" in source.name else "f32"
    folder = Path(manifest["target"])
    texts = prompts(folder, list(config.sets), config.limit)
    results = []
    for quant in config.quants:
        model = quantized(bin_dir, source, quant, source_quant)
        for threads in config.threads:
            verify = verify_costs(bin_dir, model, threads)
            log.info("%s, %d threads: %s", quant, threads, verify)
            for temp in config.temps:
                methods = run_cell(bin_dir, model, export / "draft.gguf", texts, config, threads, temp)
                cell = {
                    "quant": quant,
                    "threads": threads,
                    "temp": temp,
                    "verify": verify,
                    "methods": methods,
                }
                results.append(cell)
                log.info("%s", json.dumps(results[-1]))
    engine = None
    if config.dspark_engine:
        threads = config.threads[0]
        engine = dspark_engine(str(folder), manifest["source"], texts, config, threads)
        log.info("dspark engine, %d threads: %s", threads, json.dumps(engine))
    return {
        "manifest": manifest,
        "args": dataclasses.asdict(config) | {"bin": str(bin_dir), "export": str(export)},
        "results": results,
        "dspark_engine": engine,
    }


def plot_runs(runs: list[dict], out: Path) -> None:
    """The figure of BENCHMARKS' llama.cpp section from :func:`run_llamacpp`'s JSON files: speed over
    llama.cpp's plain decoding per target file and method (right), and verify-k cost against one
    decode step (left), which sets the τ a drafter needs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = []
    for data in runs:
        name = Path(data["manifest"]["target"]).name.split("-")[0]
        cells += [(name, c) for c in data["results"]]
    fig, (ax_cost, ax) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1, 2]})
    seen = set()
    for name, c in cells:
        key = (name, c["quant"], c["threads"])
        if key in seen:
            continue
        seen.add(key)
        cost = c["verify"]["cost"]
        ks = sorted(int(k) for k in cost)
        ax_cost.plot(
            ks,
            [cost[str(k)] if str(k) in cost else cost[k] for k in ks],
            marker="o",
            label=" ".join(map(str, key)) + "t",
        )
    ax_cost.plot([1, 8], [1, 8], ls=":", color="grey", label="k steps")
    ax_cost.set(
        xlabel="tokens verified in one batch (k)",
        ylabel="cost / one decode step",
        title="llama.cpp verify cost",
    )
    ax_cost.legend(fontsize=7)
    labels, methods = [], sorted({m for _, c in cells for m in c["methods"] if m != "plain"})
    for name, c in cells:
        labels.append(f"{name}\n{c['quant']} {c['threads']}t T={c['temp']:g}")
    width = 0.8 / max(1, len(methods))
    for j, m in enumerate(methods):
        xs = [i + j * width for i in range(len(cells))]
        ys = [c["methods"].get(m, {}).get("speedup", 0) for _, c in cells]
        ax.bar(xs, ys, width, label=m)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(1.3, color="grey", lw=0.8, ls="--")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cells))], labels, fontsize=7)
    ax.set(ylabel="× llama.cpp plain decoding (tokens/s)", title="llama.cpp + dspark drafters")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
