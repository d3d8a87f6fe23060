"""``make test-latest``: the fixture, parity and equivalence tests against the newest releases.

The dev environment (``.venv``) is pinned by constraints-dev.txt, and the fixture pins were
made with those versions.  This builds a second environment (``.venv-latest``) with the newest
releases of everything packshard depends on (tokenizers, jinja2, markupsafe, transformers,
pyarrow, numpy, numba …) while torch stays at 2.13.0, runs the tests that notice a library
moving a seam, and prints what moved: the versions newer than the dev environment's and the
tests that failed with them.  Exit 1 when something moved, 2 when the environment could not
be built.  Extra arguments are requirements to install instead of the newest, e.g.
``make test-latest LATEST="tokenizers==0.21.4"`` tries one release.

It first asks pip what the newest releases are (a dry-run resolution, about 13 s).  When every
package it would install is already in the dev environment at that version, the environment
would be the one ``make test`` ran the whole suite in: it prints the versions, says that the
tests were not run again, and exits 0.  ``--always`` (``LATEST=--always``) builds and runs
regardless.

Only the standard library is used here: it runs with any Python 3.11 (``make`` passes
``$(PYTHON)``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("VENV", REPO / ".venv-latest"))
DEV_VENV = Path(os.environ.get("DEV_VENV", REPO / ".venv"))
TORCH = "torch==2.13.0"
UPGRADE = ["tokenizers", "jinja2", "markupsafe", "transformers", "pyarrow", "numpy", "numba"]
# what the tests below need besides packshard[torch]: the runner, and the trainers that
# tests/torch/test_hf.py feeds (installed at their newest too, so a trainer that moves shows)
RUNNER = ["pytest", "pytest-xdist", "datasets", "trl", "accelerate"]
SHOWN = [*UPGRADE, "huggingface-hub", "safetensors", "datasets", "trl", "accelerate", "torch"]
TESTS = [
    "tests/test_contract.py",
    "tests/ingest/test_families.py",
    "tests/ingest/template/test_render.py",
    "tests/ingest/test_transformers_parity.py",
    "tests/verify/model/test_equivalence.py",
    "tests/torch/test_hf.py",
]


def versions(python: Path) -> dict[str, str | None]:
    """The installed versions of :data:`SHOWN` in the interpreter ``python`` (empty: none)."""
    return shown(installed(python))


def shown(found: dict[str, str]) -> dict[str, str | None]:
    """:data:`SHOWN`'s entries of ``found`` (from :func:`installed`); empty when it is."""
    return {n: found.get(dist_key(n)) for n in SHOWN} if found else {}


def pinned_with() -> dict[str, str | None]:
    """The library versions the fixture pins were made with."""
    pins = json.loads((REPO / "tests/fixtures/contract/pins.json").read_text(encoding="utf-8"))
    libraries: dict[str, str | None] = pins["made_with"]["libraries"]
    return libraries


def site_packages(venv: Path) -> Path | None:
    """The ``site-packages`` folder of a virtual environment, None when there is none."""
    found = sorted(venv.glob("lib/python3.*/site-packages"))
    return found[0] if len(found) == 1 else None


def link_torch() -> bool:
    """Hard-link the dev environment's torch 2.13.0 into :data:`VENV`; False when it has none.

    pip then finds torch installed at the held version and keeps it, instead of unpacking
    its 750 MB again; everything else is resolved and installed as usual.
    """
    dev, new = site_packages(DEV_VENV), site_packages(VENV)
    if dev is None or new is None or dev.parent.name != new.parent.name:
        return False
    records = list(dev.glob("torch-2.13.0*.dist-info/RECORD"))
    if len(records) != 1:
        return False
    lines = records[0].read_text(encoding="utf-8").splitlines()
    for top in sorted({line.split(",")[0].split("/")[0] for line in lines} - {".."}):
        source, target = dev / top, new / top
        if source.is_dir():
            shutil.copytree(source, target, copy_function=_link)
        elif source.is_file():
            _link(str(source), str(target))
    return True


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system: copy
        shutil.copy2(source, target)


def constraint_file() -> str:
    """A temporary constraints file holding torch at :data:`TORCH` (the caller removes it)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
        fh.write(TORCH + "\n")
        return fh.name


def resolve() -> dict[str, str] | None:
    """What a fresh :data:`VENV` would hold, as ``{name: version}``; None when pip cannot say.

    ``pip install --dry-run --ignore-installed --report`` resolves the same requirements as
    :func:`build` from the index (metadata only, nothing installed): about 13 s against the
    minute the build and its tests take.
    """
    if not (DEV_VENV / "bin/python").exists():  # no dev environment to compare with: build
        return None
    constraint = constraint_file()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            pip = [str(DEV_VENV / "bin/python"), "-m", "pip", "install", "--dry-run", "-q"]
            pip += ["--ignore-installed", "--report", str(report), "-c", constraint]
            pip += ["--upgrade", "--upgrade-strategy", "eager", "-e", ".[torch]"]
            done = subprocess.run([*pip, *RUNNER, *UPGRADE], cwd=REPO, capture_output=True)
            if done.returncode != 0 or not report.is_file():
                return None
            found = json.loads(report.read_text(encoding="utf-8")).get("install", [])
            return {dist_key(i["metadata"]["name"]): i["metadata"]["version"] for i in found}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.unlink(constraint)


def installed(python: Path) -> dict[str, str]:
    """Every distribution in the interpreter ``python``, as ``{name: version}`` (the first one
    on its path where a name is installed twice, as ``importlib.metadata.version`` finds)."""
    code = (
        "import json; from importlib.metadata import distributions as d\n"
        "print(json.dumps([(x.metadata['Name'], x.version) for x in d()]))"
    )
    if not python.exists():
        return {}
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        return {}
    found: dict[str, str] = {}
    for name, version in json.loads(out.stdout):
        found.setdefault(dist_key(name), version)
    return found


def differing(latest: dict[str, str], dev: dict[str, str]) -> list[str]:
    """The packages of ``latest`` that ``dev`` lacks or holds at another version."""
    return sorted(name for name, version in latest.items() if dev.get(dist_key(name)) != version)


def dist_key(name: str) -> str:
    """A distribution name as the index compares them (PEP 503)."""
    return name.lower().replace("_", "-").replace(".", "-")


def build(extra: list[str]) -> None:
    """Create :data:`VENV` afresh with the newest releases (or ``extra``), torch held."""
    if VENV.exists():
        shutil.rmtree(VENV)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    if link_torch():
        print(f"test-latest: {TORCH} linked from {DEV_VENV.name}", flush=True)
    constraint = constraint_file()
    try:
        python = str(VENV / "bin/python")
        pip = [python, "-m", "pip", "install", "-q", "--no-compile", "-c", constraint]
        wanted = extra or UPGRADE
        subprocess.run(
            [*pip, "--upgrade", "--upgrade-strategy", "eager", "-e", ".[torch]", *RUNNER, *wanted],
            check=True,
            cwd=REPO,
        )
        # pip compiles on one core; this on every core (a file that does not compile is left
        # to the import that needs it, as pip leaves it)
        purelib = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        subprocess.run([python, "-m", "compileall", "-q", "-j", "0", purelib], capture_output=True)
    finally:
        os.unlink(constraint)


def failures(junit: Path) -> list[tuple[str, str]]:
    """``(test id, the first lines of its assertion)`` of each failed or erroring test."""
    failed = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        for bad in (*case.findall("failure"), *case.findall("error")):
            text = (bad.text or bad.get("message") or "").splitlines()
            shown: list[str] = []
            for line in (t.strip().removeprefix("E").strip() for t in text if t.startswith("E ")):
                if line.startswith("assert ") or len(shown) == 3:
                    break
                shown.append(line)
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            failed.append((name, "\n    ".join(shown) if shown else "(no message)"))
    return failed


def table(dev: dict[str, str | None], latest: dict[str, str | None]) -> list[str]:
    pins = pinned_with()
    rows = [("library", "pins made with", "dev env", "latest", "")]
    for name in SHOWN:
        moved = (
            "held" if name == "torch" else ("moved" if latest.get(name) != dev.get(name) else "")
        )
        rows.append(
            (name, pins.get(name) or "-", dev.get(name) or "-", latest.get(name) or "-", moved)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    always = "--always" in argv
    argv = [a for a in argv if a != "--always"]
    if not argv and not always:
        latest_all, dev_all = resolve(), installed(DEV_VENV / "bin/python")
        if latest_all and not differing(latest_all, dev_all):
            dev = shown(dev_all)
            print("test-latest: versions")
            print("\n".join(f"  {line}" for line in table(dev, dev)))
            print(
                f"test-latest: nothing moved: the newest releases of all {len(latest_all)} "
                f"packages are the versions `make test` ran with, so the tests were not run "
                f"again ({time.perf_counter() - started:.0f} s; --always runs them anyway)"
            )
            return 0
    print(f"test-latest: building {VENV.name} with the newest releases, {TORCH} held", flush=True)
    try:
        build(argv)
    except subprocess.CalledProcessError as exc:
        print(f"test-latest: could not build {VENV.name}: {exc}", file=sys.stderr)
        return 2
    latest = versions(VENV / "bin/python")
    if not str(latest.get("torch") or "").startswith("2.13.0"):
        print(
            f"test-latest: torch {latest.get('torch')} was installed, not 2.13.0", file=sys.stderr
        )
        return 2
    dev = versions(DEV_VENV / "bin/python") or pinned_with()
    built = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        python = str(VENV / "bin/python")
        options = ["-q", "-n", "2", "-m", "not slow", "-p", "no:cacheprovider"]
        run = subprocess.run(
            [python, "-m", "pytest", *options, f"--junitxml={junit}", *TESTS], cwd=REPO
        )
        failed = failures(junit) if junit.is_file() else [("pytest", f"exit {run.returncode}")]
    newer = [f"{n} {dev.get(n)} → {latest.get(n)}" for n in SHOWN if latest.get(n) != dev.get(n)]
    print("\ntest-latest: versions")
    print("\n".join(f"  {line}" for line in table(dev, latest)))
    print(f"versions that differ from the dev env: {', '.join(newer) if newer else 'none'}")
    if failed:
        print(f"moved with them ({len(failed)} tests failed):")
        for name, message in failed:
            print(f"  {name}: {message}")
    took = time.perf_counter() - started
    timing = f"({built:.0f} s to build, {took:.0f} s in all)"
    if failed or run.returncode not in (0, 5):
        print(f"test-latest: MOVED: {len(failed)} tests fail with these releases {timing}")
        return 1
    print(f"test-latest: nothing moved: pins, parity and equivalence hold {timing}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
