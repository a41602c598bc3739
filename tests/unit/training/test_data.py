"""Training records → ids + assistant loss mask, and the sharded resumable order (DESIGN §6, §7)."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.data.records import read_jsonl
from dspark.data.samples import (
    DataError,
    ShardedSampler,
    TrainDataset,
    collate,
    conversation_of,
    tokenize_conversation,
    tokenize_records,
)
from dspark.tiny.tokenizer import render_chat, train_tokenizer

# Qwen3-like: earlier replies lose their <think>...</think> part, the last one keeps it.
REWRITING_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' and not loop.last %}"
    "{{- '<|im_start|>assistant\\n' + m['content'].split('</think>')[-1] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is two plus three?"},
    {"role": "assistant", "content": "It is five."},
    {"role": "user", "content": "And four plus four?"},
    {"role": "assistant", "content": "Eight, of course."},
]


@pytest.fixture(scope="module")
def tokenizer():
    texts = [render_chat(m["content"], "It is five. Eight, of course.") for m in CONVO] * 3
    return train_tokenizer(texts + ["Be brief. What is two plus three? And four plus four?"], 300)


def _supervised_text(tok, sample) -> str:
    return tok.decode(sample.input_ids[sample.loss_mask].tolist())


def test_mask_covers_exactly_the_replies_and_their_end_of_turn(tokenizer):
    sample = tokenize_conversation(tokenizer, CONVO, max_length=512)
    expected = tokenizer.apply_chat_template(CONVO, tokenize=True)  # BatchEncoding in transformers 5
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert sample.input_ids.tolist() == list(expected)  # same ids as the template's own tokenization
    assert _supervised_text(tokenizer, sample) == "It is five.<|im_end|>Eight, of course.<|im_end|>"
    # Every supervised run starts right after "<|im_start|>assistant\n".
    mask = sample.loss_mask.tolist()
    starts = [i for i in range(1, len(mask)) if mask[i] and not mask[i - 1]]
    assert [tokenizer.decode(sample.input_ids[i - 3 : i].tolist()) for i in starts] == [
        "<|im_start|>assistant\n"
    ] * 2


def test_record_shapes_agree(tokenizer):
    turns = {"system": "Be brief.", "turns": ["What is two plus three?", "And four plus four?"],
             "answers": ["It is five.", "Eight, of course."]}  # fmt: skip
    sharegpt = {"conversations": [{"from": "system", "value": "Be brief."}] + [
        {"from": "human" if m["role"] == "user" else "gpt", "value": m["content"]} for m in CONVO[1:]
    ]}  # fmt: skip
    responses = {**{k: v for k, v in turns.items() if k != "answers"}, "responses": turns["answers"]}
    for record in (turns, sharegpt, responses):
        assert conversation_of(record) == CONVO
    with pytest.raises(DataError, match="record"):
        conversation_of({"prompt": "x"})
    with pytest.raises(DataError, match="2 answers for 1 turns"):
        conversation_of({"turns": ["a"], "answers": ["b", "c"]})


def test_history_rewriting_template(tokenizer):
    tok = train_tokenizer(["<think>hmm</think>It is five. Eight, of course."] * 3, 300)
    tok.chat_template = REWRITING_TEMPLATE
    convo = [CONVO[1], {"role": "assistant", "content": "<think>hmm</think>It is five."}, *CONVO[3:]]
    sample = tokenize_conversation(tok, convo, max_length=512)
    assert _supervised_text(tok, sample) == "It is five.<|im_end|>Eight, of course.<|im_end|>"


def test_truncation_and_skipping(tokenizer, tmp_path):
    full = tokenize_conversation(tokenizer, CONVO, max_length=512)
    first = int(full.loss_mask.long().argmax())  # the first reply token
    cut = tokenize_conversation(tokenizer, CONVO, max_length=first + 2)
    assert cut.input_ids.tolist() == full.input_ids[: first + 2].tolist()
    assert cut.loss_mask.tolist() == full.loss_mask[: first + 2].tolist()
    assert tokenize_conversation(tokenizer, CONVO, max_length=first) is None  # no reply left
    path = tmp_path / "data.jsonl"
    rows = [
        {"conversations": CONVO},
        {"conversations": CONVO[:2]},
        {"turns": ["hi"], "answers": ["It is five."]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    dataset = tokenize_records(read_jsonl(path), tokenizer, max_length=512)
    assert len(dataset) == 2  # the reply-less record is skipped
    with pytest.raises(DataError, match="no training samples"):
        tokenize_records(rows[1:2], tokenizer)
    with pytest.raises(DataError, match="no chat template"):
        tokenizer_without = train_tokenizer(["a b"], 260)
        tokenizer_without.chat_template = None
        tokenize_conversation(tokenizer_without, CONVO, max_length=10)


def test_collate_pads_right_unsupervised(tokenizer):
    a = tokenize_conversation(tokenizer, CONVO, max_length=512)
    b = tokenize_conversation(tokenizer, CONVO[:3], max_length=512)
    batch = collate([b, a], pad_id=7)
    n = b.input_ids.numel()
    assert batch.input_ids.shape == (2, a.input_ids.numel()) and batch.num_tokens == n + a.input_ids.numel()
    assert (batch.input_ids[0, n:] == 7).all() and not batch.loss_mask[0, n:].any()
    assert torch.equal(batch.input_ids[1], a.input_ids) and torch.equal(batch.loss_mask[1], a.loss_mask)


def test_fingerprint_changes_with_content(tokenizer):
    a = tokenize_conversation(tokenizer, CONVO, max_length=512)
    b = tokenize_conversation(tokenizer, CONVO[:3], max_length=512)
    assert TrainDataset([a, b]).fingerprint == TrainDataset([a, b]).fingerprint
    assert TrainDataset([a, b]).fingerprint != TrainDataset([b, a]).fingerprint


# -- order ------------------------------------------------------------------------------------


def _steps(sampler, n):
    return [sampler.next_step() for _ in range(n)]


def test_epochs_are_seeded_permutations_back_to_back():
    s = ShardedSampler(5, global_batch=2, micro_batch=1, rank=0, world_size=1, seed=3)
    flat = [i for step in _steps(s, 5) for mb in step for i in mb.indices]
    assert sorted(flat[:5]) == sorted(flat[5:]) == list(range(5)) and flat[:5] != flat[5:]
    again = ShardedSampler(5, global_batch=2, micro_batch=1, rank=0, world_size=1, seed=3)
    assert [i for step in _steps(again, 5) for mb in step for i in mb.indices] == flat
    other = ShardedSampler(5, global_batch=2, micro_batch=1, rank=0, world_size=1, seed=4)
    assert [i for step in _steps(other, 5) for mb in step for i in mb.indices] != flat


def test_ranks_split_the_same_steps_as_one_process():
    """A step's chunks (and samples) do not depend on the number of processes."""
    one = ShardedSampler(13, global_batch=8, micro_batch=2, rank=0, world_size=1, seed=0)
    ranks = [ShardedSampler(13, global_batch=8, micro_batch=2, rank=r, world_size=2, seed=0) for r in (0, 1)]
    assert one.accumulation == 4 and ranks[0].accumulation == 2
    for _ in range(3):
        single = {mb.chunk: mb.indices for mb in one.next_step()}
        split = [mb for r in ranks for mb in r.next_step()]
        assert {mb.chunk: mb.indices for mb in split} == single
        assert {mb.chunk % 2 for mb in split[:2]} == {0} and {mb.chunk % 2 for mb in split[2:]} == {1}


def test_sampler_resumes_from_its_position():
    a = ShardedSampler(7, global_batch=3, micro_batch=1, rank=0, world_size=1, seed=1)
    _steps(a, 2)
    state = a.state_dict()
    b = ShardedSampler(7, global_batch=3, micro_batch=1, rank=0, world_size=1, seed=1)
    b.load_state_dict(state)
    assert _steps(b, 3) == _steps(a, 3)
    with pytest.raises(DataError, match="cannot resume the data order"):
        ShardedSampler(8, global_batch=3, micro_batch=1, rank=0, world_size=1, seed=1).load_state_dict(state)
    with pytest.raises(DataError, match="not a multiple"):
        ShardedSampler(8, global_batch=3, micro_batch=2, rank=0, world_size=1, seed=1)


class _NoOffsets:
    """A tokenizer as the slow (Python) ones behave: no offset mapping."""

    is_fast = False

    def __init__(self, tok) -> None:
        self.tok, self.chat_template = tok, tok.chat_template

    def apply_chat_template(self, *args, **kwargs):
        return self.tok.apply_chat_template(*args, **kwargs)

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self.tok(text, add_special_tokens=add_special_tokens)["input_ids"]}


def test_tokenizers_without_offsets_get_the_same_mask(tokenizer):
    fast = tokenize_conversation(tokenizer, CONVO, max_length=512)
    slow = tokenize_conversation(_NoOffsets(tokenizer), CONVO, max_length=512)
    assert torch.equal(slow.input_ids, fast.input_ids) and torch.equal(slow.loss_mask, fast.loss_mask)
