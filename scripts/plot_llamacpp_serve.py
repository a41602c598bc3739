"""The figure of BENCHMARKS "llama.cpp serves dspark's drafters": speed over llama.cpp's plain
decoding per target file and method, from the JSON files of ``scripts/bench_llamacpp_serve.py``;
and verify-k cost against one decode step (left), which sets the τ a drafter needs.

    python scripts/plot_llamacpp_serve.py docs/llamacpp/*.json --out docs/llamacpp/speedup.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    cells = []
    for path in args.runs:
        data = json.loads(path.read_text())
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
