"""Every subcommand explains itself: `--help` exits 0 and prints its description."""

import pytest

from dspark.cli import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_of_every_command(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*name.split(), "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: dspark " + name)
