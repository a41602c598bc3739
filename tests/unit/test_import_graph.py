"""The package import graph keeps the layering: downward only outside the wiring layer, no cycle.

Runs ``scripts/import_graph.py`` on the real tree, on a hand-made tree that breaks the
rules (negative controls), and checks that docs/architecture.md shows the current graph.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def graph():
    spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tree_imports_downward_only_and_has_no_cycle(graph):
    edges = graph.collect_edges()
    assert ("commands", "targets") in edges  # the scan sees imports inside functions too
    assert graph.violations(edges) == []


def test_every_package_has_a_layer(graph):
    packages = {graph.package_of(p) for p in graph.ROOT.rglob("*.py")} - {"__init__"}
    assert packages <= set(graph.layer_of())


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "dspark"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_an_upward_import_outside_the_wiring_is_refused(graph, tmp_path):
    root = _tree(
        tmp_path,
        {
            "targets/adapter.py": "def f():\n    from dspark.engine.engine import Engine\n",
            "engine/engine.py": "from dspark.targets import adapter\n",
            "commands/serve.py": "from dspark.server import app\nfrom dspark.targets import adapter\n",
        },
    )
    problems = graph.violations(graph.collect_edges(root))
    assert any(p.startswith("targets (layer 2) imports engine (layer 4)") for p in problems)
    assert any(p.startswith("package cycle: ") and "engine" in p and "targets" in p for p in problems)
    assert not any(p.startswith("commands") for p in problems)  # the wiring may import anything


def test_a_sideways_import_is_refused(graph, tmp_path):
    root = _tree(tmp_path, {"eval/runner.py": "import dspark.server.app\n"})
    assert graph.violations(graph.collect_edges(root)) == [
        "eval (layer 7) imports server (layer 7): only the wiring layer may import sideways or upward; "
        "at dspark/eval/runner.py:1"
    ]


def test_the_architecture_doc_shows_the_current_graph(graph):
    text = (REPO / "docs" / "architecture.md").read_text()
    assert graph.docs_block(graph.collect_edges()) in text, (
        "docs/architecture.md is stale: run python scripts/import_graph.py --write-docs docs/architecture.md"
    )
