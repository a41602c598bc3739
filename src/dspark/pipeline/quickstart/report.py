"""``report.md`` of a quickstart run: every number comes from the stage summaries of the run."""

from __future__ import annotations

import datetime
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from dspark.conditions import RunConditions, machine_busy
from dspark.conditions import markdown as conditions_markdown
from dspark.eval.report import md_table
from dspark.pipeline.presets import DOMAINS, METHODS, QuickstartPlan
from dspark.pipeline.quickstart import comparison
from dspark.pipeline.quickstart.references import is_reference
from dspark.pipeline.quickstart.verdicts import (
    BEYOND_TAU,
    BEYOND_TAU_NOTE,
    calibration_verdict,
    speed_verdict,
    speedup_cell,
)
from dspark.pipeline.stages import StageLog

PLAIN = "none"


def _f(v: float | None, digits: int = 2, suffix: str = "") -> str:
    return "–" if v is None else f"{v:.{digits}f}{suffix}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f} %"


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def eval_tables(rows: list[dict[str, Any]]) -> tuple[str, dict[str, dict[str, float | None]]]:
    """The Table-1-style τ/speedup table (one row per drafter) and the per-drafter means."""
    by = {(r["drafter"], r["domain"]): r for r in rows}
    drafters = [d for d in dict.fromkeys(r["drafter"] for r in rows) if d != PLAIN]
    header = [
        "drafter",
        *(f"τ {d}" for d in DOMAINS),
        "τ mean",
        *(f"speedup {d}" for d in DOMAINS),
        "speedup mean",
    ]
    table, means = [], {}
    for name in drafters:
        taus = [by[(name, d)]["tau"] if (name, d) in by else None for d in DOMAINS]
        speedups = [by[(name, d)]["speedup"] if (name, d) in by else None for d in DOMAINS]
        means[name] = {"tau": _mean(taus), "speedup": _mean(speedups)}
        table.append(
            [
                f"**{name}**",
                *(_f(t) for t in taus),
                _f(means[name]["tau"]),
                *(speedup_cell(s, t) for s, t in zip(speedups, taus)),
                _f(means[name]["speedup"], 2, "×"),
            ]  # fmt: skip
        )
    plain = [by[(PLAIN, d)]["tokens_per_s"] if (PLAIN, d) in by else None for d in DOMAINS]
    table.append(["plain decoding (tokens/s)", *(_f(t, 1) for t in plain), "", "", "", "", ""])
    return md_table(header, table), means


def serve_table(points: list[dict[str, Any]]) -> str:
    header = ["policy", "clients", "requests", "throughput (tok/s)", "per-user (tok/s)", "τ"]
    header.append("verified / request / round")
    rows = [
        [
            "plain decoding" if p["policy"] == PLAIN else p["policy"],
            str(p["concurrency"]),
            str(p["requests"]),
            _f(p["throughput"], 1),
            _f(p["per_user"], 1),
            _f(p["tau"]) if p["policy"] != PLAIN else "1.00",
            _f(p["verify_budget"]) if p["policy"] != PLAIN else "0",
        ]
        for p in points
    ]
    return md_table(header, rows)


def serving_taus(points: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """τ of each policy at each concurrency."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for p in points:
        if p["policy"] != PLAIN:
            out[p["policy"]][p["concurrency"]] = p["tau"]
    return dict(out)


def serving_speedups(points: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """Per-user tokens/s of each policy over plain decoding's, at each concurrency."""
    plain = {p["concurrency"]: p["per_user"] for p in points if p["policy"] == PLAIN}
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for p in points:
        if p["policy"] != PLAIN and plain.get(p["concurrency"]):
            out[p["policy"]][p["concurrency"]] = p["per_user"] / plain[p["concurrency"]]
    return dict(out)


def _loads(loads) -> str:
    if not loads or loads[0] is None:
        return "–"
    start, end = loads
    return f"{start:.2f} → {end:.2f}" if end is not None else f"{start:.2f}"


def _stage_warning(log: StageLog, conditions: RunConditions | None) -> str:
    """A warning when the stages ran under different loads (their speeds are then not comparable)."""
    threads = conditions.threads if conditions else 1
    cpus = conditions.cpus if conditions else 2
    busy = [name for name, (a, b) in log.loads.items() if a is not None and machine_busy(cpus, threads, a, b)]
    if not busy or (conditions is not None and conditions.busy):
        return ""
    return (
        f"\n\n> **Warning:** the machine was busy during {', '.join(busy)} (see the stage table): "
        "speeds measured in those stages are distorted."
    )


def _calibration_text(calibration: dict[str, Any]) -> str:
    temps = ", ".join(f"{t:.2f}" for t in calibration["temperatures"])
    before, after = calibration["mean_ece_before"], calibration["mean_ece_after"]
    text = (
        f"Reported on {calibration['report_rounds']} rounds ({calibration['report_set']}). "
        f"Mean ECE {_pct(before)} → {_pct(after)}: {calibration_verdict(calibration)}."
    )
    fitted = calibration.get("fitted_temperatures")
    if calibration.get("improved") is False:
        shown = ", ".join(f"{t:.2f}" for t in fitted) if fitted else temps
        return (
            f"{text} **Calibration did not improve held-out ECE**: no fitted temperature ({shown}) "
            "lowered the ECE of its position on the held-out rounds, so none was written and the "
            "evaluated DSpark drafter keeps its uncalibrated confidences."
        )
    kept = calibration.get("kept")
    dropped = [str(k) for k, keep in enumerate(kept or [], start=1) if not keep]
    note = (
        f" Positions {', '.join(dropped)} keep T = 1: their fitted temperature did not lower held-out ECE."
        if dropped
        else ""
    )
    return f"Temperatures written: {temps}. {text}{note}"


def _plain_note(
    rows: list[dict[str, Any]], points: list[dict[str, Any]], plan: QuickstartPlan, log: StageLog
) -> str:
    """Why the eval table's plain decoding speed and the serving sweep's differ."""
    evals = [r["tokens_per_s"] for r in rows if r["drafter"] == PLAIN and r.get("tokens_per_s")]
    served = [p["per_user"] for p in points if p["policy"] == PLAIN and p["concurrency"] == 1]
    if not evals or not served:
        return ""
    eval_tps, serve_tps = sum(evals) / len(evals), served[0]
    return (
        f"**Two plain-decoding speeds.** The evaluation table's plain decoding ({eval_tps:.1f} tokens/s, "
        f"mean over domains, load {_loads(log.loads.get('eval'))}) times batch-1 answers of ≤ "
        f"{plan.eval_max_tokens} tokens in this process; the serving sweep's plain decoding at one client "
        f"({serve_tps:.1f} tokens/s per user, load {_loads(log.loads.get('serve'))}) times streamed HTTP "
        f"requests of ≤ {plan.serve_max_tokens} tokens from the client's side (HTTP, tokenization and the "
        "prefill of a shorter answer included). Each speedup is a ratio against the plain decoding of "
        "its own table, measured minutes apart: compare ratios, not speeds, across the tables — and "
        "neither when the stage loads differ much."
    )


def _shipped_text(means: dict[str, dict[str, float | None]], rows: list[dict[str, Any]]) -> str:
    """What the shipped drafter did here on math (the README's claim is checked against this)."""
    math = next((r for r in rows if r["drafter"] == "dspark-shipped" and r["domain"] == "math"), None)
    if math is None:
        return ""
    speedup = math.get("speedup")
    verdict = (
        "faster than plain decoding" if speedup and speedup > 1.0 else "**not** faster than plain decoding"
    )
    return (
        f"The shipped DSpark drafter reached τ {_f(math['tau'])} on math here, {_f(speedup, 2, '×')} "
        f"plain decoding's speed: {verdict} on this machine under this load."
    )


def headline_figures(
    means: dict[str, dict[str, float | None]],
    rows: list[dict[str, Any]],
    speedups: dict[str, dict[int, float]],
    calibration: dict[str, Any],
    conditions: RunConditions | None,
    compared: list[comparison.Comparison] = (),
) -> dict[str, Any]:
    """The few figures the quickstart prints at its end (also in ``summary.json``)."""
    trained = {m: v for m, v in means.items() if not is_reference(m)}
    best = max(trained, key=lambda m: trained[m]["tau"] or 0.0) if trained else None
    math = next((r for r in rows if r["drafter"] == "dspark-shipped" and r["domain"] == "math"), None)
    return {
        "speed_verdict": speed_verdict(means).replace("**", ""),
        "calibration_verdict": calibration_verdict(calibration),
        "best_trained": best,
        "best_trained_tau": trained[best]["tau"] if best else None,
        "best_trained_speedup": trained[best]["speedup"] if best else None,
        "shipped_math_tau": math["tau"] if math else None,
        "shipped_math_speedup": math.get("speedup") if math else None,
        "serving_speedups": {p: {str(c): round(v, 3) for c, v in d.items()} for p, d in speedups.items()},
        "calibration_improved": calibration.get("improved"),
        "mean_ece": [calibration["mean_ece_before"], calibration["mean_ece_after"]],
        "shipped_comparison": comparison.headline(list(compared)),
        "busy": conditions.busy if conditions else None,
        "warning": conditions.warning() if conditions else None,
    }


def headline_lines(summary: dict[str, Any]) -> list[str]:
    """The quickstart's closing lines, from ``summary.json``."""
    h = summary.get("headline") or {}
    if not h:
        return []
    ece = h["mean_ece"]
    lines = [
        *([h["speed_verdict"]] if h.get("speed_verdict") else []),
        f"best trained drafter: {h['best_trained']} τ {_f(h['best_trained_tau'])}, "
        f"{_f(h['best_trained_speedup'], 2, '×')} plain decoding (mean over math/code/chat)",
        f"shipped DSpark on math: τ {_f(h['shipped_math_tau'])}, {_f(h['shipped_math_speedup'], 2, '×')} "
        "plain decoding",
        "serving, per-user speed over plain decoding: "
        + "; ".join(
            f"{p} " + ", ".join(f"{c} clients {v:.2f}×" for c, v in by_c.items())
            for p, by_c in h["serving_speedups"].items()
        ),
        f"calibration: mean held-out ECE {_pct(ece[0])} → {_pct(ece[1])}"
        + (f", {h['calibration_verdict']}" if h.get("calibration_verdict") else "")
        + ("" if h["calibration_improved"] is not False else " (no temperature improved it: none written)"),
    ]
    lines += comparison.headline_lines(h.get("shipped_comparison") or [])
    if h.get("warning"):
        lines.append(f"warning: {h['warning']}")
    return lines


def write_report(
    out: Path,
    plan: QuickstartPlan,
    *,
    data: dict[str, Any],
    trained: dict[str, dict[str, Any]],
    calibration: dict[str, Any],
    evaluated: dict[str, Any],
    serving: dict[str, Any],
    log: StageLog,
    wall_seconds: float,
    conditions: RunConditions | None = None,
) -> Path:
    """Write ``out/report.md`` (and ``out/summary.json`` with the same figures); returns the report."""
    eval_md, means = eval_tables(evaluated["rows"])
    speedups = serving_speedups(serving["points"])
    stage_seconds = sum(log.seconds.values())
    train_rows = [
        [
            m,
            f"{trained[m]['trainable_parameters'] / 1e6:.2f} M",
            str(trained[m]["steps"]),
            str(trained[m]["samples"]),
            _f(trained[m]["train_seconds"], 0, " s"),
            _f(trained[m]["metrics"].get("loss"), 3),
            _f(trained[m]["metrics"].get("expected_tau")),
        ]
        for m in METHODS
    ]
    calib_rows = [
        [str(c["position"]), _pct(c["ece_before"]), _pct(c["ece_after"]), _f(c["auc"])]
        for c in calibration["positions"]
    ]
    taus = serving_taus(serving["points"])
    speed_rows = [
        [policy, *(speedup_cell(by_c.get(c), taus.get(policy, {}).get(c)) for c in plan.serve_concurrency)]
        for policy, by_c in speedups.items()
    ]
    stage_rows = [
        [name, _f(seconds, 0, " s"), "resumed" if name in log.resumed else "ran", _loads(log.loads.get(name))]
        for name, seconds in log.seconds.items()
    ]
    trained_means = {m: v for m, v in means.items() if not is_reference(m)}
    compared = comparison.comparisons(evaluated, trained, means)
    curves_png = comparison.plot_curves(compared, out / comparison.PLOT)
    shipped_md = comparison.comparison_markdown(compared, evaluated.get("validation") or {}, curves_png)
    best = max(trained_means, key=lambda m: trained_means[m]["tau"] or 0.0) if trained_means else None
    smoke = " (`--fast`: a smoke run whose budgets are far too small for meaningful acceptance)"
    smoke = smoke if plan.train_steps < 20 else ""
    train_header = ["drafter", "trainable", "steps", "samples", "wall time", "final loss", "expected τ"]
    text = f"""# dspark quickstart report

Generated {datetime.datetime.now().strftime("%Y-%m-%d %H:%M")} on the embedded tiny target (10.5M-parameter
Qwen3, CPU, no network). Every figure below was measured by this run{smoke}, under the
conditions below; speeds and speed ratios hold only for a machine as loaded as this one was
(the load of each stage is in the stage table).
Wall time of this invocation: **{wall_seconds:.0f} s**; sum of the stage times (including stages
finished by an earlier invocation): {stage_seconds:.0f} s.

{conditions_markdown(conditions)}{_stage_warning(log, conditions)}

## Pipeline

1. **data** — the target answered {data["prompts"]} of its own training prompts (math / code /
   chat, temperature {plan.regen_temperature}, ≤ {plan.regen_max_tokens} tokens):
   {data["completion_tokens"]} tokens at {data["tokens_per_s"]} tokens/s through the batched
   engine → `{data["answers"]}`.
2. **train** — DFlash, DSpark and Eagle3 with the same budget: {plan.train_steps} steps × {plan.batch_size}
   sequences (≤ {plan.max_length} tokens) × {plan.num_anchors} anchors, lr {plan.lr}, γ = {plan.block_size},
   online target features → `drafters/<method>/`.
3. **calibrate** — STS temperatures for DSpark fitted on {calibration["fit_rounds"]} rounds of
   built-in prompts disjoint from the evaluation ones → `{calibration["drafter"]}`.
4. **eval** — first {plan.eval_prompts} prompts of each built-in set, temperature {plan.temperature},
   ≤ {plan.eval_max_tokens} tokens, same prompts and seeds for every method; speedups are tokens/s over
   plain decoding of the same prompts in the same run (batch 1, fixed γ = {plan.block_size}); expected τ
   of every drafter, the shipped ones included, on the target's answers to the next {plan.val_prompts}
   prompts of each set after the calibration ones (the validation set).
5. **serve** — the calibrated DSpark drafter behind the real HTTP server, closed-loop clients,
   policies {", ".join(f"`{p}`" for p in plan.serve_policies)}.

{md_table(["stage", "wall time", "this invocation", "1-min load (start → end)"], stage_rows)}

## Training (equal budgets)

{md_table(train_header, train_rows)}

## Acceptance length τ and speedup over plain decoding (paper Table 1 layout)

{eval_md}

**τ** (acceptance length) is what decoding measured: tokens emitted per verification round,
accepted drafts + 1. **Expected τ** (the training table, the section below) is the same
quantity predicted without decoding, from the drafter's acceptance probabilities on the target's
own answers with fixed anchors, `1 + Σ_k Π_{{i≤k}} acceptance_i`; the two differ because decoding
meets other prompts, samples its drafts and stops at the answer's end.
{BEYOND_TAU_NOTE if BEYOND_TAU in eval_md else ""}

Highest mean τ of the drafters trained here: **{best}**. For reference, rows this run did
not train: `ngram` (prompt lookup, no training at all) and `<method>-shipped` (the drafters
in the package; how they were trained is in the next section). Full per-benchmark report
with histograms and prefix survival: [eval/report.md](eval/report.md).

![conditional acceptance](eval/conditional_acceptance.png)

## Beside the shipped drafters

{shipped_md}

## Calibration of DSpark's confidence head (STS)

{_calibration_text(calibration)}

{md_table(["position k", "ECE before", "ECE after", "AUC"], calib_rows)}

![reliability](calibration/reliability.png)

## Serving sweep

{serve_table(serving["points"])}

Per-user speed over plain decoding at the same number of clients:

{md_table(["policy", *(f"{c} clients" for c in plan.serve_concurrency)], speed_rows)}
{BEYOND_TAU_NOTE if any(BEYOND_TAU in cell for row in speed_rows for cell in row) else ""}

![throughput vs per-user speed](serve/throughput_vs_per_user.png)

{_plain_note(evaluated["rows"], serving["points"], plan, log)}

## What to read into this

{speed_verdict(means)} {_shipped_text(means, evaluated["rows"])}

The drafters here saw {plan.train_steps * plan.batch_size} sequences each; the shipped ones
(`dspark generate --drafter dspark`) saw the budgets above, DeepSeek's millions. τ rises with the
budget (BENCHMARKS.md), and on this 10.5M-parameter target a drafter forward costs a
sizeable share of a target forward, so wall-clock speedups need τ well above 1.5. For a
real model, follow the Qwen3-8B recipe in the README: the same stages, the same commands.
"""
    (out / "report.md").write_text(text)
    summary = {
        "plan": plan.part(*plan.__dataclass_fields__),
        "wall_seconds": round(wall_seconds, 1),
        "stage_seconds": log.seconds,
        "resumed": log.resumed,
        "eval_means": means,
        "serving_speedups": {p: {str(c): round(v, 3) for c, v in d.items()} for p, d in speedups.items()},
        "calibration": {k: calibration[k] for k in ("temperatures", "mean_ece_before", "mean_ece_after")}
        | {"improved": calibration.get("improved")},
        "conditions": conditions.as_dict() if conditions else None,
        "stage_loads": log.loads,
        "headline": headline_figures(means, evaluated["rows"], speedups, calibration, conditions, compared),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return out / "report.md"
