"""``dspark quickstart``: the whole pipeline on the embedded tiny target, in one command.

regenerate → train DFlash / DSpark / Eagle3 (equal budgets, online features) →
calibrate DSpark (STS) → validation answers → evaluate (beside the shipped drafters
that have a ``SHIPPED.json`` record) → serving sweep → ``report.md``. Each stage writes
its outputs and a marker under the run folder; a rerun skips the finished stages.
"""

from dspark.pipeline.quickstart.pipeline import run_quickstart

__all__ = ["run_quickstart"]
