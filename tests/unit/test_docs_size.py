"""The front docs stay short, and their headline figures match the results they came from.

README.md is the entry (≤ 250 lines), BENCHMARKS.md the current results (≤ 500 lines; the
history lives in docs/notes/). A figure quoted in BENCHMARKS.md from a results file under
docs/ is read back from that file here, so the two cannot drift apart.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "BENCHMARKS.md"


@pytest.mark.parametrize(("name", "limit"), [("README.md", 250), ("BENCHMARKS.md", 500)])
def test_front_docs_stay_short(name, limit):
    lines = (ROOT / name).read_text().count("\n")
    assert lines <= limit, f"{name} has {lines} lines (at most {limit}): move history to docs/notes/"


def test_no_markdown_doc_cites_the_old_spec_name():
    docs = [ROOT / "README.md", BENCHMARKS, *sorted((ROOT / "docs").rglob("*.md"))]
    assert not [d.relative_to(ROOT) for d in docs if "SPEC §" in d.read_text()]


def _table_row(text: str, first_cell: str) -> list[str]:
    """The cells of the first Markdown table row of ``text`` whose first cell is ``first_cell``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row {first_cell!r} in BENCHMARKS.md")


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _taus(*paths: str) -> dict[tuple[str, str], float]:
    rows = [row for p in paths for row in json.loads((ROOT / p).read_text())["rows"]]
    return {(r["drafter"], r["benchmark"]): r["tau"] for r in rows}


BENCHES = ["gsm8k", "humaneval", "mt-bench"]


def test_table1_at_convergence_matches_its_results():
    section = _section(BENCHMARKS.read_text(), "Table 1, Fig. 2 and Figs. 3/4 at convergence (tiny target)")
    taus = _taus(
        "docs/eval_tiny_table1_converged/dspark_dflash/results.json",
        "docs/eval_tiny_table1_converged/eagle3/results.json",
    )
    for label, drafter in [("DSpark", "dspark"), ("Eagle3", "eagle3"), ("DFlash", "dflash")]:
        cells = _table_row(section, label)
        expected = [taus[drafter, b] for b in BENCHES]
        assert cells[1:4] == [f"{t:.2f}" for t in expected], (label, cells)
        assert cells[4] == f"{sum(expected) / 3:.2f}", (label, cells)


def test_smollm2_tau_matches_its_results():
    section = _section(BENCHMARKS.read_text(), "SmolLM2")
    taus = _taus("docs/eval_smollm2_table1/results.json")
    assert _table_row(section, "DSpark")[1:4] == [f"{taus['dspark', b]:.2f}" for b in BENCHES]


def test_calibration_mean_ece_matches_its_results():
    result = json.loads((ROOT / "docs/calibration_tiny_converged/calibration.json").read_text())
    section = _section(BENCHMARKS.read_text(), "Calibration")
    quoted = re.search(r"Mean ECE over the 7 positions: \*\*([\d.]+) % → ([\d.]+) %\*\*", section)
    assert quoted, "the calibration section no longer quotes the mean ECE"
    before, after = (float(v) for v in quoted.groups())
    assert (before, after) == (
        round(100 * result["mean_ece_before"], 1),
        round(100 * result["mean_ece_after"], 1),
    )
    assert f"on the {result['report_rounds']} rounds" in section
