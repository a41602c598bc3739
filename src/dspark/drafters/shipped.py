"""The drafters shipped in the package, one folder per target and method (issue 16 item 5).

``dspark/assets/drafters/<target>/<method>/`` holds the drafter of ``method`` trained for
one shipped target (``tiny``: the embedded tiny target; ``smollm2``: SmolLM2-135M-Instruct).
``--drafter dspark`` means "the shipped DSpark drafter of the target I loaded": the folder
is found by what its ``config.json`` says of its target (vocabulary, depth, and the
sha256 of the target's embedding and head when the folder leaves them out), and
:func:`dspark.drafters.folder.load_drafter` then checks it fully. ``SHIPPED.json`` beside
a target's folders says how they were trained (:mod:`dspark.drafters.shipped_record`).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from dspark.errors import DsparkError

DEFAULT_TARGET = "tiny"  # the folder a caller without a loaded target means


def shipped_root() -> Path:
    """``dspark/assets/drafters`` (package data)."""
    return Path(str(resources.files("dspark") / "assets" / "drafters"))


def shipped_targets(method: str | None = None, *, root: Path | None = None) -> list[str]:
    """The shipped targets (folder names), those with a drafter of ``method`` if given.

    ``root`` is a folder laid out like the package's (default :func:`shipped_root`).
    """
    root = root if root is not None else shipped_root()
    if not root.is_dir():
        return []
    return sorted(
        d.name
        for d in root.iterdir()
        if d.is_dir() and (method is None or (d / method / "config.json").is_file())
    )


def _raw_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def fits_target(raw: dict, target) -> bool:
    """Whether a shipped drafter's ``config.json`` (``raw``) was made for ``target``.

    Field checks first (cheap); the embedding/head fingerprint only when the folder left
    those tensors out and records it. ``load_drafter`` repeats the full validation.
    """
    if raw.get("vocab_size") != target.vocab_size or raw.get("num_target_layers") != target.num_layers:
        return False
    record = raw.get("dspark_shared_weights")
    if record and record.get("target_sha256"):
        from dspark.drafters.shared_weights import target_fingerprint

        return record["target_sha256"] == target_fingerprint(target)
    return True


def shipped_drafter_dir(method: str, target=None, *, root: Path | None = None) -> Path:
    """The folder of the shipped ``method`` drafter for ``target`` (the tiny target's if None),
    under ``root`` (default :func:`shipped_root`).

    Raises a one-line :class:`DsparkError` naming the targets that do have one.
    """
    root = root if root is not None else shipped_root()
    if target is None:
        return root / DEFAULT_TARGET / method
    candidates = shipped_targets(method, root=root)
    for name in candidates:
        if fits_target(_raw_config(root / name / method), target):
            return root / name / method
    have = ", ".join(candidates) or "none"
    raise DsparkError(
        f"no shipped {method} drafter for this target (shipped {method} drafters: {have}); "
        f"train one with `dspark train --drafter {method}` or `dspark campaign`, and pass its folder"
    )
