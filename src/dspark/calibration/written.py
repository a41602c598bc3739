"""Where ``dspark calibrate`` writes the fitted temperatures (SPEC §8): into the drafter folder,
or into a calibrated copy (``--save-to``) that never replaces a folder dspark did not write
nor one that holds the source (:mod:`dspark.output_folders`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path


def write_temperatures(folder: Path, temperatures: tuple[float, ...]) -> None:
    """Set ``sts_temperatures`` in ``folder/config.json`` atomically; weights are untouched."""
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    raw["sts_temperatures"] = [float(t) for t in temperatures]
    fd, tmp = tempfile.mkstemp(prefix=".config.", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _check(folder: Path) -> dict:
    from dspark.drafters.folder import DRAFTER_FILES

    return {"flag": "--save-to", "inputs": [folder], "legacy_names": DRAFTER_FILES}


def check_save_to(folder: Path, save_to: Path) -> None:
    """Refuse a ``--save-to`` that would lose data, before any work is done."""
    from dspark.output_folders import check_replaceable

    check_replaceable(save_to, **_check(folder))


def save_calibrated_copy(folder: Path, save_to: Path, temperatures: tuple[float, ...]) -> Path:
    """A copy of the drafter folder with the temperatures, at ``save_to``: never replacing a
    folder dspark did not write, nor one that holds the source (:mod:`dspark.output_folders`)."""
    from dspark.drafters.folder import DRAFTER_FILES
    from dspark.output_folders import publish_folder

    check = _check(folder)
    check_save_to(folder, save_to)  # before anything is copied
    save_to.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{save_to.name}.", dir=save_to.parent))
    try:
        for name in DRAFTER_FILES:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, tmp / name)
        write_temperatures(tmp, temperatures)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return publish_folder(tmp, save_to, command="calibrate", **check)
