"""SGLang's DSpark sidecar files: the STS calibration JSON and the SPS cost table.

SGLang 0.5.23 reads them from ``--speculative-dspark-confidence-sts-path`` and
``--speculative-dspark-sps-table-path``:

- STS: ``{"temperatures": [T_1, ..., T_γ]}``, exactly one temperature per draft position
  (it refuses another count) and each > 0; the confidence of position k becomes
  ``σ(logit_k / T_k)``, our :func:`~dspark.heads.scale_confidence_logits`.
- SPS: ``{"sample_batch_tokens": [...], "sample_steps_per_sec": [...], "max_batch_tokens": N}``,
  sizes strictly increasing. Without one SGLang's scheduler verifies every draft.
  The table must be measured on the serving machine; we convert one, never invent it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dspark.errors import DsparkError

STS_NAME = "sglang_sts.json"
SPS_NAME = "sglang_sps_table.json"


def sglang_sts(temperatures: list[float], block_size: int) -> str:
    """One temperature per draft position: ours repeat the last one past those fitted."""
    ts = [float(t) for t in temperatures]
    per_position = (ts + [ts[-1]] * block_size)[:block_size]
    return json.dumps({"temperatures": per_position}, indent=2) + "\n"


def read_sps_table(path: str | Path) -> dict[str, Any]:
    """An SPS(B) table: ours (``dspark profile``: ``tokens``/``steps_per_s``) or SGLang's."""
    path = Path(path).expanduser()
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DsparkError(f"--sps-table {path}: cannot read a JSON table ({e})") from None
    if not isinstance(raw, dict):
        raise DsparkError(f"--sps-table {path}: expected a JSON object")
    if "sample_batch_tokens" in raw:
        tokens, sps = raw.get("sample_batch_tokens"), raw.get("sample_steps_per_sec")
    else:
        tokens, sps = raw.get("tokens"), raw.get("steps_per_s")
    ok = isinstance(tokens, list) and isinstance(sps, list) and len(tokens) == len(sps) > 1
    ok = ok and all(isinstance(b, int) and b >= 1 for b in tokens) and tokens == sorted(set(tokens))
    ok = ok and all(isinstance(s, int | float) and s > 0 for s in sps)
    if not ok:
        raise DsparkError(
            f"--sps-table {path}: need at least two sizes, strictly increasing positive token counts "
            "and positive steps per second (keys tokens/steps_per_s or SGLang's sample_* keys)"
        )
    max_tokens = int(raw.get("max_batch_tokens", tokens[-1]))
    return {
        "tokens": tokens,
        "steps_per_s": [float(s) for s in sps],
        "max_tokens": max(max_tokens, tokens[-1]),
    }


def sglang_sps_table(table: dict[str, Any]) -> str:
    """SGLang's ``SpsCostTable`` JSON of a table read by :func:`read_sps_table`."""
    out = {
        "sample_batch_tokens": list(table["tokens"]),
        "sample_steps_per_sec": list(table["steps_per_s"]),
        "max_batch_tokens": int(table["max_tokens"]),
    }
    return json.dumps(out, indent=2) + "\n"
