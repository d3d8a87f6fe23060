"""The manifest's ``environment``: the versions that made a pack, and drift from them.

A pack is a function of its inputs, its options and the code that ran.  Besides packshard
itself, these libraries can change what a pack holds: ``tokenizers`` (ids, offsets),
``jinja2`` and ``markupsafe`` (the rendered template text), ``numpy`` and ``numba`` (labels,
token positions, planning, assembly) and ``pyarrow`` (the Parquet bytes).  ``pack`` records
their versions, the Python version and the template-rendering conventions it applied::

    "environment": {
      "python": "3.11.7",
      "libraries": {"jinja2": "3.1.6", "markupsafe": "3.0.4", "numba": "0.68.1",
                    "numpy": "2.4.6", "pyarrow": "26.0.1", "tokenizers": "0.23.3"},
      "template_conventions": {"id": "hf-chat-template/1", "rules": ["…", …]},
      "backends": {"render": {"name": "jinja2", …},
                   "encode": {"name": "fastokens", "version": "0.3.5", "requested": "auto",
                              "reason": "canary equal"}}
    }

``verify`` collects the same versions where it runs and compares: every recorded item that
differs is one :class:`Drift`.  Drift alone is no finding (an upgrade that changes nothing
must re-verify cleanly); a segment the source stage finds changed names the drifted
libraries as the likely cause, and the fast encoder that made it, if any (:func:`encoded_by`:
``verify`` always re-encodes with the reference).
"""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

CONTENT_LIBRARIES = ("tokenizers", "jinja2", "markupsafe", "pyarrow", "numpy", "numba")
"""The libraries whose version can change a pack's content, most likely culprit first."""
MODEL_LIBRARIES = ("torch", "transformers")
"""What verify's model stage adds (``pack`` needs neither)."""


def installed_version(name: str) -> str | None:
    """Return the installed distribution version of ``name``, None when it is absent."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def library_versions(names: Sequence[str]) -> dict[str, str | None]:
    """Return ``{name: version or None}`` for each library, read without importing it."""
    return {name: installed_version(name) for name in names}


def pack_environment(conventions: Mapping[str, Any]) -> dict[str, Any]:
    """Return the manifest's ``environment`` entry for the running interpreter."""
    return {
        "python": platform.python_version(),
        "libraries": library_versions(CONTENT_LIBRARIES),
        "template_conventions": dict(conventions),
    }


def running_environment(conventions: Mapping[str, Any]) -> dict[str, Any]:
    """Return what verify runs with: the pack's libraries plus torch and transformers."""
    from packshard import __version__

    env = pack_environment(conventions)
    env["packshard"] = __version__
    env["libraries"] = library_versions(CONTENT_LIBRARIES + MODEL_LIBRARIES)
    return env


@dataclass(frozen=True, slots=True)
class Drift:
    """One recorded version (or convention) that differs from the running one."""

    name: str
    recorded: str | None
    running: str | None

    def __str__(self) -> str:
        return (
            f"{self.name} {self.recorded or 'absent'} when packed, {self.running or 'absent'} now"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"name": self.name, "recorded": self.recorded, "running": self.running}


def environment_drift(manifest: Mapping[str, Any], running: Mapping[str, Any]) -> tuple[Drift, ...]:
    """Compare a manifest's recorded environment with ``running``; empty when all agree.

    Only what the manifest recorded is compared (a library it does not list is not drift).
    The order is the order of likely cause: libraries first, then the conventions, packshard
    and Python.
    """
    recorded = manifest.get("environment")
    if not isinstance(recorded, Mapping):
        return ()
    found: list[Drift] = []
    libraries = recorded.get("libraries") or {}
    for name in (*CONTENT_LIBRARIES, *sorted(set(libraries) - set(CONTENT_LIBRARIES))):
        if name in libraries:
            now = running.get("libraries", {}).get(name, installed_version(name))
            if libraries[name] != now:
                found.append(Drift(name, libraries[name], now))
    conventions = (recorded.get("template_conventions") or {}).get("id")
    now_conventions = running.get("template_conventions", {}).get("id")
    if conventions != now_conventions:
        found.append(Drift("template conventions", conventions, now_conventions))
    if manifest.get("packshard_version") != running.get("packshard"):
        found.append(
            Drift("packshard", manifest.get("packshard_version"), running.get("packshard"))
        )
    if recorded.get("python") != running.get("python"):
        found.append(Drift("python", recorded.get("python"), running.get("python")))
    return tuple(found)


def encoded_by(manifest: Mapping[str, Any]) -> str:
    """Return `` (rendered by … / encoded by LIB VERSION …)`` for each step a fast library did."""
    backends = (manifest.get("environment") or {}).get("backends") or {}
    render, encode = backends.get("render") or {}, backends.get("encode") or {}
    out = ""
    if render.get("name") not in (None, "jinja2"):
        out += (
            f" (rendered by {render['name']} {render.get('version') or '?'} with --backend "
            f"{render.get('requested')}; verify re-renders in Jinja's sandbox)"
        )
    if encode.get("name") not in (None, "tokenizers"):
        out += (
            f" (encoded by {encode['name']} {encode.get('version') or '?'} with --backend "
            f"{encode.get('requested')}; verify re-encodes with tokenizers)"
        )
    return out


def likely_cause(drift: Sequence[Drift]) -> str:
    """Return `` (likely cause: …)`` naming the drifted items, or ``""`` when none drifted."""
    if not drift:
        return ""
    return f" (likely cause: {'; '.join(str(d) for d in drift)})"
