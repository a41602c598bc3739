"""Append-only JSONL files that survive being killed at any moment (DESIGN §7.2).

Each record is one line written by a single ``write(2)`` on a file opened with
``O_APPEND``, so concurrent writers never interleave and a killed process leaves at
worst one incomplete last line. :func:`read_jsonl` with ``log=True`` drops (and truncates away) such a
line, so a restarted run appends after the last complete record: no duplicate, no loss.
One run at a time writes a log: :class:`WriterLock` (an advisory ``flock`` on a lock file
beside it, released by the kernel even when the holder is killed) makes a second refuse.
Runs that cooperate on one log (several processes answering one prompt set) share that
lock instead and divide the work with :class:`Claims`; each follows what the others
append with :class:`LogTail`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import time
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
    except ValueError as e:  # an integer of more digits than Python converts
        return None, f"not valid JSON ({str(e).split(';')[0]})"
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


SHARED_TRIES = 50  # a shared writer's attempts, 10 ms apart, before an exclusive holder refuses it


class WriterLock:
    """Exclusive right to append to ``path``: a second holder gets a :class:`DsparkError` at once.

    ``shared=True``: the right to append beside other cooperating writers (each dividing
    the work with :class:`Claims`); refused while an exclusive writer holds it, and the
    other way round.
    """

    def __init__(self, path: str | Path, what: str = "another run", *, shared: bool = False) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.what = what
        self.shared = shared
        self.alone = True  # shared: no other writer held it when this one took it
        self._fd = -1

    def __enter__(self) -> WriterLock:
        # A shared writer holds the lock exclusively for an instant while it looks for others
        # (``alone``): another shared writer starting in that instant tries again, briefly.
        tries = SHARED_TRIES if self.shared else 1
        for attempt in range(tries):
            try:
                return self._take()
            except DsparkError:
                if attempt == tries - 1:
                    raise
                time.sleep(0.01)
        raise AssertionError("unreachable")

    def _take(self) -> WriterLock:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if self.shared:  # first taking it whole says whether any other writer is there
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self.alone = True
                except OSError:
                    self.alone = False
            fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            raise DsparkError(
                f"{self.what} (pid {holder or '?'}) is writing {self.path}; wait for it to finish, "
                "or write to another file"
            ) from None
        if not self.shared:  # cooperating writers leave the pid of none of them
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


class Claims:
    """Which of several cooperating processes works on which key.

    A claim is an ``flock`` on ``<root>/<digest of the key>``, held while the key is worked
    on. The kernel releases it when the holder dies, so a killed process's keys are free
    again at once; nothing has to be cleaned up for that. Files are never removed while
    the work goes on (removing one could let two processes lock two different files for
    the same key); whoever finishes the whole set may remove the folder.

    Releasing a claim does not say the key is done: a taker checks its own record of
    what is done after :meth:`take` succeeds (the holder writes its result before it
    releases, so that check sees it).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._held: dict[str, int] = {}

    def _file(self, key: str) -> Path:
        return self.root / hashlib.sha256(key.encode()).hexdigest()[:32]

    def take(self, key: str) -> bool:
        """Claim ``key``: False at once when another holder has it."""
        if key in self._held:
            return True
        self.root.mkdir(parents=True, exist_ok=True)  # again if a finished set's was removed
        fd = os.open(self._file(key), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            return False
        self._held[key] = fd
        return True

    def release(self, key: str) -> None:
        fd = self._held.pop(key, -1)
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def close(self) -> None:
        for key in list(self._held):
            self.release(key)


class LogTail:
    """The records appended to a :class:`JsonlAppender` log since the last :meth:`read`.

    Reads only new bytes and only complete lines (a line another process is writing is
    read next time); never repairs the file, which other writers may be appending to.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        records = []
        for line in data[:end].split(b"\n"):
            if line.strip():
                record, problem = _decode(line)
                if problem is None:
                    records.append(record)
                else:
                    logger.warning("%s: skipping a corrupt record (%s)", self.path, problem)
        return records
