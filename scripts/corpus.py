"""A benchmark corpus of chat records in which no record repeats, built the same on any machine.

Why: a benchmark that copies a small dataset N times measures an encoder's caches from the
second copy on (fastokens and gigatoken encode text they have seen 5-6x faster; ``tokenizers``
does not), so its ratios flatter whoever caches.  This module builds chat records from real
text that ships with the environment, each record once, in the shapes real SFT data has:

    the shared chat files (../shared/data/chat), once, as they are         ~1.2M tokens
    + records cut from the text of the Python standard library and the
      installed packages, in a fixed order (files sorted by path, whole
      files and chunks deduplicated by SHA-256), until --chars is reached  ~3.7 chars a token

Each source record draws, from one seeded ``random.Random``, its format and its turns:

    format    messages 40% (a system prompt in half)  sharegpt 30%  alpaca 30% (history)
    turns     1: 35%  2: 30%  3: 20%  4: 15%
    a turn    user: a question line + a piece of 300-1,500 characters (source or docstring)
              assistant: the piece that follows it in the same file, 300-1,500 characters

so 1-4 turns of 300-1,500 characters a message, like chat SFT data (the shared files' median
message is about 400 characters).  Pieces are cut at line ends; a file too short for the
record's turns is joined with the next.  A piece whose SHA-256 was already used is skipped, so
no message text repeats, and hence no record.

The output is ``OUT/shared-*.json(l)`` (copies of the shared files) and ``OUT/source-NNN.jsonl``
(one file per 8 MiB of records, so that ``pack`` cuts work units as it would on real inputs),
plus ``OUT/corpus.json``: the record counts per format and turn count, the characters, the
Python version, the versions of the packages read, and a SHA-256 over every file in order.
Equal checksums mean equal corpora; the build depends only on the Python version and the
package versions it prints, and a smaller ``--chars`` gives a prefix of a larger one's source
records.  Standard library only: it does not import packshard.

    python scripts/corpus.py OUT --chars 80000000 [--seed 0] [--no-shared]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import random
import shutil
import sys
import sysconfig
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_CHAT = REPO.parent / "shared" / "data" / "chat"
FILE_BYTES = 8 << 20
SUFFIXES = (".py", ".pyi", ".rst", ".md", ".txt")
SKIP_PARTS = {"__pycache__", "test", "tests", "idlelib", "lib2to3", "site-packages", "_vendor"}
SYSTEMS = (
    "You are a careful Python reviewer.",
    "You are a helpful assistant who explains library code to new contributors.",
    "Answer as a senior engineer: precise, short, with examples where they help.",
    "You are a documentation writer. Keep the original behaviour exact.",
)
ASKS = (
    "What does this part of {name} do?",
    "Explain the following excerpt from {name}, step by step.",
    "Here is some code from {name}. Continue it in the same style.",
    "Review this piece of {name} and say what comes next.",
    "I am reading {name}. What follows after this?",
    "Summarise this fragment of {name} for a colleague.",
)
FORMATS = (("messages", 40), ("sharegpt", 30), ("alpaca", 30))
TURNS = ((1, 35), (2, 30), (3, 20), (4, 15))


def source_files() -> list[tuple[str, Path]]:
    """Every text file of the standard library and the installed packages, in a fixed order."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    out: list[tuple[str, Path]] = []
    for root in roots:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if path.suffix not in SUFFIXES or SKIP_PARTS.intersection(rel.parts[:-1]):
                continue
            if rel.parts[0].endswith((".dist-info", ".egg-info")) or "packshard" in rel.parts[0]:
                continue
            if root.name != "site-packages" and rel.parts[0] == "site-packages":
                continue
            if path.is_file() and not path.is_symlink():
                out.append((f"{root.name}/{rel.as_posix()}", path))
    return out


def package_versions() -> dict[str, str]:
    """The installed distributions and their versions (what the source records depend on)."""
    found = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()}
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def pieces(rng: random.Random) -> Iterator[tuple[str, str]]:
    """(file name, piece) in file order: 300-1,500 characters at line ends, each piece once."""
    seen_files: set[bytes] = set()
    seen: set[bytes] = set()
    for name, path in source_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        digest = hashlib.sha256(text.encode()).digest()
        if digest in seen_files or len(text) < 300:
            continue
        seen_files.add(digest)
        lines = text.splitlines(keepends=True)
        i = 0
        while i < len(lines):
            want = rng.randint(300, 1500)
            j, size = i, 0
            while j < len(lines) and size < want:
                size += len(lines[j])
                j += 1
            piece = "".join(lines[i:j]).strip("\n")
            i = j
            if not 300 <= len(piece) <= 3000 or "\x00" in piece:
                continue
            key = hashlib.sha256(piece.encode()).digest()
            if key in seen:
                continue
            seen.add(key)
            yield name, piece


def pick(rng: random.Random, table: tuple[tuple, ...]):
    """One value of a (value, weight) table."""
    return rng.choices([v for v, _ in table], weights=[w for _, w in table])[0]


def records(seed: int) -> Iterator[tuple[dict, str, int]]:
    """(record, format, turns), each from pieces never used before, until the text ends."""
    rng = random.Random(seed)
    stream = pieces(random.Random(seed + 1))
    for _ in iter(int, 1):
        fmt, turns = pick(rng, FORMATS), pick(rng, TURNS)
        pairs = []
        for _ in range(turns):
            try:
                name, ask = next(stream)
                _, answer = next(stream)
            except StopIteration:
                return
            question = rng.choice(ASKS).format(name=name.rsplit("/", 1)[-1])
            pairs.append((f"{question}\n\n{ask}", answer))
        system = rng.choice(SYSTEMS) if rng.random() < 0.5 else None
        yield shape(fmt, pairs, system), fmt, turns


def shape(fmt: str, pairs: list[tuple[str, str]], system: str | None) -> dict:
    """One record in ``fmt`` from its (user, assistant) turns."""
    if fmt == "messages":
        msgs = [{"role": "system", "content": system}] if system else []
        for user, assistant in pairs:
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        return {"messages": msgs}
    if fmt == "sharegpt":
        conv = [
            turn
            for user, assistant in pairs
            for turn in ({"from": "human", "value": user}, {"from": "gpt", "value": assistant})
        ]
        return {"conversations": conv, **({"system": system} if system else {})}
    *history, (user, assistant) = pairs
    question, _, excerpt = user.partition("\n\n")
    out = {"instruction": question, "input": excerpt, "output": assistant}
    if history:
        out["history"] = [list(pair) for pair in history]
    return {**out, **({"system": system} if system else {})}


def build(out: Path, chars: int, seed: int = 0, shared: bool = True) -> dict:
    """Write the corpus into ``out`` (made empty first); return what ``corpus.json`` holds."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files: list[Path] = []
    if shared and SHARED_CHAT.is_dir():
        for src in sorted(SHARED_CHAT.glob("*.json*")):
            dst = out / f"shared-{src.name}"
            shutil.copyfile(src, dst)
            files.append(dst)
    counts: Counter[str] = Counter()
    total = 0
    index, handle, written = 0, None, FILE_BYTES
    for record, fmt, turns in records(seed):
        if total >= chars:
            break
        line = json.dumps(record, ensure_ascii=False) + "\n"
        if written >= FILE_BYTES:
            if handle is not None:
                handle.close()
            files.append(out / f"source-{index:03d}.jsonl")
            handle, written, index = files[-1].open("w", encoding="utf-8"), 0, index + 1
        handle.write(line)
        written += len(line.encode())
        total += len(line)
        counts[f"{fmt}, {turns} turn{'s' * (turns > 1)}"] += 1
    if handle is not None:
        handle.close()
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    info = {
        "checksum": digest.hexdigest(),
        "chars": total,
        "files": [f.name for f in files],
        "python": sys.version.split()[0],
        "records": dict(sorted(counts.items())),
        "seed": seed,
        "shared": shared and SHARED_CHAT.is_dir(),
        "packages": package_versions(),
    }
    (out / "corpus.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--chars", type=int, default=80_000_000, help="source characters")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-shared", action="store_true", help="leave the shared files out")
    args = parser.parse_args()
    info = build(args.out, args.chars, args.seed, not args.no_shared)
    print(f"{args.out}: {sum(info['records'].values()):,} source records, {info['chars']:,} "
          f"characters, shared chat files {'in' if info['shared'] else 'out'}")  # fmt: skip
    for kind, n in info["records"].items():
        print(f"  {kind:22s} {n:>9,}")
    print(f"python {info['python']}, {len(info['packages'])} packages; sha256 {info['checksum']}")


if __name__ == "__main__":
    main()
