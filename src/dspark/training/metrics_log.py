"""Training metrics: gathered from loss outputs, averaged over ranks, written to JSONL (DESIGN §6).

Every log step appends one JSON object per line to ``metrics.jsonl`` (always), mirrors
the scalars to TensorBoard when it is installed and asked for, and updates a tqdm
progress bar with an ETA. Only rank 0 writes; the other ranks still take part in the
averaging.

Names: a drafter's loss output is flattened field by field (nested dataclasses
inline), per-position vectors as ``name/k`` with k = 1..K, e.g. ``acceptance/1`` (the
expected conditional acceptance ``1 - TV`` at draft position 1), ``expected_tau``,
``confidence_bias``; the trainer adds ``lr``, ``grad_norm``, ``tokens_per_s``, and the
online evaluation's results under ``eval/``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from dspark.durable import write_atomic
from dspark.errors import DsparkError
from dspark.training import distributed

log = logging.getLogger(__name__)


def flatten_metrics(obj: Any) -> dict[str, float]:
    """Scalar metrics of a loss output: numbers and 0-d tensors by field name, 1-d tensors as ``name/k``.

    Nested dataclasses are flattened into the same namespace; ``None`` fields are skipped.
    """
    out: dict[str, float] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out |= flatten_metrics(value)
        elif isinstance(value, Tensor) and value.dim() == 0:
            out[f.name] = float(value.detach())
        elif isinstance(value, Tensor) and value.dim() == 1:
            out |= {f"{f.name}/{k + 1}": float(v) for k, v in enumerate(value.detach().float().tolist())}
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f.name] = float(value)
    return out


class MetricMeans:
    """Running NaN-aware means of named metrics over micro-batches; :meth:`reduce` averages over ranks."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            if math.isfinite(value):
                self.sums[name] = self.sums.get(name, 0.0) + value
                self.counts[name] = self.counts.get(name, 0) + 1
            else:
                self.sums.setdefault(name, 0.0)
                self.counts.setdefault(name, 0)

    def reduce(self) -> dict[str, float]:
        """Means over every micro-batch of every rank (NaN where none had a finite value).

        A collective: every rank must call it with the same metric names.
        """
        names = sorted(self.sums)
        local = torch.tensor(
            [[self.sums[n] for n in names], [float(self.counts[n]) for n in names]], dtype=torch.float64
        )  # [2, n]
        total = distributed.all_reduce_sum(local)
        return {n: (s / c if c > 0 else math.nan) for n, s, c in zip(names, *total.tolist())}


def _json_value(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # strict JSON has no NaN/inf
    return v


class MetricsLog:
    """JSONL (+ optional TensorBoard) metrics and a progress bar; inert on ranks other than 0."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        total_steps: int,
        start_step: int = 0,
        enabled: bool = True,
        tensorboard: bool = False,
        progress: bool = True,
    ) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = None
        self._bar = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        truncate_after(self.path, start_step)
        if tensorboard:
            self._tb = _summary_writer(Path(run_dir) / "tensorboard", purge_step=start_step + 1)
        self._bar = tqdm(
            total=total_steps,
            initial=start_step,
            unit="step",
            desc="train",
            file=sys.stderr,
            disable=not progress,
            dynamic_ncols=True,
        )

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one record ``{"step", "time", **metrics}``."""
        if not self.enabled:
            return
        record = {"step": step, "time": round(time.time(), 3)} | {
            k: _json_value(v) for k, v in metrics.items()
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for name, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(name, value, step)
            self._tb.flush()

    def advance(self, postfix: Mapping[str, float] | None = None) -> None:
        """One more step on the progress bar (ETA from tqdm's rate)."""
        if self._bar is None:
            return
        if postfix:
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()


def _record_step(line: str) -> int | None:
    """The ``step`` of one metrics line; None if it is not a record this log wrote."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def truncate_after(path: Path, step: int) -> None:
    """Drop records past ``step`` (written before a crash, then redone after resuming); a fresh
    run (``step`` 0) starts an empty log. A line that is no record is a one-line error, except
    a last line cut short by the crash itself."""
    if not path.is_file():
        return
    if step == 0:
        write_atomic(path, "", tmp=path.with_name(path.name + ".tmp"))
        return
    try:
        lines = path.read_text().splitlines(keepends=True)
    except UnicodeDecodeError:
        lines = ["\ufffd"]  # reported below as line 1
    steps = [_record_step(line) for line in lines]
    for i, (line, found) in enumerate(zip(lines, steps)):
        cut_short = i == len(lines) - 1 and not line.endswith("\n")
        if found is None and line.strip() and not cut_short:
            raise DsparkError(
                f"{path}: line {i + 1} is not a metrics record of dspark train; move the file "
                "away to resume, or train into a new folder"
            )
    keep = [line for line, found in zip(lines, steps) if found is not None and found <= step]
    if len(keep) != len(lines):
        write_atomic(path, "".join(keep), tmp=path.with_name(path.name + ".tmp"))


def _summary_writer(log_dir: Path, purge_step: int):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional
        log.warning("tensorboard is not installed; logging metrics to JSONL only")
        return None
    return SummaryWriter(str(log_dir), purge_step=purge_step)
