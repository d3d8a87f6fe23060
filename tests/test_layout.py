"""The package layout keeps its rules: data flows one way, modules stay readable.

Layers, lowest first (a module may import its own layer and the layers below)::

    errors, options, arrays, records, digests   the values and idioms every stage shares
    engine                                runs work units: in process, local processes, Ray
    store                                 object stores: URLs, ranged reads, publishing (pyarrow)
    format                                the output folder's contract
    ingest | torch | export               read → … → label | the trainer-side reader | other formats
    profile | pack | verify               the commands' libraries
    repack                                pack's stages fed from a pack (read as export reads it)
    cli                                   the command line

Outside ``ingest/`` a module imports only its face, ``packshard.ingest`` (its stage, unit task
and the few names the commands need) and ``packshard.ingest.types``.  ``ingest`` never imports
``format`` (nor anything above it); ``torch`` never imports
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
BASE = {"errors", "options", "records", "arrays", "digests", "jit"}
ALLOWED = {
    "errors": set(),
    "digests": set(),
    "jit": set(),
    "engine": BASE | {"engine"},
    "options": {"errors"},
    "records": {"errors", "arrays"},
    "arrays": set(),
    "store": BASE | {"store"},
    "format": BASE | {"format", "store"},
    "ingest": BASE | {"ingest", "store"},
    "torch": BASE | {"format", "store", "torch"},
    "export": BASE | {"format", "store", "export"},
    "pack": BASE | {"engine", "format", "ingest", "store", "pack"},
    "verify": BASE | {"engine", "format", "ingest", "store", "torch", "verify"},
    "profile": BASE | {"engine", "ingest", "profile", "pack.plan"},
    "repack": BASE | {"engine", "format", "ingest", "pack", "export", "repack"},
    "demo": set(),
    "cli": BASE
    | {
        "engine",
        "format",
        "ingest",
        "torch",
        "profile",
        "pack",
        "repack",
        "verify",
        "export",
        "store",
        "cli",
        "demo",
    },
    "__init__": BASE,
}
LONG_MODULES = {
    "pack/plan/planner.py": "the numba planners (bfd, ffd, wrapped) beside their pure-Python twins",
    "cli/options.py": "every command-line option with its default, choices and help, by command",
    "cli/tables.py": "every command's terminal tables and the one console that prints them safely",
    "torch/dataset.py": "PackedDataset: a pack's rows, local or stored, served as recorded",
}
"""Modules over ``LONG_LINES`` lines, each with its one idea: files are sized by idea."""
LONG_LINES = 400
MAX_MODULES = 9
"""Modules a folder holds at most (``__init__.py`` aside); past that, sub-folders by step."""


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
def test_long_modules_are_named_with_their_idea(path: Path) -> None:
    rel = str(path.relative_to(PACKAGE))
    lines = path.read_text(encoding="utf-8").count("\n")
    assert lines <= LONG_LINES or rel in LONG_MODULES, (
        f"{rel} has {lines} lines: split it if it holds two ideas, else name its one idea in "
        "LONG_MODULES"
    )
    assert "fmt: skip" not in path.read_text(encoding="utf-8"), f"{rel} skips the formatter"


def test_the_long_module_list_is_current() -> None:
    for rel in LONG_MODULES:
        lines = (PACKAGE / rel).read_text(encoding="utf-8").count("\n")
        assert lines > LONG_LINES, f"{rel} has {lines} lines: take it off LONG_MODULES"


def test_a_folder_holds_at_most_nine_modules() -> None:
    folders = {p.parent for p in _modules()}
    for folder in sorted(folders):
        mods = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        rel = folder.relative_to(PACKAGE.parent)
        assert len(mods) <= MAX_MODULES, (
            f"{rel} holds {len(mods)} modules: group them into sub-folders named after their steps"
        )
        if folder != PACKAGE:
            init = folder / "__init__.py"
            assert init.is_file() and ast.get_docstring(ast.parse(init.read_text("utf-8"))), (
                f"{rel}/__init__.py must state what the folder does"
            )


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> packshard modules it imports (top-level and lazy; ``from X import mod`` too)."""
    names = {_module_name(p): p for p in _modules()}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in names else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in names and d != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycles() -> None:
    assert _cycles(_import_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _route_branches(source: str) -> list[str]:
    """``engine is None`` / ``engine is not None`` tests and ``.serial`` reads in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(
            isinstance(o, ast.Is | ast.IsNot) for o in node.ops
        ):
            names = [node.left, *node.comparators]
            named = any(ast.unparse(n).split(".")[-1] == "engine" for n in names)
            if named and any(isinstance(n, ast.Constant) and n.value is None for n in names):
                found.append(ast.unparse(node))
        if isinstance(node, ast.Attribute) and node.attr == "serial":
            found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_one_route_no_branch_on_the_engine_outside_engine(path: Path) -> None:
    """Every command runs its work as engine tasks; only ``engine/`` knows it may be serial."""
    if path.relative_to(PACKAGE).parts[0] == "engine":
        return
    found = _route_branches(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(PACKAGE)} branches on the engine: {found}"


def test_the_route_check_finds_a_branch() -> None:
    source = "if engine is None: pass\nif x.engine is not None: pass\nif opts.serial: pass\n"
    assert _route_branches(source) == ["engine is None", "x.engine is not None", "opts.serial"]
    assert _route_branches("if engine: pass\nif bundle is None: pass\n") == []


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_is_imported_from_another_file(path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("packshard"):
            private = [a.name for a in node.names if a.name.startswith("_") and a.name[1] != "_"]
            assert not private, f"{path.relative_to(PACKAGE)} imports {private} from {node.module}"


def test_every_module_documents_itself() -> None:
    undocumented = [
        str(p.relative_to(PACKAGE))
        for p in _modules()
        if p.stat().st_size and ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) is None
    ]
    assert not undocumented, f"modules without a docstring: {undocumented}"


def _tree(text: str, heading: str) -> tuple[set[str], set[str]]:
    """Return the modules and the folders a ``text`` tree block under ``heading`` names."""
    block = text.split(heading, 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    modules: set[str] = set()
    folders: set[str] = set()
    open_folders: list[tuple[int, str]] = []  # (indent, "a/b/") of the open folders
    for line in block.splitlines()[1:]:
        name = line.strip().split(" ", 1)[0]
        indent = len(line) - len(line.lstrip())
        while open_folders and open_folders[-1][0] >= indent:
            open_folders.pop()
        parent = open_folders[-1][1] if open_folders else ""
        if name.endswith("/"):
            open_folders.append((indent, f"{parent}{name}"))
            folders.add(f"{parent}{name}")
        elif name.endswith(".py"):
            modules.add(f"{parent}{name}")
    return modules, folders


def _package_tree() -> tuple[set[str], set[str]]:
    modules = {str(p.relative_to(PACKAGE)) for p in _modules() if p.name != "__init__.py"}
    folders = {
        f"{p.parent.relative_to(PACKAGE)}/" for p in _modules() if p.name == "__init__.py"
    } - {"./"}
    return modules, folders


def test_the_module_map_lists_every_module() -> None:
    text = (PACKAGE.parent / "docs" / "development.md").read_text(encoding="utf-8")
    listed, listed_folders = _tree(text, "## Module map")
    actual, folders = _package_tree()
    assert listed == actual, f"missing: {sorted(actual - listed)}, stale: {sorted(listed - actual)}"
    assert listed_folders == folders


def test_the_readme_layout_names_every_folder() -> None:
    readme = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    listed, listed_folders = _tree(readme, "## Layout")
    actual, folders = _package_tree()
    top = {m for m in actual if "/" not in m}
    assert listed_folders == folders, (
        f"missing: {sorted(folders - listed_folders)}, stale: {sorted(listed_folders - folders)}"
    )
    assert listed == top, f"missing: {sorted(top - listed)}, stale: {sorted(listed - top)}"


FACES = {"ingest": {"packshard.ingest", "packshard.ingest.types"}}
"""Each folder that has a face: the only modules of it imported from outside the folder."""


def _past_faces(path: Path, source: str) -> list[str]:
    """Return the modules of a faced folder that ``source`` (at ``path``) imports past its face."""
    inside = path.relative_to(PACKAGE).parts[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        modules = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        for module in modules:
            parts = module.split(".")
            folder = parts[1] if len(parts) > 1 and parts[0] == "packshard" else ""
            if folder in FACES and folder != inside and module not in FACES[folder]:
                found.append(module)
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_outside_ingest_only_its_face_is_imported(path: Path) -> None:
    found = _past_faces(path, path.read_text(encoding="utf-8"))
    assert not found, (
        f"{path.relative_to(PACKAGE)} imports {found}: import what it needs from packshard.ingest "
        "(add the name to its FACE) or packshard.ingest.types"
    )


def test_the_face_check_finds_a_module_past_the_face() -> None:
    source = (
        "from packshard.ingest import open_stage\n"
        "from packshard.ingest.types import IngestOptions\n"
        "from packshard.ingest.read.units import WorkUnit\n"
        "import packshard.ingest.stream\n"
    )
    found = ["packshard.ingest.read.units", "packshard.ingest.stream"]
    assert _past_faces(PACKAGE / "pack" / "x.py", source) == found
    assert _past_faces(PACKAGE / "ingest" / "x.py", source) == []  # inside: any module


def _face_names() -> dict[str, str]:
    """Name -> module of every name ``packshard.ingest`` exports (its ``FACE``, read unrun)."""
    tree = ast.parse((PACKAGE / "ingest" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "FACE":
            face = ast.literal_eval(node.value)
            return {name: module for module, names in face.items() for name in names}
    raise AssertionError("packshard/ingest/__init__.py has no FACE")


def test_the_face_types_what_it_exports() -> None:
    """The face's ``TYPE_CHECKING`` imports are its ``FACE``, name for name, and each resolves."""
    import importlib

    import packshard.ingest as face

    tree = ast.parse((PACKAGE / "ingest" / "__init__.py").read_text(encoding="utf-8"))
    typed = {
        alias.name: node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
        if node.module.startswith("packshard.ingest.")
    }
    assert typed == _face_names()
    assert sorted(face.__all__) == sorted(typed)
    for name, module in typed.items():
        assert getattr(face, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = face.nothing


MAX_DEPTH = {"packshard": 15, "packshard.ingest": 8}
"""The longest chain of imports (modules in it), package-wide and inside ``ingest/``: no
longer than now.  Package-wide it was 23 (13 in ``ingest/``) before the face and the
labelling table, 22 (11) before the labelling modules became siblings of one leaf, 17 (8)
before ``arrays`` became a leaf, the manifest read the store's modules rather than the
store's face, the unit task's values and a unit's stored part left the modules that run
them, and the model loader moved beside the tiny models: 15 (8)."""


def _depth_graph() -> dict[str, set[str]]:
    """The import graph as the interpreter follows it: a name of the face is its own module.

    ``packshard.ingest`` loads each name it exports on first use (:pep:`562`), so importing it
    imports nothing; ``from packshard.ingest import X`` imports X's module alone.
    """
    graph = _import_graph()
    names = _face_names()
    for name, path in {_module_name(p): p for p in _modules()}.items():
        if name == "packshard.ingest":
            graph[name] = set()
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "packshard.ingest":
                graph[name].discard("packshard.ingest")
                graph[name] |= {names[a.name] for a in node.names}
    return graph


def _longest(graph: dict[str, set[str]], within: str) -> list[str]:
    """The longest import chain of modules under ``within`` (the graph has no cycle)."""
    inside = {n: {d for d in deps if d.startswith(within)} for n, deps in graph.items()}
    best: dict[str, list[str]] = {}

    def chain(node: str) -> list[str]:
        if node not in best:
            below = [chain(d) for d in sorted(inside[node])]
            best[node] = [node, *max(below, key=len, default=[])]
        return best[node]

    return max((chain(n) for n in sorted(inside) if n.startswith(within)), key=len)


def test_the_longest_chain_of_imports_is_short(capsys: pytest.CaptureFixture[str]) -> None:
    graph = _depth_graph()
    for within, limit in MAX_DEPTH.items():
        chain = _longest(graph, within)
        with capsys.disabled():
            print(f"\nimport depth of {within}: {len(chain)}: {' -> '.join(chain)}")
        assert len(chain) <= limit, f"{within}: {len(chain)} modules deep: {' -> '.join(chain)}"


def test_the_depth_finder_finds_the_longest_chain() -> None:
    graph = {"p.a": {"p.b", "p.c"}, "p.b": {"p.c"}, "p.c": {"q.d"}, "q.d": set()}
    assert _longest(graph, "p") == ["p.a", "p.b", "p.c"]
    assert _longest(graph, "") == ["p.a", "p.b", "p.c", "q.d"]
