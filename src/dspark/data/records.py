"""Append-only JSONL files that survive being killed at any moment (SPEC §7.2).

Each record is one line written by a single ``write(2)`` on a file opened with
``O_APPEND``, so concurrent writers never interleave and a killed process leaves at
worst one incomplete last line. :func:`read_jsonl` with ``log=True`` drops (and truncates away) such a
line, so a restarted run appends after the last complete record: no duplicate, no loss.
One run at a time writes a log: :class:`WriterLock` (an advisory ``flock`` on a lock file
beside it, released by the kernel even when the holder is killed) makes a second refuse.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any

from dspark.errors import DsparkError

logger = logging.getLogger(__name__)


class DataError(DsparkError):
    """A training record or the tokenizer cannot produce a training sample."""


def parse_record(raw: bytes, where: str) -> dict[str, Any]:
    """One JSONL line as a JSON object; ``where`` (``path:line``) starts the error message."""
    record, problem = _decode(raw)
    if problem is not None:
        raise DataError(f"{where}: {problem}")
    return record


def _decode(raw: bytes) -> tuple[Any, str | None]:
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 text (byte {e.start})"
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg})"
    if not isinstance(record, dict):
        return None, f"expected a JSON object, got {type(record).__name__}"
    return record, None


def read_jsonl(path: str | Path, *, log: bool = False, repair: bool = True) -> list[dict[str, Any]]:
    """The records of a JSONL file, one JSON object per line, blank lines skipped.

    The one difference between the two kinds of file is ``log``:

    - ``log=False``, data a user gives (training records): the file must exist, and every
      line must be a JSON object, the last one with or without its newline.
    - ``log=True``, an append-only log of :class:`JsonlAppender`: a missing file is ``[]``
      (nothing written yet) and an unterminated last line is what a kill mid-write leaves:
      it is dropped and, with ``repair``, truncated away so that appends continue cleanly.
      A broken line anywhere else is a real corruption and raises.
    """
    path = Path(path)
    if log and not path.exists():
        return []
    if not path.is_file():
        raise DataError(f"no training data at {path}")
    data = path.read_bytes()
    end = len(data)
    if log:
        end = data.rfind(b"\n") + 1  # bytes up to and including the last newline
        if end < len(data):
            logger.warning("%s: dropping an incomplete last line (%d bytes)", path, len(data) - end)
            if repair:
                with open(path, "r+b") as f:
                    f.truncate(end)
    records = []
    for n, line in enumerate(data[:end].split(b"\n"), start=1):
        if not line.strip():
            continue
        if not log:
            records.append(parse_record(line, f"{path}:{n}"))
            continue
        record, problem = _decode(line)
        if problem is not None:
            raise DataError(f"{path}:{n}: corrupt record ({problem}); fix or remove that line")
        records.append(record)
    return records


class JsonlAppender:
    """Appends one JSON record per line, each with a single ``write`` call."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        written = os.write(self._fd, line)
        while written < len(line):  # regular files write fully; a short write just continues
            written += os.write(self._fd, line[written:])

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class WriterLock:
    """Exclusive right to append to ``path``: a second holder gets a :class:`DsparkError` at once."""

    def __init__(self, path: str | Path, what: str = "another run") -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.what = what
        self._fd = -1

    def __enter__(self) -> WriterLock:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            raise DsparkError(
                f"{self.what} (pid {holder or '?'}) is writing {self.path}; wait for it to finish, "
                "or write to another file"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
