"""Every subcommand explains itself: `--help` exits 0 and prints its description."""

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
    _, fn = COMMANDS[name].load()
    assert COMMANDS[name].summary == fn.__doc__.strip().splitlines()[0]


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


def test_the_command_list_imports_no_command_module():
    import subprocess
    import sys

    code = (
        "import sys; from dspark.cli import main\n"
        "try: main(['--help'])\n"
        "except SystemExit: pass\n"
        "light = ('dspark.commands', 'dspark.commands.argtypes', 'dspark.commands.options')\n"
        "mods = [m for m in sys.modules if m.startswith('dspark.commands') and m not in light]\n"
        "print('loaded:', ','.join(mods))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "loaded:"
