"""``make test-latest``'s decision to rebuild: only when a resolved version differs."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.helpers import REPO


@pytest.fixture(scope="module")
def latest():
    path = REPO / "scripts" / "test_latest.py"
    spec = importlib.util.spec_from_file_location("test_latest_script_module", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_same_versions_under_other_spellings_are_not_a_move(latest):
    resolved = {"jinja2": "3.1.6", "typing-extensions": "4.16.0", "zope-interface": "7.0"}
    dev = {"jinja2": "3.1.6", "typing-extensions": "4.16.0", "zope-interface": "7.0", "ruff": "1"}
    assert latest.differing(resolved, dev) == []
    names = {latest.dist_key(n) for n in ("Jinja2", "typing_extensions", "zope.interface")}
    assert names == set(dev) - {"ruff"}


def test_a_newer_or_missing_package_is_a_move(latest):
    dev = {"tokenizers": "0.23.3", "numpy": "2.4.6"}
    resolved = {"tokenizers": "0.23.4", "numpy": "2.4.6", "trl": "1.16.0"}
    assert latest.differing(resolved, dev) == ["tokenizers", "trl"]
