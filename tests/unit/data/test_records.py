import json

import pytest

from dspark.data.records import JsonlAppender, read_jsonl
from dspark.errors import DsparkError


def test_append_then_read(tmp_path):
    path = tmp_path / "sub" / "log.jsonl"
    with JsonlAppender(path) as log:
        log.append({"id": "a", "text": "ü\nline"})
        log.append({"id": "b"})
    assert read_jsonl(path, log=True) == [{"id": "a", "text": "ü\nline"}, {"id": "b"}]
    assert read_jsonl(tmp_path / "missing.jsonl", log=True) == []


def test_incomplete_last_line_is_dropped_and_truncated(tmp_path):
    """What a kill in the middle of a write leaves behind; the next append starts cleanly."""
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"id": "a"}) + "\n" + '{"id": "b", "te')
    assert read_jsonl(path, log=True, repair=False) == [{"id": "a"}]
    assert path.read_text().endswith('"te')  # untouched without repair
    assert read_jsonl(path, log=True) == [{"id": "a"}]
    with JsonlAppender(path) as log:
        log.append({"id": "c"})
    assert read_jsonl(path, log=True) == [{"id": "a"}, {"id": "c"}]


def test_corrupt_middle_line_raises_with_its_number(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"id": "a"}\n{oops\n{"id": "c"}\n')
    with pytest.raises(DsparkError, match=r"log.jsonl:2: corrupt record"):
        read_jsonl(path, log=True)


def test_data_and_log_rules_differ_only_where_the_option_says(tmp_path):
    """A user's file may end without a newline; a log's unterminated line is a torn write."""
    from dspark.data.records import DataError

    path = tmp_path / "data.jsonl"
    path.write_text('{"id": "a"}\n\n{"id": "b"}')
    assert read_jsonl(path) == [{"id": "a"}, {"id": "b"}]
    assert read_jsonl(path, log=True, repair=False) == [{"id": "a"}]
    with pytest.raises(DataError, match="no training data at"):
        read_jsonl(tmp_path / "missing.jsonl")
    path.write_text('{"id": "a"}\n[1]\n')
    with pytest.raises(DataError, match=r"data.jsonl:2: expected a JSON object, got list"):
        read_jsonl(path)
    with pytest.raises(DataError, match=r"data.jsonl:2: corrupt record"):
        read_jsonl(path, log=True)
