"""Calibrate a drafter: fit STS temperatures on real rounds and write them into its folder (DESIGN §8).

:func:`calibrate_drafter` is the library function behind ``dspark calibrate`` and the
quickstart. It lives in ``eval`` because step 1 decodes with the evaluation runner;
the calibration math itself (:mod:`dspark.calibration`) imports no model.

1. Decode a held-out prompt set with the drafter (the evaluation runner, no plain
   baseline) and keep every round's confidences and accepted count.
2. Split the rounds by prompt: STS is fitted on one part, and ECE / AUC / Brier per
   position before and after are reported on the other (``--holdout-fraction``).
3. Keep only the temperatures that lower the held-out ECE of their position
   (:func:`~dspark.calibration.sts.keep_improving`; the others stay 1) and, if any is
   left, write them into the drafter folder's ``config.json``
   (``sts_temperatures``), composed with any it already had, so that every consumer
   of the drafter (the loop, the engine, the scheduler) sees calibrated confidences.
4. Report: ``calibration.json``, ``reliability.png`` (paper Fig. 6), ``calibration.md``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np

from dspark.calibration.collect import ConfidenceRounds, split_by_group
from dspark.calibration.metrics import position_calibration
from dspark.calibration.sts import apply_sts, compose_temperatures, fit_sts, keep_improving
from dspark.durable import write_atomic
from dspark.errors import DsparkError
from dspark.eval import plots
from dspark.eval.report import md_table, write_json
from dspark.eval.runner import run_eval
from dspark.formats.folder import DRAFTER_FILES, load_drafter
from dspark.output_folders import check_replaceable, claim_outputs, publish_folder, temp_folder

REPORT_FILES = ("calibration.json", "calibration.md", "reliability.png")  # what --out gets
POSITIONS_SHOWN = (1, 3, 5, 7)  # the paper's Fig. 6 panels


def write_temperatures(folder: Path, temperatures: tuple[float, ...]) -> None:
    """Set ``sts_temperatures`` in ``folder/config.json`` atomically; weights are untouched."""
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    raw["sts_temperatures"] = [float(t) for t in temperatures]
    write_atomic(path, json.dumps(raw, indent=2, sort_keys=True) + "\n")


def _check(folder: Path, save_to: Path, force: bool) -> dict:

    # The run a copy belongs to is the path it was written at: a copy moved elsewhere by hand is
    # the user's (:mod:`dspark.output_folders`).
    return {
        "command": "calibrate",
        "run": str(save_to.resolve()),
        "flag": "--save-to",
        "inputs": [folder],
        "names": DRAFTER_FILES,
        "force": force,
    }


def check_save_to(folder: Path, save_to: Path, force: bool = False) -> None:
    """Refuse a ``--save-to`` that would lose data, before any work is done."""

    check_replaceable(save_to, **_check(folder, save_to, force))


def save_calibrated_copy(
    folder: Path, save_to: Path, temperatures: tuple[float, ...] | None, force: bool = False
) -> Path:
    """A copy of the drafter folder with the temperatures (None: unchanged), at ``save_to``: never
    replacing a folder this command did not write there (unless ``force``, and then only a drafter
    folder), nor one that holds the source (:mod:`dspark.output_folders`)."""

    check = _check(folder, save_to, force)
    check_save_to(folder, save_to, force)  # before anything is copied
    tmp = temp_folder(save_to, "--save-to")
    try:
        for name in DRAFTER_FILES:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, tmp / name)
        if temperatures is not None:
            write_temperatures(tmp, temperatures)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return publish_folder(tmp, save_to, **check)


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "–"
    return f"{100 * v:.2f}%" if pct else f"{v:.3f}"


def _temps(temps: list[float] | None) -> str:
    return "none" if not temps else "[" + ", ".join(f"{t:.3f}" for t in temps) + "]"


def _written(summary: dict) -> str:
    """Where the temperatures went, or why they were not written."""
    if not summary["improved"]:
        return (
            "**not written**: no fitted temperature lowered the held-out ECE of its position, "
            "so the drafter keeps the confidences it had"
        )
    dropped = [str(k) for k, kept in enumerate(summary["kept"], start=1) if not kept]
    note = f" (positions {', '.join(dropped)} keep T = 1: their fit did not lower held-out ECE)"
    where = f"written to `{summary['written_to']}`" if summary["written_to"] else "not written (dry run)"
    return where + (note if dropped else "")


def _report_md(summary: dict, positions: list[int]) -> str:

    rows = []
    for b, a in zip(summary["before"], summary["after"]):
        rows.append(
            [
                str(b["position"]),
                str(b["num_rounds"]),
                _fmt(b["observed"]),
                _fmt(b["mean_predicted"]) + " → " + _fmt(a["mean_predicted"]),
                _fmt(b["ece"], True) + " → " + _fmt(a["ece"], True),
                _fmt(b["brier"]) + " → " + _fmt(a["brier"]),
                _fmt(b["auc"]) + " → " + _fmt(a["auc"]),
                _fmt(b["conditional_auc"]),
                f"{summary['fitted_temperatures'][b['position'] - 1]:.3f}"
                + ("" if summary["kept"][b["position"] - 1] else " (not kept)"),
            ]
        )
    header = [
        "k",
        "rounds",
        "observed a_k",
        "mean a_k",
        "ECE",
        "Brier",
        "AUC (a_k)",
        "AUC (c_k)",
        "fitted T_k",
    ]
    return (
        "\n\n".join(
            [
                "# Confidence calibration (Sequential Temperature Scaling)",
                f"- drafter: `{summary['drafter']}`; {summary['fit_rounds']} rounds fitted, "
                f"{summary['report_rounds']} reported ({summary['report_set']}), {summary['bins']} ECE bins",
                f"- temperatures: {_temps(summary['temperatures'])} (previous: "
                f"{_temps(summary['previous_temperatures'])}), " + _written(summary),
                'Survival `a_k = Π_{i≤k} c_i` against "the first k drafts accepted", over rounds '
                "that proposed ≥ k drafts; AUC (c_k) scores the conditional confidence where drafts "
                "1..k−1 were accepted (temperature scaling preserves its order, so it does not move).",
                md_table(header, rows),
                f"### Reliability diagrams (paper Fig. 6), positions {', '.join(map(str, positions))}\n\n"
                "![reliability](reliability.png)",
            ]
        )
        + "\n"
    )


def calibrate_drafter(
    target,
    folder: Path,
    benchmarks,
    config,
    out: Path,
    *,
    holdout_fraction: float = 0.25,
    bins: int = 20,
    seed: int = 0,
    save_to: Path | None = None,
    dry_run: bool = False,
    force: bool = False,
) -> dict:
    """Steps 1–4 of the module docstring for the drafter in ``folder``; the summary (also in ``out``).

    ``force`` lets the report overwrite unclaimed files of its names in ``out``, and the copy
    replace an unclaimed drafter folder at ``save_to`` (:mod:`dspark.output_folders`)."""

    if not 0.0 <= holdout_fraction < 1.0:
        raise DsparkError(f"--holdout-fraction must be in [0, 1), got {holdout_fraction}")
    if bins < 1:
        raise DsparkError("--bins must be >= 1")
    if save_to is not None and not dry_run:  # refuse before the (long) decoding, not after
        check_save_to(folder, save_to, force)
    claim_outputs(out, REPORT_FILES, command="calibrate", force=force)
    drafter = load_drafter(folder, target)
    result = run_eval(target, {"drafter": drafter}, benchmarks, dataclasses.replace(config, baseline=False))
    parts, offset = [], 0
    for bench in benchmarks:  # prompt ids unique across benchmarks, for the split
        rounds = result.confidence_rounds.get(("drafter", bench.name))
        if rounds is not None:
            parts.append(dataclasses.replace(rounds, group=rounds.group + offset))
        offset += len(bench.prompts)
    block_size = drafter.block_size
    rounds = ConfidenceRounds.concat(parts, block_size)
    if rounds.num_rounds == 0:
        raise DsparkError("no round proposed drafts; nothing to calibrate (more prompts or --max-tokens?)")
    fit, report = split_by_group(rounds, holdout_fraction, seed=seed)
    fitted = fit_sts(fit, bins=bins)
    kept = keep_improving(report, fitted, bins=bins)  # a temperature that does not help is not written
    before = position_calibration(report, bins)
    after = position_calibration(report.with_confidences(apply_sts(report.confidences, kept)), bins)
    previous = getattr(drafter.config, "sts_temperatures", None)
    temperatures = compose_temperatures(previous, kept)
    improved = any(t != 1.0 for t in kept)

    written = None
    if not dry_run:
        target_folder = save_to or folder
        if save_to is not None:  # the copy is made either way; it gets temperatures only if they help
            save_calibrated_copy(folder, save_to, temperatures if improved else None, force)
        elif improved:
            write_temperatures(folder, temperatures)
        if improved:
            reloaded = load_drafter(target_folder, target)  # the strict loader accepts what we wrote
            assert tuple(reloaded.config.sts_temperatures) == temperatures
            written = str(target_folder)

    shown = (
        [k for k in POSITIONS_SHOWN if k <= block_size] if block_size >= 7 else list(range(1, block_size + 1))
    )
    plots.plot_reliability(before, after, out / "reliability.png", positions=shown)
    same = report is fit
    summary = {
        "drafter": str(folder),
        "written_to": written,
        "temperatures": list(temperatures),
        "fitted_temperatures": list(fitted),
        "kept": [t != 1.0 for t in kept],
        "improved": improved,
        "previous_temperatures": list(previous) if previous else None,
        "fit_rounds": fit.num_rounds,
        "report_rounds": report.num_rounds,
        "report_set": "in-sample" if same else f"held-out {holdout_fraction:.0%} of the prompts",
        "bins": bins,
        "mean_ece_before": float(np.mean([p.ece for p in before])),
        "mean_ece_after": float(np.mean([p.ece for p in after])),
        "before": [dataclasses.asdict(p) for p in before],
        "after": [dataclasses.asdict(p) for p in after],
    }
    write_json(out / "calibration.json", summary)
    (out / "calibration.md").write_text(_report_md(summary, shown))
    return summary
