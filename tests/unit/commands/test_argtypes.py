"""argparse converters: what they accept and the one-line errors of what they refuse."""

import argparse

import pytest

from dspark.commands.argtypes import count


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1000000", 1_000_000),
        ("1e9", 10**9),
        ("1.25B", 1_250_000_000),
        ("1.25b", 1_250_000_000),
        ("500M", 500_000_000),
        ("2k", 2000),
        ("3G", 3 * 10**9),
        ("1T", 10**12),
        ("1_000", 1000),
        ("1,000", 1000),
    ],
)
def test_count_reads_plain_and_short_forms(text, value):
    assert count(text) == value


@pytest.mark.parametrize("text", ["", "abc", "0", "-5", "1.5", "1e-3", "nan", "inf", "2.5X", "1e30"])
def test_count_refuses_what_is_not_a_positive_whole_count(text):
    with pytest.raises(argparse.ArgumentTypeError):
        count(text)
