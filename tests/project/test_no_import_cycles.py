"""No import circle in greenroom: no module imports, even only for type checking or inside a
function, a module that imports it back, directly or through others. Each floor imports only
the floors below it (docs/architecture.md); a circle is a floor that is not one."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

from tests import ROOT

PACKAGE = ROOT / "greenroom"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module of greenroom, with the modules of greenroom it imports anywhere in it: the
    module a name is taken from, or the named one when it is itself a module."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{alias.name}" for alias in node.names]
                targets = [t if t in modules else base for t in targets]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
    return graph


def test_no_module_of_greenroom_imports_itself_back() -> None:
    modules = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    graph = _imports(modules)
    assert graph["greenroom.acp.connection"]  # the walk finds imports at all
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"an import circle: {' -> '.join(exc.args[1])}") from None
