"""Folders a command writes as a whole, and the one rule for replacing them: never lose data.

A command that produces a folder (a drafter folder, an export, a calibrated copy)
builds it in a temporary sibling and renames it into place (:func:`publish_folder`),
with a marker file (:data:`MARKER`) that names the command and every file it wrote.
An existing folder at that path is replaced only when (:func:`check_replaceable`)

- it is empty, or it holds nothing but the files its marker lists (what a dspark
  command wrote there), or — for folders written before markers existed — nothing but
  the file names the command itself writes (``legacy_names``);
- it is not one of the command's inputs, nor a parent of one (``inputs``);
- the caller allows replacing (``replace``: e.g. ``--force``).

Anything else is refused with a :class:`OutputFolderError` before a byte is written.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from dspark.errors import DsparkError

MARKER = ".dspark-output.json"


class OutputFolderError(DsparkError):
    """An output folder that holds something the command did not write, or its own input."""


def _marker_files(folder: Path) -> set[str] | None:
    """The file names the marker of ``folder`` lists; None without a readable marker."""
    try:
        raw = json.loads((folder / MARKER).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    files = raw.get("files") if isinstance(raw, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return set(files)


def check_replaceable(
    out: Path,
    *,
    flag: str = "--out",
    inputs: Iterable[Path | None] = (),
    replace: bool = True,
    force_hint: str | None = None,
    legacy_names: Iterable[str] = (),
) -> None:
    """Raise :class:`OutputFolderError` unless writing the folder ``out`` loses nothing (module docstring)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputFolderError(f"{flag} {out} exists and is not a folder")
    resolved = out.resolve()
    for source in inputs:
        if source is not None and Path(source).resolve().is_relative_to(resolved):
            raise OutputFolderError(
                f"{flag} {out} holds the input {source}; write to another folder (it would be deleted)"
            )
    if not out.exists():
        return
    entries = {p.name for p in out.iterdir()}
    if not entries:
        return
    listed = _marker_files(out)
    known = (listed | {MARKER}) if listed is not None else set(legacy_names)
    foreign = sorted(entries - known)
    if foreign or not known:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise OutputFolderError(
            f"{flag} {out} holds files dspark did not write there ({shown or 'no marker'}); "
            "refusing to replace it: choose another folder or empty it yourself"
        )
    if not replace:
        raise OutputFolderError(
            f"{flag} {out} exists and is not empty; {force_hint or 'choose another folder'}"
        )


def write_marker(folder: Path, command: str) -> None:
    """Record ``command`` and the files now in ``folder`` (call it once the folder is complete)."""
    files = sorted(p.name for p in folder.iterdir() if p.name != MARKER)
    (folder / MARKER).write_text(json.dumps({"command": command, "files": files}, indent=1) + "\n")


def publish_folder(tmp: Path, folder: Path, *, command: str, **check) -> Path:
    """Move the finished temporary folder ``tmp`` to ``folder``, replacing it only if allowed.

    ``check`` goes to :func:`check_replaceable` (``flag``, ``inputs``, ``replace``, ...);
    on a refusal ``tmp`` is removed and ``folder`` is untouched.
    """
    try:
        write_marker(tmp, command)
        check_replaceable(folder, **check)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700: readable like any other folder
    for f in tmp.iterdir():
        os.chmod(f, 0o644)
    old = None
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        os.replace(folder, old)
    os.replace(tmp, folder)
    if old is not None:
        shutil.rmtree(old)
    return folder
