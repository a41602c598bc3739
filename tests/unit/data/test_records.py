import json

import pytest

from dspark.data.records import JsonlAppender, read_records
from dspark.errors import DsparkError


def test_append_then_read(tmp_path):
    path = tmp_path / "sub" / "log.jsonl"
    with JsonlAppender(path) as log:
        log.append({"id": "a", "text": "ü\nline"})
        log.append({"id": "b"})
    assert read_records(path) == [{"id": "a", "text": "ü\nline"}, {"id": "b"}]
    assert read_records(tmp_path / "missing.jsonl") == []


def test_incomplete_last_line_is_dropped_and_truncated(tmp_path):
    """What a kill in the middle of a write leaves behind; the next append starts cleanly."""
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"id": "a"}) + "\n" + '{"id": "b", "te')
    assert read_records(path, repair=False) == [{"id": "a"}]
    assert path.read_text().endswith('"te')  # untouched without repair
    assert read_records(path) == [{"id": "a"}]
    with JsonlAppender(path) as log:
        log.append({"id": "c"})
    assert read_records(path) == [{"id": "a"}, {"id": "c"}]


def test_corrupt_middle_line_raises_with_its_number(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"id": "a"}\n{oops\n{"id": "c"}\n')
    with pytest.raises(DsparkError, match=r"log.jsonl:2: corrupt record"):
        read_records(path)
