"""No function body imports a dspark module: a module's dependencies are its top-level imports.

``dspark --help`` stays fast because :data:`dspark.cli.COMMANDS`, the one lazy table, names
each verb's two modules (its arguments, its run) as strings; nothing else defers a dspark
import to call time, except the functions in :data:`EXCEPTIONS`, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dspark

SRC = Path(dspark.__file__).parent

# Where a dspark import inside a function is kept, and why. Both read a table whose module
# imports torch, for a parser that must be built without torch.
EXCEPTIONS = {
    "drafters/registry.py:_ngram": (
        "the registry's names are read by every parser (--drafter's help and check); its one "
        "training-free factory imports the n-gram drafter, and torch with it, when called"
    ),
    "commands/args/serve.py:_PolicyArgument.help": (
        "`serve --scheduler`'s help lists the scheduler's policy rows, a new row unedited "
        "(test_registry_help.py); the rows' module imports torch, so they are read when the "
        "help is printed, not when the parser is built"
    ),
}


def _is_dspark(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or node.module == "dspark" or node.module.startswith("dspark.")
    return any(a.name == "dspark" or a.name.startswith("dspark.") for a in node.names)


def function_imports(root: Path) -> list[str]:
    """``"path:qualified.name"`` of each function under ``root`` per dspark import in its body."""
    found = []

    def visit(node: ast.AST, path: str, scope: list[str], in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                is_function = not isinstance(child, ast.ClassDef)
                visit(child, path, [*scope, child.name], in_function or is_function)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                if in_function and _is_dspark(child):
                    found.append(f"{path}:{'.'.join(scope)}")
            else:
                visit(child, path, scope, in_function)

    for file in sorted(root.rglob("*.py")):
        visit(ast.parse(file.read_text()), file.relative_to(root).as_posix(), [], False)
    return sorted(found)


def test_no_function_imports_a_dspark_module_but_the_listed_ones():
    assert function_imports(SRC) == sorted(EXCEPTIONS)


def test_the_scan_finds_what_it_must_and_only_that(tmp_path):
    """Negative control: a hand-made tree, with imports at every depth."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import dspark.errors\n"
        "if TYPE_CHECKING:\n"
        "    from dspark.targets import TargetAdapter\n"
        "def light():\n"
        "    import json\n"
        "    import dspark_other\n"
        "def lazy():\n"
        "    from dspark.engine import Engine\n"
        "class Table:\n"
        "    from dspark import errors\n"
        "    @property\n"
        "    def rows(self):\n"
        "        if self:\n"
        "            import dspark.scheduler\n"
        "        def inner():\n"
        "            from . import sibling\n"
    )
    assert function_imports(tmp_path) == [
        "pkg/mod.py:Table.rows",
        "pkg/mod.py:Table.rows.inner",
        "pkg/mod.py:lazy",
    ]
