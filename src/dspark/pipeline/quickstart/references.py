"""The drafters the quickstart evaluates without having trained them.

``ngram`` (prompt lookup: no training at all) and ``dspark-shipped`` (the package's DSpark
drafter) are always there. Every method whose shipped drafter has a record in the
target's ``SHIPPED.json`` (:mod:`dspark.formats.shipped_record`) is added as
``<method>-shipped`` and compared with the drafter of that method trained here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dspark.errors import DsparkError
from dspark.formats.shipped import shipped_drafter_dir
from dspark.formats.shipped_record import ShippedRecord, read_records
from dspark.pipeline.presets import METHODS

REFERENCES = ("ngram", "dspark-shipped")  # eval rows present in every run
SUFFIX = "-shipped"


@dataclass(frozen=True, kw_only=True)
class ShippedReference:
    method: str
    folder: Path
    record: ShippedRecord | None  # None: no SHIPPED.json entry (then only dspark is evaluated)

    @property
    def row(self) -> str:
        return self.method + SUFFIX


def is_reference(drafter: str) -> bool:
    """Whether an eval row's drafter was not trained by this run."""
    return drafter in REFERENCES or drafter.endswith(SUFFIX)


def shipped_references(target, root: Path | None = None) -> list[ShippedReference]:
    """The shipped drafters of ``target`` under ``root`` (default: the package's) to evaluate."""

    out = []
    for method in METHODS:
        try:
            folder = shipped_drafter_dir(method, target, root=root)
        except DsparkError:
            continue
        record = read_records(folder.parent).get(method)
        if record is not None or method == "dspark":
            out.append(ShippedReference(method=method, folder=folder, record=record))
    return out
