"""A shared writer starting while another shared writer probes (an instant's exclusive hold)
joins it; an exclusive writer that stays is still refused."""

from __future__ import annotations

import fcntl
import os
import threading

import pytest

from dspark.data.records import WriterLock
from dspark.errors import DsparkError


def hold_exclusively(lock_path, seconds: float) -> threading.Thread:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)

    def release():
        threading.Event().wait(seconds)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    thread = threading.Thread(target=release)
    thread.start()
    return thread


def test_a_shared_writer_waits_out_another_ones_probe(tmp_path):
    out = tmp_path / "out.jsonl"
    probe = hold_exclusively(tmp_path / "out.jsonl.lock", 0.05)  # another writer's instant
    with WriterLock(out, shared=True) as lock:
        assert lock._fd >= 0
    probe.join()


def test_an_exclusive_holder_still_refuses_a_shared_writer(tmp_path):
    out = tmp_path / "out.jsonl"
    holder = hold_exclusively(tmp_path / "out.jsonl.lock", 2.0)  # an exclusive regeneration
    with pytest.raises(DsparkError, match="is writing"):
        WriterLock(out, shared=True).__enter__()
    holder.join()
