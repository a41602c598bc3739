"""Resumable stages: a stage's summary is written last, so its presence means "done".

``<run>/stages/<name>.json`` holds ``{"key": ..., "summary": ..., "seconds": ...}``. A
rerun with the same key returns the stored summary without running the stage; a
different key (another plan, another input) reruns it, and everything downstream of it
sees new inputs through its own key. ``<name>.started.json`` records the key a stage was
last started with: an interrupted stage restarted with the same key keeps its partial
outputs (regeneration and training resume from them); with another key they are removed
first, so no output mixes two plans.

A stage runs under an exclusive lock (``<name>.lock``, ``flock``): two processes sharing
one folder — a campaign run once per core with its methods in different orders — never
run the same stage at once; the second waits, then finds the stage done and skips it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark.durable import write_atomic
from dspark.output_folders import claim_outputs
from dspark.threads import load_average


@dataclass
class StageLog:
    """What happened to each stage in this invocation (for the report and the console)."""

    ran: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of each stage when it ran
    # 1-minute load average at the start and the end of each stage when it ran (None: unknown)
    loads: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)


class Stages:
    def __init__(self, root: Path, *, announce: Callable[[str], None] = print) -> None:
        self.root = root
        self.log = StageLog()
        self.announce = announce

    def marker(self, name: str) -> Path:
        return self.root / "stages" / f"{name}.json"

    def done(self, name: str, key: dict[str, Any]) -> dict[str, Any] | None:
        """The stored record of ``name`` when it finished with this ``key``, else None."""
        path = self.marker(name)
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError:
            return None
        return record if record.get("key") == json.loads(json.dumps(key)) else None

    def run(
        self,
        name: str,
        key: dict[str, Any],
        fn: Callable[[], dict[str, Any]],
        outputs: tuple[Path, ...] = (),
    ) -> dict[str, Any]:
        """``fn()``'s summary, or the stored one when ``name`` already finished with ``key``.

        ``outputs`` are the files and folders the stage writes and may resume from.
        """
        with self._lock(name):
            return self._run(name, key, fn, outputs)

    def run_shared(
        self,
        name: str,
        key: dict[str, Any],
        fn: Callable[[], dict[str, Any]],
        help_fn: Callable[[], Any],
        helping: str,
        outputs: tuple[Path, ...] = (),
    ) -> dict[str, Any]:
        """:meth:`run` for a stage whose work can be shared: a process that finds another
        running ``name`` with ``key`` calls ``help_fn()`` beside it (announced as ``helping``)
        before it waits for the stage. Looked at before the lock and again when the lock is
        found held, so a process arriving just before the holder takes it still helps."""

        def help_if_running() -> bool:
            if self.done(name, key) is not None or not self.running_with(name, key):
                return False
            self.announce(f"… {name}: another process is running it; {helping}")
            help_fn()
            return True

        helped = help_if_running()
        with self._lock(name, on_held=None if helped else help_if_running):
            return self._run(name, key, fn, outputs)

    def running_with(self, name: str, key: dict[str, Any], *, settle_s: float = 10.0) -> bool:
        """Whether another process is running ``name`` now, started with ``key``.

        A stage whose work can be shared (the campaign's regeneration) lets a process
        that finds it so help instead of only waiting. A holder writes the started marker
        just after taking the lock; for up to ``settle_s`` this waits for that marker.
        """
        path = self.marker(name).with_suffix(".lock")
        started = self.marker(name).with_suffix(".started.json")
        want = json.loads(json.dumps(key))
        deadline = time.monotonic() + settle_s
        while path.is_file():
            with open(path, "a") as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass  # held: running
                else:
                    fcntl.flock(handle, fcntl.LOCK_UN)
                    return False
            try:
                if json.loads(started.read_text()) == want:
                    return True
            except (OSError, json.JSONDecodeError):
                pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
        return False

    @contextlib.contextmanager
    def _lock(self, name: str, on_held: Callable[[], bool] | None = None) -> Iterator[None]:
        """Hold ``stages/<name>.lock``; while another process holds it, call ``on_held`` (if
        given), say so and wait."""
        path = self.marker(name).with_suffix(".lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_held is not None:
                    on_held()
                self.announce(f"… {name}: another process is running it; waiting for it to finish")
                fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _run(
        self,
        name: str,
        key: dict[str, Any],
        fn: Callable[[], dict[str, Any]],
        outputs: tuple[Path, ...],
    ) -> dict[str, Any]:
        record = self.done(name, key)
        if record is not None:
            self.announce(f"· {name}: done in an earlier run ({record['seconds']:.0f} s), skipped")
            self.log.resumed.append(name)
            self.log.seconds[name] = record["seconds"]
            self.log.loads[name] = tuple(record.get("load", (None, None)))
            return record["summary"]
        started_marker = self.marker(name).with_suffix(".started.json")
        if started_marker.is_file() and json.loads(started_marker.read_text()) != json.loads(json.dumps(key)):
            for path in outputs:  # written under another plan: start over
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        self.marker(name).unlink(missing_ok=True)
        write_atomic(started_marker, json.dumps(key) + "\n", mkdir=True)
        self.announce(f"▶ {name}")
        started, load_start = time.perf_counter(), load_average()
        try:
            summary = fn()
        except KeyboardInterrupt:
            self.announce(
                f"✗ {name} interrupted; finished stages are kept in {self.root}"
                + (
                    f" ({', '.join(self.log.ran + self.log.resumed)})"
                    if self.log.ran or self.log.resumed
                    else ""
                )
                + ". Rerun the same command to resume: finished stages are skipped and an interrupted "
                "training stage continues from its last checkpoint."
            )
            raise
        seconds = time.perf_counter() - started
        load = (load_start, load_average())
        record = {"key": key, "summary": summary, "seconds": round(seconds, 2), "load": load}
        write_atomic(self.marker(name), json.dumps(record, indent=1) + "\n", mkdir=True)
        self.announce(f"✓ {name} ({seconds:.0f} s)")
        self.log.ran.append(name)
        self.log.seconds[name] = round(seconds, 2)
        self.log.loads[name] = load
        return summary


def claim_run_folder(out: Path, names: tuple[str, ...], *, command: str, force: bool = False) -> None:
    """Claim a pipeline's top-level ``names`` in ``out`` (:func:`dspark.output_folders.claim_outputs`).

    A folder whose ``stages/`` already holds stage records is a run of this pipeline from
    before claims existed: those records are its markers, so it is claimed as is.
    """

    legacy = any((out / "stages").glob("*.json"))
    claim_outputs(out, names, command=command, force=force or legacy)
