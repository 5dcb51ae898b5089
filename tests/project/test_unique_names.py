"""Each public name of a class or a type alias is defined in one module of greenroom: a name
means one thing wherever a reader meets it (an import, a docstring, a traceback)."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator

from tests import ROOT


def _defined(body: list[ast.stmt]) -> Iterator[str]:
    """The classes and type aliases a module's body defines, under an ``if`` or a ``try``
    too."""
    for node in body:
        if isinstance(node, ast.ClassDef):
            yield node.name
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and ast.unparse(node.annotation).rpartition(".")[2] == "TypeAlias"
        ):
            yield node.target.id
        elif isinstance(node, ast.If | ast.Try):
            for block in (node.body, node.orelse, *(h.body for h in getattr(node, "handlers", []))):
                yield from _defined(block)


def _where() -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted((ROOT / "greenroom").rglob("*.py")):
        for name in _defined(ast.parse(path.read_text(), str(path)).body):
            if not name.startswith("_"):
                where[name].append(str(path.relative_to(ROOT / "greenroom")))
    return where


def test_no_public_class_or_alias_name_is_defined_in_two_modules() -> None:
    where = _where()
    assert "AcpConnection" in where  # the walk finds definitions at all
    twice = {name: paths for name, paths in where.items() if len(set(paths)) > 1}
    assert twice == {}
