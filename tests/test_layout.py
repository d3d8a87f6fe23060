"""The package layout keeps its rules: data flows one way, modules stay readable.

Layers, lowest first (a module may import its own layer and the layers below)::

    errors, limits, vocab, records, arrays, digests   the values and idioms every stage shares
    engine                                runs work units: in process, local processes, Ray
    format                                the output folder's contract
    ingest | torch | export               read → … → label | the trainer-side reader | other formats
    profile | pack | verify               the commands' libraries
    cli                                   the command line

``ingest`` never imports ``format`` (nor anything above it); ``torch`` never imports
``ingest``; ``export`` reads the folder through ``format`` alone (its torchtune loader imports
torch lazily, a third-party import).  ``engine`` knows nothing of packing: it runs the
functions the commands hand it (its own layer, so that ``profile``, ``pack`` and ``verify``
share one).  ``profile`` may use ``pack.planner``: it predicts what ``pack`` would do with
the same planner.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "packshard"
BASE = {"errors", "limits", "vocab", "records", "arrays", "digests"}
ALLOWED = {
    "errors": set(),
    "digests": set(),
    "engine": BASE | {"engine"},
    "limits": {"errors"},
    "vocab": {"errors"},
    "records": {"errors", "limits", "vocab"},
    "arrays": {"records"},
    "format": BASE | {"format"},
    "ingest": BASE | {"ingest"},
    "torch": BASE | {"format", "torch"},
    "export": BASE | {"format", "export"},
    "pack": BASE | {"engine", "format", "ingest", "pack"},
    "verify": BASE | {"engine", "format", "ingest", "torch", "verify"},
    "profile": BASE | {"engine", "ingest", "profile", "pack.planner"},
    "demo": set(),
    "cli": BASE
    | {"engine", "format", "ingest", "torch", "profile", "pack", "verify", "export", "cli", "demo"},
    "__init__": BASE,
}
LONG_KERNELS = {"pack/planner.py"}  # numba kernels with their pure-Python twin


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    """Every ``packshard.X[.Y]`` a module imports, as ``X`` or ``X.Y`` (top-level and lazy)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.startswith("packshard."):
                found.add(name.removeprefix("packshard."))
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_flow_one_way(path: Path) -> None:
    allowed = ALLOWED[_layer(path)]
    for target in _imports(path):
        parts = target.split(".")
        ok = parts[0] in allowed or ".".join(parts[:2]) in allowed
        if not ok and parts[0] not in ALLOWED and len(parts) == 1:
            ok = True  # ``from packshard import __version__``
        assert ok, f"{path.relative_to(PACKAGE)} imports packshard.{target} (layer rules above)"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_stay_readable(path: Path) -> None:
    rel = str(path.relative_to(PACKAGE))
    lines = path.read_text(encoding="utf-8").count("\n")
    limit = 560 if rel in LONG_KERNELS else 300
    assert lines <= limit, f"{rel} has {lines} lines (split it by responsibility)"
    assert "fmt: skip" not in path.read_text(encoding="utf-8"), f"{rel} skips the formatter"


def test_every_module_documents_itself() -> None:
    undocumented = [
        str(p.relative_to(PACKAGE))
        for p in _modules()
        if p.stat().st_size and ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) is None
    ]
    assert not undocumented, f"modules without a docstring: {undocumented}"


def test_the_readme_module_map_lists_every_module() -> None:
    readme = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Development", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    listed, folder = set(), ""
    for line in block.splitlines()[1:]:
        name = line.strip().split(" ", 1)[0]
        indent = len(line) - len(line.lstrip())
        if name.endswith("/"):
            folder = name
        elif name.endswith(".py"):
            listed.add(f"{folder}{name}" if indent > 2 else name)
    actual = {str(p.relative_to(PACKAGE)) for p in _modules() if p.name != "__init__.py"}
    assert listed == actual, f"missing: {sorted(actual - listed)}, stale: {sorted(listed - actual)}"
