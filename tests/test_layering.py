"""The layers import downwards only: kernels/ <- engine/ <- commands/ <- icqs/. Checked on the source (AST), so a
new upward import fails here rather than in a review."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What each layer may not import. engine/__main__.py is the `python -m engine` command's name and nothing else: it
# forwards to commands/engine_cli.py and no module imports it.
FORBIDDEN = {"kernels": {"engine", "commands", "icqs"}, "engine": {"commands", "icqs"}, "commands": {"icqs"}}
ALLOWED = {("engine/__main__.py", "commands")}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_import_downwards_only(layer):
    found = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for name in sorted(imported_packages(path) & FORBIDDEN[layer]):
            if (rel, name) not in ALLOWED:
                found.append(f"{rel} imports {name}")
    assert not found, "upward imports:\n" + "\n".join(found)


def test_the_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("import os\nfrom icqs.task import load_task\n\ndef f():\n    import commands.fetch\n")
    assert imported_packages(bad) & FORBIDDEN["engine"] == {"icqs", "commands"}
