"""The paper's figures as PNG files (matplotlib, Agg backend; no display needed).

Each function takes plain data (panel → series → values) and a path, draws one figure
and returns the path. Positions on the x axes count from 1 (draft k); ``None`` values
(no evidence) are left as gaps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dspark.calibration.metrics import PositionCalibration  # noqa: E402
from dspark.calibration.threshold import ThresholdSweep  # noqa: E402

Curves = Mapping[str, Mapping[str, Sequence[float | None]]]  # panel -> series -> values
_MARKERS = "osD^v<>ph*"


def _panels(n: int, *, width: float = 4.2, height: float = 3.4, sharey: bool = False):
    fig, axes = plt.subplots(1, max(n, 1), figsize=(width * max(n, 1), height), sharey=sharey, squeeze=False)
    return fig, list(axes[0])


def save_figure(fig, path: Path, *, rect: tuple[float, float, float, float] = (0, 0, 1, 1)) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _nan(values: Sequence[float | None]) -> list[float]:
    return [float("nan") if v is None else v for v in values]


def plot_position_curves(curves: Curves, path: Path, *, ylabel: str, title: str = "") -> Path:
    """One panel per key of ``curves``, one line per series over draft positions 1..K (paper Fig. 2)."""
    fig, axes = _panels(len(curves))
    for ax, (panel, series) in zip(axes, curves.items()):
        for i, (name, values) in enumerate(series.items()):
            ax.plot(range(1, len(values) + 1), _nan(values), marker=_MARKERS[i % len(_MARKERS)], label=name)
        ax.set_title(panel)
        ax.set_xlabel("draft position")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


def plot_grouped_bars(groups: Mapping[str, Mapping[str, float | None]], path: Path, *, ylabel: str) -> Path:
    """Bars per group (e.g. benchmark) and series (e.g. drafter): Table 1 as a figure."""
    names = list(dict.fromkeys(s for series in groups.values() for s in series))
    fig, (ax,) = _panels(1, width=max(4.5, 1.3 * len(groups) * max(1, len(names)) ** 0.5))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))]
        ys = [groups[g].get(name) for g in groups]
        bars = ax.bar(xs, _nan(ys), width, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(groups)), list(groups), rotation=20)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_histograms(hists: Mapping[str, Mapping[str, Sequence[int]]], path: Path) -> Path:
    """Share of rounds emitting 1..γ+1 tokens: one panel per domain, bars per drafter."""
    fig, axes = _panels(len(hists))
    for ax, (panel, series) in zip(axes, hists.items()):
        width = 0.8 / max(1, len(series))
        for i, (name, counts) in enumerate(series.items()):
            total = sum(counts) or 1
            xs = [t + 1 + (i - (len(series) - 1) / 2) * width for t in range(len(counts))]
            ax.bar(xs, [c / total for c in counts], width, label=name)
        ax.set_title(panel)
        ax.set_xlabel("tokens per round")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("share of rounds")
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)


def plot_threshold_sweep(sweeps: Mapping[str, ThresholdSweep], path: Path, *, title: str = "") -> Path:
    """Paper Fig. 5: accepted/rejected tokens per step (bars) and acceptance rate (line) vs threshold."""
    fig, axes = _panels(len(sweeps), sharey=True)
    for ax, (panel, sweep) in zip(axes, sweeps.items()):
        xs = sweep.thresholds
        step = (xs[1] - xs[0]) if len(xs) > 1 else 0.1
        ax.bar(xs, sweep.accepted_per_step, 0.8 * step, label="accepted tokens", color="tab:blue")
        ax.bar(
            xs,
            sweep.rejected_per_step,
            0.8 * step,
            bottom=sweep.accepted_per_step,
            label="rejected tokens",
            color="white",
            edgecolor="tab:red",
            hatch="//",
        )
        ax.set_title(f"{panel} ({sweep.num_rounds} rounds)")
        ax.set_xlabel("confidence threshold")
        rate_ax = ax.twinx()
        rate_ax.plot(xs, _nan(sweep.acceptance_rate), color="tab:green", marker="o", label="acceptance rate")
        rate_ax.set_ylim(0, 1.05)
        rate_ax.set_ylabel("acceptance rate")
    axes[0].set_ylabel("avg. tokens per step")
    handles = [h for a in (axes[0], rate_ax) for h in a.get_legend_handles_labels()[0]]
    fig.legend(handles, [h.get_label() for h in handles], loc="lower center", ncol=3, fontsize=8)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path, rect=(0, 0.08, 1, 1))


def plot_reliability(
    before: Sequence[PositionCalibration],
    after: Sequence[PositionCalibration],
    path: Path,
    *,
    positions: Sequence[int] | None = None,
) -> Path:
    """Paper Fig. 6: observed vs predicted survival per position, before and after STS."""
    positions = positions or [p.position for p in before]
    fig, axes = _panels(len(positions), width=3.6, height=3.6, sharey=True)
    for ax, k in zip(axes, positions):
        b, a = before[k - 1], after[k - 1]
        counts = a.reliability.count
        edges = a.reliability.edges
        total = max(1, sum(counts))
        hist_ax = ax.twinx()  # the sample-count histogram in the background
        hist_ax.bar(edges[:-1], [c / total for c in counts], edges[1] - edges[0], align="edge", color="0.9")
        hist_ax.set_ylim(0, 2.5 * max(c / total for c in counts) if any(counts) else 1)  # lower third
        hist_ax.set_yticks([])
        ax.set_zorder(hist_ax.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
        for cal, name, color in ((b, "before", "tab:red"), (a, "after", "tab:blue")):
            pts = [
                (p, o)
                for p, o in zip(cal.reliability.mean_predicted, cal.reliability.observed)
                if p is not None
            ]
            ax.plot(
                [p for p, _ in pts], [o for _, o in pts], marker="o", ms=3, color=color, label=f"{name} STS"
            )
        auc = "n/a" if b.auc is None else f"{b.auc:.3f}"
        ax.set_title(f"position {k}\nECE {100 * b.ece:.1f}% → {100 * a.ece:.1f}%, AUC {auc}", fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("predicted survival")
    axes[0].set_ylabel("observed survival")
    axes[0].legend(fontsize=7, loc="upper left")
    return save_figure(fig, path)


def plot_sweep_lines(
    panels: Mapping[str, Mapping[str, Mapping[int, float]]], path: Path, *, xlabel: str, ylabel: str
) -> Path:
    """Paper Fig. 4: one panel per domain, one line per method over a swept integer (draft length)."""
    fig, axes = _panels(len(panels))
    for ax, (panel, series) in zip(axes, panels.items()):
        for i, (name, points) in enumerate(series.items()):
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], marker=_MARKERS[i % len(_MARKERS)], label=name)
            ax.set_xticks(xs)
        ax.set_title(panel)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)
