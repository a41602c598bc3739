"""What dspark may overwrite: only what a marker says it wrote. Never lose data.

A folder or file is dspark's only when the marker file of its folder (:data:`MARKER`)
lists it under a *claim* naming the command that wrote it and the run it belongs to.
Anything else — a user's folder, a drafter folder copied in by hand, a file of the same
name as one a command writes — is the user's: a command refuses it in one line that names
``--force``, and ``--force`` lets the command overwrite only its own outputs (never a file
whose name the command does not write).

Two kinds of outputs:

- a folder written as a whole (a drafter folder, an export, a calibrated copy): built in
  a temporary sibling and renamed into place by :func:`publish_folder`, with a marker
  claiming every file in it. An existing folder there is replaced when
  :func:`check_replaceable` allows it: it is empty, or this command wrote it for this run
  (``run``: e.g. the training run's id), or ``force`` is given and it holds only file names
  the command itself writes (``names``). It is never one of the command's inputs nor a
  parent of one; a symbolic link is followed to the folder it names.
- named entries in a folder shared with the user (a training run's ``metrics.jsonl``, a
  report's ``calibration.md``): :func:`claim_outputs` refuses the names that exist
  unclaimed, then records its claim, so that a rerun may overwrite them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dspark.durable import write_atomic
from dspark.errors import DsparkError

MARKER = ".dspark-output.json"


class OutputFolderError(DsparkError):
    """An output that holds something the command did not write, or its own input."""


@dataclass(frozen=True)
class Claim:
    """Entries of a folder that ``dspark <command>`` wrote for ``run`` (None: a marker without one)."""

    command: str
    run: str | None
    files: frozenset[str]


def _claim(raw) -> Claim | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("command"), str):
        return None
    files, run = raw.get("files"), raw.get("run")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return Claim(raw["command"], run if isinstance(run, str) else None, frozenset(files))


def read_claims(folder: Path) -> list[Claim]:
    """The claims of ``folder``'s marker (a whole folder's, or a shared folder's list); [] without one."""
    try:
        raw = json.loads((Path(folder) / MARKER).read_text())
    except (OSError, UnicodeDecodeError, ValueError):  # ValueError: bad JSON, a 5,000-digit integer
        return []
    listed = raw.get("outputs") if isinstance(raw, dict) and "outputs" in raw else [raw]
    claims = [_claim(c) for c in listed] if isinstance(listed, list) else []
    return [c for c in claims if c is not None]


def _shown(names: Iterable[str]) -> str:
    names = sorted(names)
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def output_path(out: Path, flag: str = "--out") -> Path:
    """``out``, or the folder it names when it is a symbolic link (replaced there, the link kept);
    refused when a file stands where it or one of its parent folders would be."""
    out = Path(out)
    if out.is_symlink() and not out.exists():
        raise OutputFolderError(f"{flag} {out} is a broken symbolic link; remove it or give another path")
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                raise OutputFolderError(f"{flag} {out}: {path} exists and is not a folder")
            break
    return out.resolve() if out.is_symlink() else out


def check_not_input(out: Path, inputs: Iterable[str | Path | None], flag: str = "--out") -> None:
    """Refuse an output file that is one of the command's input files (it would be overwritten,
    or appended to while it is read); ``inputs`` that name no file (a built-in set) are skipped."""
    out = Path(out)
    for source in inputs:
        if source is None or not Path(source).is_file():
            continue
        if out.exists() and os.path.samefile(out, source) or out.resolve() == Path(source).resolve():
            raise OutputFolderError(f"{flag} {out} is the input {source}; write to another file")


def temp_folder(folder: Path, flag: str = "--out") -> Path:
    """A new empty hidden folder beside where ``folder`` will be written (a link's folder), for
    :func:`publish_folder` to rename into place (a rename does not cross file systems)."""
    folder = output_path(folder, flag)
    folder.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))


def check_replaceable(
    out: Path,
    *,
    command: str,
    run: str | None = None,
    flag: str = "--out",
    inputs: Iterable[Path | None] = (),
    force: bool = False,
    names: Iterable[str] = (),
    own_needs_force: bool = False,
) -> Path:
    """Raise :class:`OutputFolderError` unless ``dspark <command>`` may replace the folder ``out``
    (module docstring); returns the path it will be written at (a link's folder).

    ``own_needs_force``: even a folder this command wrote for this run is replaced only
    with ``force`` (``dspark export``, whose ``--out`` is asked to be new).
    """
    shown_out = out
    out = output_path(out, flag)
    resolved = out.resolve()
    for source in inputs:
        if source is not None and Path(source).resolve().is_relative_to(resolved):
            raise OutputFolderError(
                f"{flag} {shown_out} holds the input {source}; write to another folder (it would be deleted)"
            )
    entries = {p.name for p in out.iterdir()} if out.exists() else set()
    if not entries:
        return out
    claims = read_claims(out)
    listed = set().union(*(c.files for c in claims), {MARKER}) if claims else set()
    unknown = entries - listed - set(names)
    if unknown:
        raise OutputFolderError(
            f"{flag} {shown_out} holds files dspark did not write there ({_shown(unknown)}); refusing to "
            "replace it, even with --force: choose another folder or empty it yourself"
        )
    ours = any(c.command == command and c.run == run and entries <= c.files | {MARKER} for c in claims)
    if force or (ours and not own_needs_force):
        return out
    if ours:
        whose = ""
    elif claims:
        whose = f": it holds what `dspark {claims[0].command}` wrote for another run or command"
    else:
        whose = f": it holds {_shown(entries)}, which no dspark marker claims"
    raise OutputFolderError(f"{flag} {shown_out} exists and is not empty{whose}; pass --force to replace it")


def _write_claims(folder: Path, claims: list[Claim]) -> None:
    raw = [{"command": c.command, "run": c.run, "files": sorted(c.files)} for c in claims]
    body = raw[0] if len(raw) == 1 else {"outputs": raw}
    write_atomic(folder / MARKER, json.dumps(body, indent=1) + "\n")


def write_marker(folder: Path, command: str, run: str | None = None) -> None:
    """Claim every file now in ``folder`` for ``command`` and ``run`` (once the folder is complete)."""
    files = frozenset(p.name for p in folder.iterdir() if p.name != MARKER)
    _write_claims(folder, [Claim(command, run, files)])


def claim_outputs(
    folder: Path,
    names: Iterable[str],
    *,
    command: str,
    flag: str = "--out",
    force: bool = False,
    write: bool = True,
) -> str | None:
    """Claim the entries ``names`` of the shared ``folder`` for ``command``; returns the claim's run id.

    An entry that exists and no claim of ``command`` lists is the user's: refused unless
    ``force``, which takes over those names only. Other commands' claims stay, less the
    names taken over. The folder is created if needed. Without ``write``, only the check:
    the run id of an existing claim, else None (every rank checks; one writes).
    """
    folder = output_path(folder, flag)
    names = frozenset(names)
    claims = read_claims(folder) if folder.is_dir() else []
    mine = next((c for c in claims if c.command == command), None)
    owned = mine.files if mine is not None else frozenset()
    taken = sorted(n for n in names - owned if os.path.lexists(folder / n))
    if taken and not force:
        raise OutputFolderError(
            f"{flag} {folder} already holds {_shown(taken)}, which no `dspark {command}` marker there "
            f"claims; pass --force to overwrite {'it' if len(taken) == 1 else 'them'} "
            "(nothing else in the folder is touched), or choose another folder"
        )
    if not write:
        return mine.run if mine is not None else None
    run = mine.run if mine is not None and mine.run else uuid.uuid4().hex
    others = [Claim(c.command, c.run, c.files - names) for c in claims if c is not mine]
    folder.mkdir(parents=True, exist_ok=True)
    _write_claims(folder, [Claim(command, run, owned | names), *others])
    return run


def publish_folder(tmp: Path, folder: Path, *, command: str, run: str | None = None, **check) -> Path:
    """Move the finished temporary folder ``tmp`` to ``folder``, replacing it only if allowed.

    ``check`` goes to :func:`check_replaceable` (``flag``, ``inputs``, ``force``, ...);
    on a refusal ``tmp`` is removed and ``folder`` is untouched. A link at ``folder``
    stays: the folder it names is replaced.
    """
    try:
        write_marker(tmp, command, run)
        folder = check_replaceable(folder, command=command, run=run, **check)
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
    try:
        os.replace(tmp, folder)
    except BaseException:
        if old is not None:
            os.replace(old, folder)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old)
    return folder
