"""argparse ``type=`` converters shared by every subcommand: a bad value becomes a
one-line usage error naming the flag, never a traceback."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from dspark.drafters.registry import available

TINY_CORPUS = "tiny-corpus"  # the tiny target's own training corpus: a name ``--data`` takes besides files


def _checked(text: str, convert, ok, expected: str):
    """``convert(text)`` if it parses and ``ok`` accepts it, else a usage error naming ``expected``."""
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(value):  # NaN fails every comparison: refused too
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
    return value


def positive_int(text: str) -> int:
    return _checked(text, int, lambda v: v >= 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """An integer >= 0 (a seed)."""
    return _checked(text, int, lambda v: v >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """A finite number > 0 (a learning rate): ``nan`` and ``inf`` are refused."""
    return _checked(text, float, lambda v: 0 < v < float("inf"), "a finite number > 0")


def non_negative_float(text: str) -> float:
    return _checked(text, float, lambda v: v >= 0, "a number >= 0")


def tcp_port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    return _checked(text, int, lambda v: 0 <= v <= 65535, "a port from 0 to 65535")


def probability(text: str) -> float:
    """A probability mass in (0, 1] (``--top-p``)."""
    return _checked(text, float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def _looks_like_path(text: str) -> bool:
    """``/x``, ``./x``, ``~/x``, ``a/b/c``: a local path, never a hub id (``org/name``) or a name."""
    return text.startswith(("/", ".", "~")) or text.count("/") > 1 or (os.sep != "/" and os.sep in text)


def target_spec(text: str) -> str:
    """``--target``: a name (``tiny``, ``smollm2``), a hub id (``org/name``) or a model folder.

    A path that does not exist, or is not a folder, is refused here, before anything loads.
    """
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a model folder")
    if not path.exists() and _looks_like_path(text):
        raise argparse.ArgumentTypeError(f"no such model folder: {text!r}")
    return text


def drafter_spec(text: str) -> str:
    """``--drafter``: a registered name or an existing drafter folder, checked before anything loads."""
    if text in ("", *available()):
        return text
    path = Path(text).expanduser()
    if path.is_dir():
        return text
    if path.exists():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a drafter folder")
    if _looks_like_path(text) or "/" in text:
        raise argparse.ArgumentTypeError(f"no such drafter folder: {text!r}")
    raise argparse.ArgumentTypeError(
        f"{text!r} is neither a registered drafter ({', '.join(available())}) nor an existing folder"
    )


def prompt_set(text: str) -> str:
    """One prompt set (``data regenerate --prompts``): a built-in name, ``hf:NAME[:SPLIT]`` or a
    JSONL file; a file named by a path that does not exist is refused here. Names are left to
    the loader. The text unchanged."""
    if text.startswith("hf:") or Path(text).expanduser().exists():
        return text
    if _looks_like_path(text) or "/" in text or text.endswith((".jsonl", ".json")):
        raise argparse.ArgumentTypeError(f"no such prompt file: {text!r}")
    return text


def prompt_sets(text: str) -> str:
    """``--bench`` / ``--prompts``: comma-separated sets, each as :func:`prompt_set` checks it.
    The text unchanged."""
    for item in filter(None, (s.strip() for s in text.split(","))):
        prompt_set(item)
    return text


def training_data(text: str) -> str:
    """``--data``: a JSONL file of conversations, or ``tiny-corpus``. A file that does not exist
    (or a folder) is refused here, before anything loads. The text unchanged."""
    path = Path(text)
    if text == TINY_CORPUS or path.is_file():
        return text
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a JSONL file")
    raise argparse.ArgumentTypeError(f"no such data file: {text!r} (a JSONL file, or {TINY_CORPUS!r})")


def drafter_specs(text: str) -> str:
    """``--drafters A,LABEL=B,...``: every drafter as :func:`drafter_spec` checks it; the text unchanged."""
    for item in filter(None, (s.strip() for s in text.split(","))):
        drafter_spec(item.partition("=")[2] if "=" in item else item)
    return text


def json_object(text: str) -> dict:
    """``'{"enable_thinking": false}'`` → ``{"enable_thinking": False}`` (``--template-kwargs``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def size_bytes(text: str) -> int:
    """``"512MB"``, ``"2GB"``, ``"1000000"`` -> bytes (decimal units)."""
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "B": 1}
    upper = text.strip().upper()
    for unit, factor in units.items():
        if upper.endswith(unit):
            upper, scale = upper[: -len(unit)], factor
            break
    else:
        scale = 1
    try:
        value = int(float(upper) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 512MB or 2GB, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    """``"4,8,12"`` → ``[4, 8, 12]``, every value a positive integer."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


_COUNT_SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def count(text: str) -> int:
    """A positive whole count, written plainly or short: ``1000000``, ``1e9``, ``1.25B``, ``500M``, ``2k``.

    K = 10³, M = 10⁶, B or G = 10⁹, T = 10¹² (decimal); underscores and commas are ignored.
    """
    cleaned = text.strip().replace("_", "").replace(",", "")
    scale = _COUNT_SUFFIXES.get(cleaned[-1:].upper(), 1)
    number = cleaned[:-1] if scale != 1 else cleaned
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a count like 1000000, 1e9 or 1.25B, got {text!r}"
        ) from None
    if not (value >= 1 and value < 1e18) or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a positive whole count, got {text!r}")
    return int(value)
