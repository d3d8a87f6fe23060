"""One unit task for every command: each command's engine function is run_unit."""

from __future__ import annotations

from pathlib import Path


def test_pack_profile_and_verify_run_the_one_unit_task() -> None:
    """Each command's engine function is ``run_unit`` on a ``UnitTask`` with its own sink."""
    import ast

    package = Path(__file__).resolve().parents[3] / "packshard"
    for module, function in (
        ("pack/units/map.py", "map_unit"),
        ("profile/units.py", "profile_unit"),
        ("verify/reingest.py", "source_unit"),
    ):
        tree = ast.parse((package / module).read_text(encoding="utf-8"))
        [fn] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
        assert ast.unparse(fn.args.args[0].annotation).startswith(("UnitTask[", "MapTask"))
        assert ast.unparse(fn.returns).startswith(("UnitResult[", "MappedUnit"))
        calls = [ast.unparse(c.func) for c in ast.walk(fn) if isinstance(c, ast.Call)]
        assert "run_unit" in calls, module
