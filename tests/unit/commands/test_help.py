"""``--help`` of every command shows the defaults and names the registered drafters.

Also pins the light name lists the parser reads (so that ``--help`` needs no torch)
to the tables they mirror.
"""

from __future__ import annotations

import argparse

import pytest

from dspark.cli import COMMANDS, build_parser, main
from dspark.drafters.registry import TRAINABLE, available


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for word in name.split():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def _help(name: str, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "2000")  # one line per option: no wrapping inside a default
    with pytest.raises(SystemExit) as exc:
        main([*name.split(), "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def _option_text(out: str, option: str) -> str:
    """The help entry of ``option``: its line and the indented lines under it."""
    lines = out.splitlines()
    start = next(
        i for i, ln in enumerate(lines) if ln.strip().startswith(option + " ") or ln.strip() == option
    )
    end = start + 1
    while end < len(lines) and lines[end].startswith(" " * 6) and not lines[end].strip().startswith("-"):
        end += 1
    return " ".join(ln.strip() for ln in lines[start:end])


def _says_something(default) -> bool:
    return not (default is None or default is False or default == [] or default == argparse.SUPPRESS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_shows_every_default(name, capsys, monkeypatch):
    out = _help(name, capsys, monkeypatch)
    for action in _subparser(name)._actions:
        if not action.option_strings or not _says_something(action.default):
            continue
        text = _option_text(out, action.option_strings[0])
        if "(default:" in (action.help or ""):
            continue  # the help states its default in words
        assert f"(default: {action.default})" in text, f"{name}: {text!r}"


def test_defaults_that_say_nothing_are_left_out(capsys, monkeypatch):
    out = _help("generate", capsys, monkeypatch)
    assert "(default: None)" not in out and "(default: False)" not in out
    assert "(default: 0.0)" in _option_text(out, "--temperature")  # a zero is shown, not taken for False


def _drafter_options(name: str) -> list[argparse.Action]:
    return [a for a in _subparser(name)._actions if {"--drafter", "--drafters"} & set(a.option_strings)]


def test_every_drafter_option_names_the_registered_drafters(capsys, monkeypatch):
    seen = []
    for name in sorted(COMMANDS):
        for action in _drafter_options(name):
            seen.append(name)
            out = _help(name, capsys, monkeypatch)
            line = _option_text(out, action.option_strings[0])
            if action.choices:  # train: the trainable methods, as choices
                assert tuple(action.choices) == TRAINABLE
                assert "{" + ",".join(TRAINABLE) + "}" in out
            else:
                for method in TRAINABLE:
                    assert method in line, (
                        f"{name} {action.option_strings[0]} does not name {method}: {line!r}"
                    )
    for verb in ("generate", "serve", "eval", "bench decode", "train", "export", "calibrate"):
        assert verb in seen


def test_generate_help_lists_every_registered_name(capsys, monkeypatch):
    out = _help("generate", capsys, monkeypatch)
    line = _option_text(out, "--drafter")
    for name in available():
        assert name in line
    assert "(default: ngram)" in line


def test_the_light_name_lists_match_their_tables():
    from dspark.commands.args.export import DTYPE_NAMES, FORMATS
    from dspark.drafters.kinds import KINDS
    from dspark.formats import export

    assert sorted(TRAINABLE) == sorted(KINDS)
    assert FORMATS == export.FORMATS
    assert sorted(DTYPE_NAMES) == sorted(export.DTYPES)


def test_building_the_parser_imports_no_heavy_module():
    import subprocess
    import sys

    code = (
        "import sys; from dspark.cli import build_parser; build_parser(); "
        "heavy = [m for m in ('torch', 'transformers', 'fastapi', 'matplotlib') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
