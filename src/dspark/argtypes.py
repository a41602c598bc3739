"""argparse ``type=`` converters shared by every subcommand: a bad value becomes a
one-line usage error naming the flag, never a traceback."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def json_object(text: str) -> dict:
    """``'{"enable_thinking": false}'`` → ``{"enable_thinking": False}`` (``--template-kwargs``)."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value
