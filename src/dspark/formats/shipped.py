"""The shipped drafters: one folder per target and method, in the package or the user's store.

``<root>/<target>/<method>/`` holds the drafter of ``method`` trained for one shipped target
(``tiny``: the embedded tiny target; ``smollm2``: SmolLM2-135M-Instruct). Two roots are
searched, in order (DESIGN §16):

- the package, ``dspark/assets/drafters`` — the tiny target's drafters, small enough for git;
- the store, ``<cache_root>/drafters`` (``~/.cache/dspark/drafters``) — drafters too big for
  git (SmolLM2's, ~25 MB each), put there by ``scripts/ship_drafters.py`` from a finished
  campaign or by ``scripts/device/collect.py`` from a GPU run's returned shards.

``--drafter dspark`` means "the shipped DSpark drafter of the target I loaded": the folder
is found by what its ``config.json`` says of its target (vocabulary, depth, and the
sha256 of the target's embedding and head when the folder leaves them out), and
:func:`dspark.formats.folder.load_drafter` then checks it fully. ``SHIPPED.json`` in the
package beside each target's folders says how they were trained, whichever root holds the
weights (:mod:`dspark.formats.shipped_record`); a record whose drafter is not on this
machine turns "not found" into one line naming the command that makes it.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from dspark.errors import DsparkError
from dspark.formats.shared_weights import target_fingerprint
from dspark.formats.shipped_record import read_records
from dspark.user_cache import cache_root

DEFAULT_TARGET = "tiny"  # the folder a caller without a loaded target means


def shipped_root() -> Path:
    """``dspark/assets/drafters`` (package data)."""
    return Path(str(resources.files("dspark") / "assets" / "drafters"))


def store_root() -> Path:
    """``<cache_root>/drafters``: shipped drafters kept outside git (``$DSPARK_CACHE`` moves it)."""

    return cache_root() / "drafters"


def drafter_roots() -> list[Path]:
    """Where shipped drafters are looked for, in order: the package, then the store."""
    return [shipped_root(), store_root()]


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
        return record["target_sha256"] == target_fingerprint(target)
    return True


def _find(method: str, target, root: Path) -> Path | None:
    for name in shipped_targets(method, root=root):
        if fits_target(_raw_config(root / name / method), target):
            return root / name / method
    return None


def recorded_target(target) -> str | None:
    """The name of the shipped target that ``target`` is, by the package's records: any method's
    record that names the target's fingerprint (a record's drafter may live in the store)."""

    for name in shipped_targets(root=shipped_root()):
        for record in read_records(shipped_root() / name).values():
            if record.target and fits_target(record.target_fields(), target):
                return name
    return None


def missing_message(name: str, method: str) -> str:
    """The one line for a shipped target's drafter whose weights are not on this machine."""
    return (
        f"the {method} drafter of {name} is not on this machine (its weights live "
        f"outside git, in {store_root() / name / method}): make it with "
        f"`dspark campaign --target {name}` then "
        f"`python scripts/ship_drafters.py --campaign {store_root().parent / 'campaigns' / name} "
        f"--target {name} --methods {method}`, or install a GPU run's drafters with "
        f"`python scripts/device/collect.py`"
    )


def shipped_drafter_dir(method: str, target=None, *, root: Path | None = None) -> Path:
    """The folder of the shipped ``method`` drafter for ``target`` (the tiny target's if None).

    Looked for under ``root`` alone when given, else under :func:`drafter_roots`. Raises a
    one-line :class:`DsparkError`: naming the command that makes it when the package's
    records know this target, else naming the targets that do have one.
    """
    roots = [root] if root is not None else drafter_roots()
    if target is None:
        return roots[0] / DEFAULT_TARGET / method
    for where in roots:
        found = _find(method, target, where)
        if found is not None:
            return found
    if root is None and (name := recorded_target(target)) is not None:
        raise DsparkError(missing_message(name, method))
    have = ", ".join(sorted({n for where in roots for n in shipped_targets(method, root=where)})) or "none"
    raise DsparkError(
        f"no shipped {method} drafter for this target (shipped {method} drafters: {have}); "
        f"train one with `dspark train --drafter {method}` or `dspark campaign`, and pass its folder"
    )
