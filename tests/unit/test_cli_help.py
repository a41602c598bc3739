"""Every subcommand explains itself: `--help` exits 0 and prints its description."""

import subprocess
import sys

import pytest

from dspark.cli import COMMANDS, main, selected


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_of_every_command(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*name.split(), "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: dspark " + name)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_table_lists_each_verb_by_its_docstring(name):
    add_args = COMMANDS[name].arguments()
    assert COMMANDS[name].summary == add_args.__doc__.strip().splitlines()[0]


@pytest.mark.parametrize(
    "argv, verb",
    [
        (["--help"], ""),
        (["-v", "--threads", "2", "generate", "--prompt", "hi"], "generate"),
        (["bench", "--help"], "bench"),
        (["bench", "llamacpp-plot", "a.json"], "bench llamacpp-plot"),
        (["eval", "--drafters", "x"], "eval"),
        (["nosuch"], ""),
    ],
)
def test_only_the_verb_being_run_is_imported(argv, verb):
    assert selected(argv) == verb


def _loaded_after(*argvs: list[str]) -> list[str]:
    """The ``dspark.commands`` modules and torch a fresh interpreter holds after ``main`` parsed
    each of ``argvs`` (each ends in ``--help`` or an argument error)."""
    code = (
        "import sys; from dspark.cli import main\n"
        f"for argv in {list(argvs)!r}:\n"
        "    try: main(argv)\n"
        "    except SystemExit: pass\n"
        "print(','.join(m for m in sys.modules if m.startswith('dspark.commands') or m == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().splitlines()[-1].split(",") if m]


def test_the_command_list_imports_no_command_module():
    light = {"dspark.commands", "dspark.commands.argtypes", "dspark.commands.options"}
    assert set(_loaded_after(["--help"])) <= light


def test_a_verbs_help_and_its_argument_errors_import_its_arguments_alone():
    loaded = _loaded_after(["train", "--help"], ["generate", "--prompt", "hi", "--top-p", "2"])
    assert {"dspark.commands.args.train", "dspark.commands.args.generate"} <= set(loaded)  # the scan sees
    assert not {
        "torch",
        "dspark.commands.train",
        "dspark.commands.generate",
        "dspark.commands.loading",
    } & set(loaded)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_verb_runs_its_main_from_its_run_module(name):
    command = COMMANDS[name]
    assert command.runner().__module__ == f"dspark.commands.{command.module}"
    assert command.arguments().__module__ == f"dspark.commands.args.{command.module}"
