"""Every module greenroom imports is the standard library's, greenroom's own, or a distribution
pyproject.toml names itself: nothing arrives only because another package pulls it in."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from tests import ROOT

#: Imported only where an optional extra is installed, each behind a guard that says so.
OPTIONAL = {"opentelemetry", "pytest"}  # the otel extra's; the testing extra's (its plugin)


def _imported_roots(package: Path) -> dict[str, str]:
    """Each top-level module name imported anywhere under `package`, with a file importing it."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = set()
    for requirement in project["dependencies"]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)
        assert name is not None, requirement
        names.add(re.sub(r"[-_.]+", "-", name.group(0)).lower())
    return names


def test_every_third_party_import_of_greenroom_is_a_declared_dependency() -> None:
    providers = importlib.metadata.packages_distributions()
    declared = _declared()
    undeclared = {}
    for module, where in _imported_roots(ROOT / "greenroom").items():
        if module in sys.stdlib_module_names or module == "greenroom" or module in OPTIONAL:
            continue
        distributions = {re.sub(r"[-_.]+", "-", d).lower() for d in providers.get(module, [])}
        if not distributions & declared:
            undeclared[module] = (where, sorted(distributions))
    assert undeclared == {}, f"imported but not declared in pyproject.toml: {undeclared}"
