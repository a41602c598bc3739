"""Peak RSS of one DSpark training step at Qwen3's vocabulary: dense vs chunked objective (issue 14).

A random-init Qwen3-shaped target (V = 151,936, ``--hidden``, 2 layers) and a 1-layer
DSpark drafter (γ = 7, Markov rank 64); one sequence of ``--tokens`` tokens, all of the
answer supervised; ``--anchors`` blocks. Each configuration runs in its own subprocess
(peak RSS = ``ru_maxrss`` of that process): the target forward, the drafter forward, the
loss and the backward. ``dense`` materializes the ``[1, A, K, V]`` logits before the loss
(the path every drafter took before); ``chunked`` gives the loss the factors only.

    python scripts/bench_train_memory.py --hidden 1024 --tokens 1024 --anchors 32,128,512

A configuration whose predicted peak (:func:`predicted_mb`) exceeds ``--max-predicted-gb``
is not run (the machine is shared: an out-of-memory kill could take other jobs with it);
its row says "not run: predicted N GB".
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

V = 151_936
# Fitted on the measured hidden-1024, 1,024-token rows (BENCHMARKS.md, issue 14): above the fp32
# weights (and gradients), ≈ 360 MB of runtime, the chunked loss's capped V-sized working set
# (its 512 MB budget), then 0.95 MB per anchor chunked (the [K, H] slots' states and gradients,
# ∝ H) or 29.6 MB per anchor dense (≈ 4.6 fp32 [K = 7, V] tensors on top). The sequence length
# enters only through small [T, H] activations, not modelled: the 2,048-token rows measure it.
_RUNTIME_MB, _CHUNK_MB = 360.0, 512.0
_PER_ANCHOR_MB = {"chunked": 0.95, "dense": 28.65}  # dense: its V-sized part, plus the chunked part


def weights_mb(hidden: int) -> float:
    """fp32 weights of the benchmark's models, plus the gradients of the trainable ones."""
    layer = 11.5 * hidden**2  # q, o: H²; k, v: H²/4 each; MLP 3 × H × 3H
    frozen = 3 * V * hidden + 2 * layer  # target's tied embedding, drafter's embedding + head; 2 layers
    trainable = layer + 2 * hidden**2 + 2 * V * 64  # 1 draft layer, fc of 2 feature layers, Markov W1/W2
    return 4 * (frozen + 2 * trainable) / 2**20


def predicted_mb(mode: str, hidden: int, tokens: int, anchors: int) -> float:
    """Predicted peak RSS (MB) of one configuration (``tokens`` is not modelled, see above)."""
    per_anchor = _PER_ANCHOR_MB["chunked"] * hidden / 1024
    per_anchor += _PER_ANCHOR_MB["dense"] if mode == "dense" else 0.0
    chunk = _CHUNK_MB if mode == "chunked" else 0.0
    return weights_mb(hidden) + _RUNTIME_MB + chunk + per_anchor * anchors


def child(ns: argparse.Namespace) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
    from dspark.protocols import TrainOutput
    from dspark.targets import TargetAdapter
    from dspark.training import online

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=151_936,
        hidden_size=ns.hidden,
        intermediate_size=3 * ns.hidden,
        num_hidden_layers=2,
        num_attention_heads=ns.hidden // 128,
        num_key_value_heads=max(1, ns.hidden // 512),
        head_dim=128,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    target = TargetAdapter(Qwen3ForCausalLM(cfg).eval(), target_layer_ids=(-1, 0))
    drafter = DSparkDrafter.from_target(
        target, DSparkConfig(num_layers=1, block_size=7, mask_token_id=151_935, markov_rank=64)
    ).train()
    ids = torch.randint(0, 151_000, (1, ns.tokens))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, :16] = False
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    batch = online.target_batch(
        target, ids, mask, num_anchors=ns.anchor_count, generator=torch.Generator().manual_seed(0)
    )
    out = drafter.forward_train(batch)
    if ns.mode == "dense":
        out = TrainOutput(
            labels=out.labels,
            valid=out.valid,
            logits=out.factors.draft_logits(),
            target_logits=out.factors.target_logits(),
            confidences=out.confidences,
        )
    loss = drafter.loss(out).loss
    loss.backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mb": peak / 1024, "before_mb": base / 1024, "s": time.perf_counter() - started}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--anchors", default="32,128,512")
    ap.add_argument("--modes", default="dense,chunked")
    ap.add_argument(
        "--max-predicted-gb", type=float, default=12.0, help="skip configurations predicted above"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--anchor-count", type=int, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        return child(ns)
    print(f"hidden {ns.hidden}, {ns.tokens} tokens, V = 151,936, 1 draft layer, γ = 7\n")
    print(
        "| anchors | "
        + " | ".join(f"{m} peak RSS (MB)" for m in ns.modes.split(","))
        + " | chunked / dense |"
    )
    print("|---:|" + "---:|" * (len(ns.modes.split(",")) + 1))
    for anchors in ns.anchors.split(","):
        peaks, cells = {}, []
        for mode in ns.modes.split(","):
            predicted = predicted_mb(mode, ns.hidden, ns.tokens, int(anchors)) / 1024
            if predicted > ns.max_predicted_gb:
                cells.append(f"not run: predicted {predicted:.1f} GB")
                continue
            cmd = [sys.executable, __file__, "--child", "--mode", mode, "--anchor-count", anchors]
            cmd += ["--hidden", str(ns.hidden), "--tokens", str(ns.tokens)]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode:
                raise SystemExit(run.stderr[-2000:])
            peaks[mode] = json.loads(run.stdout.strip().splitlines()[-1])["peak_mb"]
            cells.append(f"{peaks[mode]:,.0f} (predicted {predicted * 1024:,.0f})")
        ratio = f"{peaks['chunked'] / peaks['dense']:.2f}" if len(peaks) == 2 else "–"
        print(f"| {anchors} | " + " | ".join(cells) + f" | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
