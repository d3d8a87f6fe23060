"""Re-pin the fixture packs: pack them again and rewrite tests/fixtures/contract/pins.json.

Run it deliberately (`make repin`), when a change of the packed contract is intended: a new
column or config key (the file bytes move), a fixed bug, or an upgrade whose new ids, labels
or seams you have checked.  It prints what differs from the pins it replaces, pack by pack,
so the commit can say why.  `--check` only compares and exits 1 when anything differs.

    python scripts/repin_fixtures.py [--check]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packshard.digests import sha256_path
from tests.helpers import (
    FIXTURE_FILES,
    FIXTURE_OPTIONS,
    FIXTURE_PACKS,
    FIXTURES,
    PINS,
    compare_decoded,
    compare_files,
    decoded_pins,
    example_places,
    format_pins,
    moved_versions,
    pack_fixture,
    pins_environment,
)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    old = json.loads(PINS.read_text(encoding="utf-8")) if PINS.is_file() else None
    pins = {
        "about": (
            "Decoded columns and file bytes of the fixture packs, held by tests/test_contract.py; "
            "rewrite deliberately with `make repin`"
        ),
        "made_with": pins_environment(),
        "fixtures": {name: sha256_path(FIXTURES / name) for name in FIXTURE_FILES},
        "options": FIXTURE_OPTIONS,
        "packs": {},
    }
    if old is not None:
        moved = moved_versions(old["made_with"])
        print(f"versions changed since the last pins: {', '.join(moved) or 'none'}")
        for name, sha in pins["fixtures"].items():
            if old["fixtures"].get(name) != sha:
                print(f"fixture {name} changed since the last pins")
    changed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, options in FIXTURE_PACKS.items():
            out = pack_fixture(name, Path(tmp) / name)
            got = decoded_pins(out)
            pins["packs"][name] = {"options": options, **got}
            if old is None or name not in old["packs"]:
                print(f"{name}: new")
                changed += 1
                continue
            problems = compare_decoded(old["packs"][name], got, example_places(out))
            files = compare_files(old["packs"][name]["files"], got["files"])
            changed += bool(problems or files)
            print(f"{name}: {len(problems)} decoded differences, {len(files)} files differ")
            for line in (problems + files)[:10]:
                print(f"  {line}")
    if check:
        return 1 if changed else 0
    PINS.write_text(format_pins(pins), encoding="utf-8")
    print(f"wrote {PINS.relative_to(FIXTURES.parents[2])} ({PINS.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
