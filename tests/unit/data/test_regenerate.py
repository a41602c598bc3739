import asyncio
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest
import torch

from dspark.data.prompts import Prompt
from dspark.data.records import Claims, JsonlAppender, LogTail, WriterLock, read_jsonl
from dspark.data.regenerate import (
    Answer,
    AnswerError,
    InProcessBackend,
    RegenerateConfig,
    chat_prompt_ids,
    record_seed,
    regenerate,
)
from dspark.decoding import speculative_generate
from dspark.errors import DsparkError
from dspark.protocols import SamplingParams

PARAMS = SamplingParams(temperature=0.7, max_tokens=5, seed=11)
QUIET = RegenerateConfig(progress=False)


class ScriptedBackend:
    """Answers "<last user turn>!" after a short sleep; fails prompts as told."""

    name = "scripted"
    template_kwargs = {"enable_thinking": False}

    def __init__(self, *, fail=(), permanent=(), max_concurrency=None):
        self.calls: list[tuple[list[dict], SamplingParams]] = []
        self.fail, self.permanent = set(fail), set(permanent)
        self.max_concurrency = max_concurrency
        self.in_flight = self.max_in_flight = 0

    async def answer(self, messages, params):
        self.calls.append((messages, params))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.005)
        self.in_flight -= 1
        user = messages[-1]["content"]
        if user in self.fail or user in self.permanent:
            raise AnswerError(f"no answer to {user}", retryable=user not in self.permanent)
        return Answer(f"{user}!", "stop", num_tokens=len(user))

    async def aclose(self):
        pass


def test_turns_are_replayed_with_the_targets_own_answers(tmp_path):
    backend = ScriptedBackend()
    prompt = Prompt(("one", "two", "three"), domain="chat", source="f:1")
    regenerate(
        [prompt],
        backend,
        tmp_path / "o",
        tmp_path / "e",
        PARAMS,
        RegenerateConfig(system="S", progress=False),
    )
    histories = [m for m, _ in backend.calls]
    assert histories[2] == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "one!"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "two!"},
        {"role": "user", "content": "three"},
    ]
    assert [len(h) for h in histories] == [2, 4, 6]
    (record,) = read_jsonl(tmp_path / "o", log=True)
    seed = record_seed(11, prompt.key)
    assert [p.seed for _, p in backend.calls] == [seed, seed + 1, seed + 2]
    assert record == {
        "id": prompt.key,
        "source": "f:1",
        "domain": "chat",
        "system": "S",
        "turns": ["one", "two", "three"],
        "answers": ["one!", "two!", "three!"],
        "finish_reasons": ["stop"] * 3,
        "num_tokens": [3, 3, 5],
        "sampling": {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "max_tokens": 5, "stop": [], "seed": seed},
        "template_kwargs": {"enable_thinking": False},
        "backend": "scripted",
        "token_ids": "text-only",  # the scripted backend gives text only
    }


def test_prompt_system_message_wins_and_seed_none_stays_none(tmp_path):
    backend = ScriptedBackend()
    params = SamplingParams(temperature=0.0, max_tokens=3)
    regenerate(
        [Prompt(("q",), system="own")],
        backend,
        tmp_path / "o",
        tmp_path / "e",
        params,
        RegenerateConfig(system="default", progress=False),
    )
    assert backend.calls[0][0][0] == {"role": "system", "content": "own"}
    assert backend.calls[0][1].seed is None
    assert read_jsonl(tmp_path / "o", log=True)[0]["sampling"]["seed"] is None


def test_seeds_are_per_prompt_and_reproducible():
    assert record_seed(1, "a") == record_seed(1, "a") != record_seed(1, "b")
    assert record_seed(1, "a") != record_seed(2, "a")
    assert record_seed(None, "a") is None


def test_resume_skips_done_and_permanent_failures_and_retries_the_rest(tmp_path):
    prompts = [Prompt((f"p{i}",)) for i in range(6)]
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    first = regenerate(prompts, ScriptedBackend(fail={"p1"}, permanent={"p2"}), out, err, PARAMS, QUIET)
    assert (first.done, first.failed, first.completion_tokens) == (4, 2, 8)
    errors = read_jsonl(err, log=True)
    assert {(e["id"], e["retryable"], e["turn"]) for e in errors} == {
        (prompts[1].key, True, 0),
        (prompts[2].key, False, 0),
    }
    with open(out, "ab") as f:  # a kill mid-write: the next run drops the partial line
        f.write(b'{"id": "half')

    backend = ScriptedBackend()
    second = regenerate(prompts + prompts[:2], backend, out, err, PARAMS, QUIET)  # duplicates too
    assert (second.total, second.resumed, second.skipped, second.done, second.failed) == (6, 4, 1, 1, 0)
    assert [m[-1]["content"] for m, _ in backend.calls] == ["p1"]
    ids = [r["id"] for r in read_jsonl(out, log=True)]
    assert sorted(ids) == sorted(p.key for p in prompts if p.key != prompts[2].key)


def test_concurrency_is_used_and_capped_by_the_backend(tmp_path):
    prompts = [Prompt((f"p{i}",)) for i in range(12)]
    free = ScriptedBackend()
    regenerate(
        prompts,
        free,
        tmp_path / "a",
        tmp_path / "ae",
        PARAMS,
        RegenerateConfig(concurrency=4, progress=False),
    )
    assert free.max_in_flight == 4
    serial = ScriptedBackend(max_concurrency=1)
    regenerate(
        prompts,
        serial,
        tmp_path / "b",
        tmp_path / "be",
        PARAMS,
        RegenerateConfig(concurrency=4, progress=False),
    )
    assert serial.max_in_flight == 1


def test_appends_are_whole_lines_under_concurrency(tmp_path):
    path = tmp_path / "log.jsonl"
    with JsonlAppender(path) as a, JsonlAppender(path) as b:
        for i in range(200):
            (a if i % 2 else b).append({"i": i, "pad": "x" * (i * 37 % 5000)})
    assert sorted(r["i"] for r in read_jsonl(path, log=True)) == list(range(200))


# -- several runs on one output (the campaign's processes) --------------------------------------

SHARED = RegenerateConfig(concurrency=3, progress=False, shared=True, poll_s=0.02)


def _in_thread(fn):
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", fn()))
    thread.start()
    return thread, box


def test_shared_runs_answer_each_prompt_once(tmp_path):
    prompts = [Prompt((f"p{i}",)) for i in range(40)]
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    backends = [ScriptedBackend(), ScriptedBackend()]
    runs = [
        _in_thread(lambda b=b, wait=wait: regenerate(
            prompts, b, out, err, PARAMS, replace(SHARED, wait_for_others=wait)
        ))
        for b, wait in zip(backends, (True, False), strict=True)
    ]  # fmt: skip
    for thread, _ in runs:
        thread.join(timeout=30)
    ids = [r["id"] for r in read_jsonl(out, log=True)]
    assert sorted(ids) == sorted(p.key for p in prompts)  # every prompt, none twice
    answered = [len(b.calls) for b in backends]
    assert sum(answered) == 40 and min(answered) > 0  # each did a part of it
    assert sum(box["result"].done for _, box in runs) == 40


def test_a_waiting_run_takes_over_what_a_dead_run_held(tmp_path):
    prompts = [Prompt((f"p{i}",)) for i in range(6)]
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    other = Claims(tmp_path / "out.jsonl.claims")  # another run, answering p0
    assert other.take(prompts[0].key)

    helper = regenerate(prompts, ScriptedBackend(), out, err, PARAMS, replace(SHARED, wait_for_others=False))
    assert helper.done == 5  # it leaves p0 to its holder and returns
    backend = ScriptedBackend()
    thread, box = _in_thread(lambda: regenerate(prompts, backend, out, err, PARAMS, SHARED))
    time.sleep(0.2)
    assert thread.is_alive() and backend.calls == []  # waits while p0 is held
    other.close()  # the holder dies without an answer
    thread.join(timeout=10)
    assert box["result"].done == 1 and [m[-1]["content"] for m, _ in backend.calls] == ["p0"]
    assert sorted(r["id"] for r in read_jsonl(out, log=True)) == sorted(p.key for p in prompts)


def test_a_shared_run_does_not_retry_what_failed_beside_it(tmp_path):
    prompts = [Prompt((f"p{i}",)) for i in range(4)]
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    regenerate(prompts[:1], ScriptedBackend(fail={"p0"}), out, err, PARAMS, SHARED)
    # p0 failed before this run began: retried; a failure during the run settles it
    backend = ScriptedBackend(fail={"p0", "p1"})
    summary = regenerate(prompts, backend, out, err, PARAMS, SHARED)
    assert (summary.done, summary.failed) == (2, 2)
    assert sorted(m[-1]["content"] for m, _ in backend.calls) == ["p0", "p1", "p2", "p3"]


def test_shared_and_exclusive_writers_refuse_each_other(tmp_path):
    prompts = [Prompt(("p",))]
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    with WriterLock(out), pytest.raises(DsparkError, match="is writing"):
        regenerate(prompts, ScriptedBackend(), out, err, PARAMS, SHARED)
    with WriterLock(out, shared=True) as first:
        assert first.alone
        with WriterLock(out, shared=True) as second:
            assert not second.alone
        with pytest.raises(DsparkError, match="is writing"):
            regenerate(prompts, ScriptedBackend(), out, err, PARAMS, QUIET)


def test_a_killed_processs_claims_are_free_at_once(tmp_path):
    code = (
        "import sys, time; from dspark.data.records import Claims; "
        "c = Claims(sys.argv[1]); assert c.take('k'); print('held', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        mine = Claims(tmp_path)
        assert not mine.take("k") and mine.take("other")
        child.kill()
        child.wait(timeout=10)
        assert mine.take("k")
    finally:
        child.kill()


def test_log_tail_reads_only_complete_new_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    tail = LogTail(path)
    assert tail.read() == []
    with JsonlAppender(path) as a:
        a.append({"i": 1})
    with open(path, "ab") as f:
        f.write(b'{"i": 2')  # another writer, mid-line
    assert tail.read() == [{"i": 1}]
    with open(path, "ab") as f:
        f.write(b"}\n")
    assert tail.read() == [{"i": 2}] and tail.read() == []


# -- in-process backend on a real (tiny, random) chat target -----------------------------------


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from dspark.targets import TargetAdapter
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    return TargetAdapter.from_pretrained(build_tiny_chat_target(tmp_path_factory.mktemp("t")))


def test_prompt_rendering_matches_training_tokenization(target):
    """The prompt the target answers is exactly the prefix training puts before the answer,
    and the loss mask starts right after it (DESIGN §7.4)."""
    from dspark.data.samples import tokenize_conversation

    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "add two numbers"}]
    ids = chat_prompt_ids(target.tokenizer, messages, {})
    full = messages + [{"role": "assistant", "content": "def add(a, b): return a + b"}]
    sample = tokenize_conversation(target.tokenizer, full, max_length=512)
    n = len(ids)
    assert sample.input_ids[:n].tolist() == ids
    assert not sample.loss_mask[:n].any() and sample.loss_mask[n]


def test_in_process_backend_is_the_decoding_loop(target, tmp_path):
    prompt = Prompt(("explain the fox",))
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=5)
    regenerate([prompt], InProcessBackend(target), tmp_path / "o", tmp_path / "e", params, QUIET)
    (record,) = read_jsonl(tmp_path / "o", log=True)
    tok = target.tokenizer
    ids = chat_prompt_ids(tok, [{"role": "user", "content": "explain the fox"}], {})
    seeded = SamplingParams(temperature=1.0, max_tokens=8, seed=record_seed(5, prompt.key))
    expected = speculative_generate(
        target, None, ids, seeded, decode=lambda x: tok.decode(x, skip_special_tokens=True)
    )
    assert record["answers"] == [expected.text] and record["num_tokens"] == [len(expected.token_ids)]
    assert record["backend"].startswith("inprocess:")


def test_in_process_prompt_too_long_is_a_permanent_failure(target, tmp_path):
    torch.manual_seed(0)
    long = Prompt((" ".join(["fox"] * 600),))
    summary = regenerate([long], InProcessBackend(target), tmp_path / "o", tmp_path / "e", PARAMS, QUIET)
    assert summary.failed == 1
    (error,) = read_jsonl(tmp_path / "e", log=True)
    assert not error["retryable"] and "context" in error["reason"]
