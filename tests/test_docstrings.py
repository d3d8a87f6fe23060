"""Docstring cross-references resolve: every ``:mod:``/``:func:``/``:class:`` target exists.

A reference is looked up as written (``packshard.format.shards.read_row``), else relative to
the module that holds it, to the class whose docstring it is in (``:meth:`close```), or among
the builtins and the standard library (``:class:`OSError```, ``:mod:`glob```).  A stale one (a
moved module, a renamed function) fails
with the module and the reference, so a move cannot leave the prose behind.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "packshard"
ROLE = re.compile(r":(?:mod|func|class|data|meth|attr|exc|obj):`~?([^`<>]+?)`")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _references(path: Path) -> list[tuple[str | None, str]]:
    """``(enclosing class, target)`` of every reference in the module's docstrings."""
    found: list[tuple[str | None, str]] = []

    def visit(node: ast.AST, cls: str | None) -> None:
        inner = node.name if isinstance(node, ast.ClassDef) else cls
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            found.extend((inner, t.strip()) for t in ROLE.findall(doc or ""))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), None)
    return found


def _lookup(dotted: str) -> bool:
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _resolves(module: ModuleType, cls: str | None, target: str) -> bool:
    if target.startswith("packshard"):
        return _lookup(target)
    if hasattr(builtins, target.split(".")[0]) or target in sys.stdlib_module_names:
        return True
    scope = [f"{module.__name__}.{cls}.{target}"] if cls else []
    return any(_lookup(name) for name in [*scope, f"{module.__name__}.{target}"])


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_docstring_references_resolve(path: Path) -> None:
    module = importlib.import_module(_module_name(path))
    stale = [t for cls, t in _references(path) if not _resolves(module, cls, t)]
    assert not stale, f"{path.relative_to(PACKAGE)}: stale references {stale}"


def test_a_stale_reference_is_caught() -> None:
    module = importlib.import_module("packshard.records")
    assert _resolves(module, None, "packshard.records.SourceRef")
    assert not _resolves(module, None, "packshard.records.Rendered")  # moved to ingest.types
    assert not _resolves(module, None, "packshard.records.IngestOptions")  # ingest.types
