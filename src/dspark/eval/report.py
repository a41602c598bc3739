"""``results.json``, the plots and a Markdown report of an evaluation run (DESIGN §12).

The JSON holds every figure (``rows``: one object per drafter × benchmark; ``domains``:
macro averages; ``thresholds``: the Fig. 5 sweeps); the report embeds the plots and
lays the drafters side by side like the paper's Table 1.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dspark.conditions import markdown as conditions_markdown
from dspark.durable import write_atomic
from dspark.eval import plots
from dspark.eval.metrics import mean_defined
from dspark.eval.runner import PLAIN, EvalResult, EvalRow

DEFINITIONS = (
    "Definitions (docs/DESIGN.md §2): τ = tokens per round including the target's recovered/bonus token; "
    "prefix survival at k = rounds with ≥k accepted / rounds that proposed ≥k; conditional "
    "acceptance at k = rounds with ≥k accepted / rounds with ≥k−1 accepted and ≥k proposed; "
    "verify rate = accepted drafts / verified drafts; speedup = tokens/s over plain decoding of "
    "the same target on the same prompts in the same run."
)


def write_json(path: Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON, atomically (temp file, then rename)."""
    return write_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n", mkdir=True)


def _rounded(obj: Any, digits: int = 4) -> Any:
    if isinstance(obj, float):
        return round(obj, digits)
    if isinstance(obj, Mapping):
        return {k: _rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_rounded(v, digits) for v in obj]
    return obj


def result_json(result: EvalResult, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything of ``result`` as JSON-ready data (``meta``: target, drafter specs, ...)."""
    config = dataclasses.asdict(result.config)
    config["template_kwargs"] = dict(result.config.template_kwargs)
    return _rounded(
        {
            **(meta or {}),
            "config": config,
            "conditions": result.conditions.as_dict() if result.conditions else None,
            "rows": [dataclasses.asdict(r) for r in result.rows],
            "skipped_prompts": dict(result.skipped),  # benchmark -> prompts that did not fit the context
            "domains": [dataclasses.asdict(d) for d in result.domains],
            "thresholds": [
                {"drafter": t.drafter, "domain": t.domain, **dataclasses.asdict(t.sweep)}
                for t in result.thresholds
            ],
        }
    )


# -- Markdown helpers ----------------------------------------------------------------------------


def _fmt(v: float | None, digits: int = 2, pct: bool = False) -> str:
    if v is None:
        return "–"
    return f"{100 * v:.1f}%" if pct else f"{v:.{digits}f}"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _bold_best(cells: list[list[float | None]], fmt) -> list[list[str]]:
    """Format a drafters × columns grid, bolding the best value of each column."""
    best = (
        [max((c[j] for c in cells if c[j] is not None), default=None) for j in range(len(cells[0]))]
        if cells
        else []
    )
    return [
        [
            f"**{fmt(v)}**" if v is not None and v == best[j] and len(cells) > 1 else fmt(v)
            for j, v in enumerate(row)
        ]
        for row in cells
    ]


def _grid(
    rows: Sequence[EvalRow], drafters: list[str], benches: list[str], attr: str
) -> list[list[float | None]]:
    by = {(r.drafter, r.benchmark): getattr(r, attr) for r in rows}
    return [[by.get((d, b)) for b in benches] for d in drafters]


def tau_table(result: EvalResult) -> str:
    """Paper Table 1: τ per benchmark, grouped by domain, a macro mean per domain and overall."""
    drafters = [d for d in dict.fromkeys(r.drafter for r in result.rows) if d != PLAIN]
    domains = list(dict.fromkeys(r.domain for r in result.rows))
    benches = [
        b for dom in domains for b in dict.fromkeys(r.benchmark for r in result.rows if r.domain == dom)
    ]
    grid = _grid(result.rows, drafters, benches, "tau")
    dom_tau = {(d.drafter, d.domain): d.tau for d in result.domains}
    for row, name in zip(grid, drafters):
        row += [dom_tau.get((name, dom)) for dom in domains]
        row.append(mean_defined(row[: len(benches)]))
    header = ["drafter", *benches, *(f"{dom} (macro)" for dom in domains), "mean"]
    cells = _bold_best(grid, lambda v: _fmt(v, 2))
    return md_table(header, [[name, *c] for name, c in zip(drafters, cells)])


def speed_table(result: EvalResult) -> str:
    rows = [
        [
            r.drafter,
            r.benchmark,
            str(r.num_prompts),
            str(r.num_rounds),
            _fmt(r.tau),
            _fmt(r.verify_rate, pct=True),
            _fmt(r.verified_per_round),
            _fmt(r.tokens_per_s, 1),
            _fmt(r.speedup, 2) + ("×" if r.speedup is not None else ""),
        ]
        for r in result.rows
    ]
    header = [
        "drafter",
        "benchmark",
        "prompts",
        "rounds",
        "τ",
        "verify rate",
        "verified/round",
        "tokens/s",
        "speedup",
    ]
    return md_table(header, rows)


def position_table(result: EvalResult, attr: str) -> str:
    drafted = [d for d in result.domains if d.drafter != PLAIN]
    K = max((len(getattr(d, attr)) for d in drafted), default=0)
    rows = [
        [d.drafter, d.domain, *(_fmt(v, 3) for v in getattr(d, attr)), *["–"] * (K - len(getattr(d, attr)))]
        for d in drafted
    ]
    return md_table(["drafter", "domain", *(f"k={k}" for k in range(1, K + 1))], rows)


# -- the whole report --------------------------------------------------------------------------


def _drafted_domains(result: EvalResult, attr: str) -> dict[str, dict[str, list]]:
    curves: dict[str, dict[str, list]] = {}
    for d in result.domains:
        if d.drafter != PLAIN:
            curves.setdefault(d.domain, {})[d.drafter] = getattr(d, attr)
    return curves


def _pooled_histograms(result: EvalResult) -> dict[str, dict[str, list[int]]]:
    hists: dict[str, dict[str, list[int]]] = {}
    for r in result.rows:
        if r.drafter == PLAIN:
            continue
        h = hists.setdefault(r.domain, {}).setdefault(r.drafter, [0] * len(r.histogram))
        for i, c in enumerate(r.histogram):
            if i < len(h):
                h[i] += c
            else:
                h.append(c)
    return hists


REPORT_FILES = (
    "results.json", "report.md", "tau.png", "conditional_acceptance.png", "prefix_survival.png",
    "tokens_per_round.png",
)  # fmt: skip


def _threshold_plot(drafter: str) -> str:
    return f"threshold_{drafter}.png".replace("/", "_")


def report_files(drafters: Iterable[str]) -> tuple[str, ...]:
    """Every file :func:`write_eval_report` may write for these drafter labels (what ``--out`` claims)."""
    return (*REPORT_FILES, *(_threshold_plot(d) for d in drafters))


def write_eval_report(result: EvalResult, out: Path, meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``results.json``, the PNG plots and ``report.md`` into ``out``; returns the report path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", result_json(result, meta))
    cfg = result.config
    benches = list(dict.fromkeys(r.benchmark for r in result.rows))
    figures = []
    drafted = [r for r in result.rows if r.drafter != PLAIN]
    if drafted:
        groups = {b: {r.drafter: r.tau for r in drafted if r.benchmark == b} for b in benches}
        plots.plot_grouped_bars(groups, out / "tau.png", ylabel="acceptance length τ")
        plots.plot_position_curves(
            _drafted_domains(result, "conditional_acceptance"),
            out / "conditional_acceptance.png",
            ylabel="conditional acceptance",
        )
        plots.plot_position_curves(
            _drafted_domains(result, "prefix_survival"), out / "prefix_survival.png", ylabel="prefix survival"
        )
        plots.plot_histograms(_pooled_histograms(result), out / "tokens_per_round.png")
        figures = [
            ("Acceptance length per benchmark", "tau.png"),
            (
                "Position-wise conditional acceptance (paper Fig. 2), macro-averaged per domain",
                "conditional_acceptance.png",
            ),
            ("Prefix survival per position, macro-averaged per domain", "prefix_survival.png"),
            ("Tokens per round (pooled per domain)", "tokens_per_round.png"),
        ]
    for drafter in dict.fromkeys(t.drafter for t in result.thresholds):
        sweeps = {t.domain: t.sweep for t in result.thresholds if t.drafter == drafter}
        name = _threshold_plot(drafter)
        plots.plot_threshold_sweep(sweeps, out / name)
        figures.append((f"Confidence threshold sweep of {drafter} (paper Fig. 5)", name))

    meta = dict(meta or {})
    setup = [
        f"- target: `{meta.get('target', '?')}`",
        f"- drafters: {', '.join(f'`{k}` = `{v}`' for k, v in meta.get('drafters', {}).items()) or '–'}",
        f"- temperature {cfg.temperature}, max {cfg.max_tokens} new tokens, "
        f"{'all turns' if cfg.multi_turn else 'first turn'}, seed {cfg.seed} "
        "(same prompts and seeds for every method)",
        f"- block size: {cfg.block_size or 'each drafter its own'}; the engine, one request at a time, "
        "chain drafting, fixed-length verification",
    ]
    parts = [
        "# Speculative decoding evaluation",
        "\n".join(setup),
        DEFINITIONS,
        "## Acceptance length τ (paper Table 1)",
        tau_table(result) if drafted else "(no drafters)",
        "## Speed",
        conditions_markdown(result.conditions),
        speed_table(result),
        "## Conditional acceptance per position (macro-averaged per domain)",
        position_table(result, "conditional_acceptance") if drafted else "",
        "## Prefix survival per position (macro-averaged per domain)",
        position_table(result, "prefix_survival") if drafted else "",
    ]
    parts += [f"### {title}\n\n![{title}]({name})" for title, name in figures]
    path = out / "report.md"
    path.write_text("\n\n".join(p for p in parts if p) + "\n")
    return path
