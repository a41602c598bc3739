"""Streamed text deltas join to the final text: UTF-8 held back, never past a stop string."""

from __future__ import annotations

import pytest

from dspark.server.textstream import TextStream


def byte_decode(ids: list[int]) -> str:
    """Token id = one byte, decoded like a byte-level BPE (invalid/partial bytes -> U+FFFD)."""
    return bytes(ids).decode("utf-8", errors="replace")


def run(text: str, chunks: list[int], stop: tuple[str, ...] = ()) -> tuple[list[str], str]:
    """Stream ``text`` (as bytes) in chunks of the given sizes; returns the deltas and the final text."""
    data, deltas, pos = list(text.encode()), [], 0
    stream = TextStream(byte_decode, stop)
    for n in chunks:
        deltas.append(stream.push(data[pos : pos + n]))
        pos += n
    full = byte_decode(data)
    hits = [i for s in stop if (i := full.find(s)) >= 0]
    final = full[: min(hits)] if hits else full
    deltas.append(stream.finish(final))
    return deltas, final


def test_multibyte_characters_wait_for_their_last_byte():
    deltas, final = run("a€b", [2, 1, 2])  # '€' is 3 bytes, split 1 + 1 + 1
    assert deltas[0] == "a" and deltas[1] == ""  # no U+FFFD ever sent
    assert "".join(deltas) == final == "a€b"
    assert all("\ufffd" not in d for d in deltas)


@pytest.mark.parametrize("sizes", [[1] * 20, [3, 5, 7, 5], [20]])
def test_a_stop_string_split_over_chunks_is_never_sent(sizes):
    text = "hello STOP world"
    deltas, final = run(text, sizes, stop=("STOP", "nope!"))
    assert final == "hello "
    assert "".join(deltas) == final
    assert not any("S" in d for d in deltas)


def test_without_stop_strings_everything_is_sent_at_once():
    stream = TextStream(byte_decode)
    assert stream.push(list(b"abc")) == "abc"
    assert stream.finish("abc") == ""


def test_final_text_wins_when_it_is_shorter_than_what_was_decoded():
    """The engine cuts at the first stop string; tokens after it never become text."""
    stream = TextStream(byte_decode, ("xy",))
    assert stream.push(list(b"abcdef")) == "abcde"  # one character held back (len("xy") - 1)
    assert stream.push(list(b"xyz")) == "f"
    assert stream.finish("abcdef") == ""
