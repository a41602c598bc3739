import json

import pytest

from dspark.data.prompts import load_prompts
from dspark.errors import DsparkError


def test_turns_and_conversations(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"turns": ["a", "b"]})
        + "\n\n"
        + json.dumps(
            {
                "conversations": [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "x"},
                ]
            }
        )
        + "\n"
    )
    prompts = load_prompts(str(path))
    assert [p.turns for p in prompts] == [("a", "b"), ("q",)]
    assert prompts[0].domain == "p"
    assert load_prompts(str(path), limit=1)[0].turns == ("a", "b")


def test_broken_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"turns": ["a"]}) + "\n{not json\n")
    with pytest.raises(DsparkError, match=r"bad.jsonl:2"):
        load_prompts(str(path))


def test_unknown_set():
    with pytest.raises(DsparkError, match="no prompt set"):
        load_prompts("no-such-set")


@pytest.mark.parametrize("domain", ["math", "code", "chat"])
def test_builtin_sets(domain):
    prompts = load_prompts(domain)
    assert len(prompts) >= 20
    assert all(p.domain == domain and p.turns[0] for p in prompts)
