import json
import sys

import pytest

from dspark.data.prompts import (
    Prompt,
    domain_counts,
    load_prompt_sets,
    load_prompts,
    split_prompts,
    write_prompts,
)
from dspark.errors import DsparkError


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_conversations_keep_system_and_user_turns_sharegpt_too(tmp_path):
    path = _write(
        tmp_path / "c.jsonl",
        [
            {
                "conversations": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "q1"},
                    {"role": "assistant", "content": "a"},
                    {"role": "user", "content": "q2"},
                ]
            },
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
            {"messages": [{"role": "user", "content": "m"}], "domain": "math"},
        ],
    )
    p = load_prompts(path)
    assert (p[0].turns, p[0].system, p[0].domain) == (("q1", "q2"), "be brief", "c")
    assert (p[1].turns, p[1].system) == (("hi",), None)
    assert p[2].domain == "math"


def test_key_ignores_surrounding_whitespace_but_not_system_or_order():
    a = Prompt(("x", "y"))
    assert a.key == Prompt((" x\n", "y"), domain="other", source="s").key
    assert a.key != Prompt(("y", "x")).key
    assert a.key != Prompt(("x", "y"), system="s").key


def test_dedup_keeps_first_and_domains_filter(tmp_path):
    one = _write(tmp_path / "one.jsonl", [{"turns": ["a"]}, {"turns": ["b"], "domain": "code"}])
    two = _write(tmp_path / "two.jsonl", [{"turns": ["a "]}, {"turns": ["c"]}])
    prompts = load_prompt_sets([one, two])
    assert [p.turns for p in prompts] == [("a",), ("b",), ("c",)]
    assert prompts[0].domain == "one"
    assert len(load_prompt_sets([one, two], dedup=False)) == 4
    assert [p.turns for p in load_prompt_sets([one, two], domains=["code"])] == [("b",)]
    assert domain_counts(prompts) == {"one": 1, "code": 1, "two": 1}
    with pytest.raises(DsparkError, match="no prompts left"):
        load_prompt_sets([one], domains=["chat"])


def test_split_is_deterministic_exact_and_order_free():
    prompts = [Prompt((f"q{i}",)) for i in range(50)]
    split = split_prompts(prompts, 0.2, seed=3)
    assert len(split.eval) == 10 and len(split.train) == 40
    assert {p.key for p in split.eval}.isdisjoint(p.key for p in split.train)
    again = split_prompts(list(reversed(prompts)), 0.2, seed=3)
    assert {p.key for p in again.eval} == {p.key for p in split.eval}
    assert {p.key for p in split_prompts(prompts, 0.2, seed=4).eval} != {p.key for p in split.eval}
    assert split_prompts(prompts, 0.0, seed=0).eval == []
    with pytest.raises(DsparkError):
        split_prompts(prompts, 1.0, seed=0)


def test_written_prompts_read_back_identically(tmp_path):
    prompts = [Prompt(("a", "b"), "math", "f:1", "sys"), Prompt(("c",), "code", "f:2")]
    write_prompts(prompts, tmp_path / "out.jsonl")
    back = load_prompts(str(tmp_path / "out.jsonl"))
    assert [(p.turns, p.domain, p.system, p.key) for p in back] == [
        (p.turns, p.domain, p.system, p.key) for p in prompts
    ]


def test_hf_dataset_errors_are_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(DsparkError, match="needs the 'datasets' package"):
        load_prompts("hf:org/name")

    class Offline:
        @staticmethod
        def load_dataset(name, split):
            raise ConnectionError("Couldn't reach 'org/name' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setitem(sys.modules, "datasets", Offline)
    with pytest.raises(DsparkError, match=r"'org/name' split 'test' .*Couldn't reach") as info:
        load_prompts("hf:org/name:test")
    assert "\n" not in str(info.value)


def test_hf_rows_become_prompts(monkeypatch):
    class Fake:
        @staticmethod
        def load_dataset(name, split):
            assert (name, split) == ("org/chat-set", "train")
            return [{"prompt": "hello"}, {"messages": [{"role": "user", "content": "hi"}]}]

    monkeypatch.setitem(sys.modules, "datasets", Fake)
    prompts = load_prompts("hf:org/chat-set")
    assert [p.turns for p in prompts] == [("hello",), ("hi",)]
    assert {p.domain for p in prompts} == {"chat-set"}
    assert prompts[1].source == "hf:org/chat-set:1"
