"""``SHIPPED.json``: how each shipped drafter of a target was trained, and its learning curve.

``scripts/ship_drafters.py`` writes one record per method beside the shipped folders
(``dspark/assets/drafters/<target>/SHIPPED.json``); the quickstart reads it to put the
shipped drafters beside the ones it trains. A record holds the training budget (steps,
epochs, training tokens), the campaign's last validation expected τ and real τ, and
the learning curve: the campaign's validation expected τ
(``eval/val_expected_tau``: the same fixed samples and anchors at every evaluation) and
the real τ of its online evaluations, against steps, thinned to a few dozen points.
A record written before curves existed reads with ``curve = None``.

A record also names its target (vocabulary, depth, the sha256 of its
embedding and head) and the sha256 of each weight file: a drafter kept outside git (the
store, :mod:`dspark.formats.shipped`) is then still described by the repository — what it
is, how it was trained, what τ to expect — and an installed copy is checked against it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark.formats.folder import file_sha256

RECORD = "SHIPPED.json"
MEASURE = "eval/val_expected_tau"  # the measure of a stored curve (see campaign/pipeline.py: TrainingEval)
MAX_POINTS = 40


@dataclass(frozen=True, kw_only=True)
class ShippedCurve:
    """One shipped drafter's learning curve, as its campaign logged it."""

    measure: str  # what ``expected_tau`` holds (MEASURE)
    tokens_per_step: float  # mean training tokens of one optimizer step of that run
    steps: tuple[int, ...]
    expected_tau: tuple[float, ...]  # the measure at ``steps``
    real_tau_steps: tuple[int, ...] = ()
    real_tau: tuple[float, ...] = ()  # τ of the online evaluations (decoding held-out prompts)

    def __post_init__(self) -> None:
        assert len(self.steps) == len(self.expected_tau) and self.steps, "a curve needs points"
        assert list(self.steps) == sorted(self.steps), "curve steps must increase"
        assert len(self.real_tau_steps) == len(self.real_tau)

    def tokens(self, step: float) -> float:
        return step * self.tokens_per_step

    def as_json(self) -> dict[str, Any]:
        return {
            "measure": self.measure,
            "tokens_per_step": round(self.tokens_per_step, 2),
            "steps": list(self.steps),
            "tokens": [round(self.tokens(s)) for s in self.steps],
            "expected_tau": [round(v, 4) for v in self.expected_tau],
            "real_tau": {"steps": list(self.real_tau_steps), "tau": [round(v, 4) for v in self.real_tau]},
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ShippedCurve:
        real = raw.get("real_tau") or {}
        return cls(
            measure=raw.get("measure", MEASURE),
            tokens_per_step=float(raw["tokens_per_step"]),
            steps=tuple(int(s) for s in raw["steps"]),
            expected_tau=tuple(float(v) for v in raw["expected_tau"]),
            real_tau_steps=tuple(int(s) for s in real.get("steps", ())),
            real_tau=tuple(float(v) for v in real.get("tau", ())),
        )


@dataclass(frozen=True, kw_only=True)
class ShippedRecord:
    """How one shipped drafter was trained (one method's entry of ``SHIPPED.json``)."""

    steps: int
    epochs: float
    training_tokens: int
    val_expected_tau: float | None = None
    real_tau_last: float | None = None
    stopped_early: bool | None = None
    size_mb: float | None = None
    curve: ShippedCurve | None = None  # None: the record predates curves, or the run logged none
    target: dict[str, Any] | None = None  # vocab_size, num_target_layers, target_sha256
    files: dict[str, str] | None = None  # weight file name -> sha256

    def target_fields(self) -> dict[str, Any]:
        """``target`` as the fields of a drafter's ``config.json`` (what ``fits_target`` reads)."""
        t = self.target or {}
        return {
            "vocab_size": t.get("vocab_size"),
            "num_target_layers": t.get("num_target_layers"),
            "dspark_shared_weights": {"target_sha256": t.get("target_sha256")},
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ShippedRecord:
        return cls(
            steps=int(raw["steps"]),
            epochs=float(raw["epochs"]),
            training_tokens=int(raw["training_tokens"]),
            val_expected_tau=raw.get("val_expected_tau"),
            real_tau_last=raw.get("real_tau_last"),
            stopped_early=raw.get("stopped_early"),
            size_mb=raw.get("size_mb"),
            curve=ShippedCurve.from_json(raw["curve"]) if raw.get("curve") else None,
            target=raw.get("target"),
            files=raw.get("files"),
        )

    def as_json(self) -> dict[str, Any]:
        out = {
            "steps": self.steps,
            "epochs": self.epochs,
            "training_tokens": self.training_tokens,
            "val_expected_tau": self.val_expected_tau,
            "real_tau_last": self.real_tau_last,
            "stopped_early": self.stopped_early,
            "size_mb": self.size_mb,
        }
        extra = {k: v for k, v in (("target", self.target), ("files", self.files)) if v is not None}
        return out | extra | ({"curve": self.curve.as_json()} if self.curve else {})


def thin(steps: list[int], max_points: int = MAX_POINTS) -> list[int]:
    """Indices of at most ``max_points`` of ``steps`` (increasing), evenly spread over the
    step range; the first and the last point are always kept (the last is the shipped weights)."""
    n = len(steps)
    if n <= max_points:
        return list(range(n))
    assert max_points >= 2
    first, last = steps[0], steps[-1]
    wanted = [first + (last - first) * i / (max_points - 1) for i in range(max_points)]
    chosen, j = [], 0
    for w in wanted:  # the nearest logged step to each evenly spaced one, never twice
        while j + 1 < n and abs(steps[j + 1] - w) <= abs(steps[j] - w):
            j += 1
        if not chosen or chosen[-1] != j:
            chosen.append(j)
    return chosen


def curve_from_log(
    steps: list[int],
    values: list[float],
    real_steps: list[int],
    real_tau: list[float],
    *,
    tokens_per_step: float,
    max_points: int = MAX_POINTS,
) -> ShippedCurve | None:
    """A stored curve from a campaign's logged points; None when the run logged no ``MEASURE``."""
    if not steps:
        return None
    # a resumed run may log a step twice: the later record is the one that run continued from
    by_step, real_by_step = dict(zip(steps, values)), dict(zip(real_steps, real_tau))
    steps, real_steps = sorted(by_step), sorted(real_by_step)
    values, real_tau = [by_step[s] for s in steps], [real_by_step[s] for s in real_steps]
    keep = thin(steps, max_points)
    keep_real = thin(real_steps, max_points) if real_steps else []
    return ShippedCurve(
        measure=MEASURE,
        tokens_per_step=tokens_per_step,
        steps=tuple(steps[i] for i in keep),
        expected_tau=tuple(values[i] for i in keep),
        real_tau_steps=tuple(real_steps[i] for i in keep_real),
        real_tau=tuple(real_tau[i] for i in keep_real),
    )


def read_records(target_dir: Path) -> dict[str, ShippedRecord]:
    """The records of ``<target_dir>/SHIPPED.json`` by method; empty when there is none."""
    path = target_dir / RECORD
    if not path.is_file():
        return {}
    return {method: ShippedRecord.from_json(raw) for method, raw in json.loads(path.read_text()).items()}


def target_record(folder: Path) -> dict[str, Any] | None:
    """A drafter folder's ``target`` record, read from its ``config.json``; None without a fingerprint."""
    raw = json.loads((folder / "config.json").read_text())
    digest = (raw.get("dspark_shared_weights") or {}).get("target_sha256")
    if digest is None:
        return None
    return {
        "vocab_size": raw["vocab_size"],
        "num_target_layers": raw["num_target_layers"],
        "target_sha256": digest,
    }


def file_digests(folder: Path) -> dict[str, str]:
    """sha256 of each file a drafter folder is made of (config and weights)."""

    return {
        f.name: file_sha256(f) for f in sorted(folder.iterdir()) if f.is_file() and not f.name.startswith(".")
    }


def records_json(records: dict[str, ShippedRecord]) -> str:
    return json.dumps({m: r.as_json() for m, r in sorted(records.items())}, indent=1, sort_keys=True) + "\n"
