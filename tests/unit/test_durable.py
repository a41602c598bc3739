"""The one atomic, durable write (dspark/durable.py)."""

from __future__ import annotations

import os

from dspark.durable import fsync_path, write_atomic


def test_write_atomic_replaces_the_whole_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("old")
    assert write_atomic(path, "new ü") == path
    assert path.read_bytes() == "new ü".encode()
    write_atomic(path, b"\x00bytes")
    assert path.read_bytes() == b"\x00bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_named_temporary_and_parent_creation(tmp_path):
    path = tmp_path / "sub" / "deeper" / "latest"
    write_atomic(path, "step_1\n", mkdir=True)
    tmp = path.with_name(".tmp-latest")
    write_atomic(path, "step_2\n", tmp=tmp)
    assert path.read_text() == "step_2\n" and not tmp.exists()
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~_umask()


def test_fsync_path_takes_files_and_folders(tmp_path):
    (tmp_path / "f").write_text("x")
    fsync_path(tmp_path / "f")
    fsync_path(tmp_path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
