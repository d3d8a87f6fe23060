r"""``inspect``: one packed row as a person wants to see it.

Each segment is shown with its example id, source ``file:line``, part, token count and
positions, then its decoded text where trained tokens (labels ≠ -100) are highlighted and
prompt tokens are dim.  Seams are drawn between segments, so a reader sees at a glance that
every example starts at position 0 with a masked first label (brackets below stand for the
green highlight of trained text)::

    ── segment 1 · example 17 · chat.jsonl:42 · 37 tokens · positions 0…36 ──
    <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n[Hello!<|im_end|>]
    ══ seam ══

``--html`` writes the same view as a self-contained page (:mod:`packshard.cli.html`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from packshard.errors import FormatError, InputError, UsageError
from packshard.format.examples import ExamplesIndex, read_examples
from packshard.format.folder.paths import MISSING, inside_folder
from packshard.format.manifest import load_manifest
from packshard.format.shards import read_row, read_shard, rows_problem
from packshard.options import REASONING_MARKERS
from packshard.records import IGNORE_INDEX, PackedRow


@dataclass(frozen=True, slots=True)
class SegmentView:
    """One segment of an inspected row, decoded into runs of trained / untrained text."""

    index: int
    example_id: int
    source: str
    part: int
    num_tokens: int
    num_loss_tokens: int
    positions: tuple[int, int]
    runs: tuple[tuple[str, bool], ...]  # (text, trained)
    reasoning: tuple[bool, ...] = ()  # per run: inside a reasoning block (empty: none)
    turn: int = 0  # --turns expand: the message the example trains
    repeat: int = 0  # --mix: which copy of its record's example (0: the first)


@dataclass(frozen=True, slots=True)
class RowView:
    """A decoded packed row."""

    shard: str
    row: int
    num_tokens: int
    max_seq_len: int
    segments: tuple[SegmentView, ...]


def _runs(
    tokenizer: Any, ids: np.ndarray, trained: np.ndarray, thought: np.ndarray
) -> tuple[tuple[tuple[str, bool], ...], tuple[bool, ...]]:
    """Split a segment into maximal runs of equal trained-ness (and reasoning); decode each."""
    if len(ids) == 0:
        return (), ()
    kind = trained.astype(np.int8) + 2 * thought.astype(np.int8)
    cuts = np.flatnonzero(np.diff(kind)) + 1
    bounds = np.concatenate(([0], cuts, [len(ids)]))
    out = []
    for lo, hi in pairwise(bounds.tolist()):
        piece = ids[lo:hi].tolist()
        text = tokenizer.decode(piece, skip_special_tokens=False) if tokenizer else str(piece)
        out.append((text, bool(trained[lo])))
    flags = tuple(bool(thought[lo]) for lo in bounds[:-1].tolist())
    return tuple(out), flags if any(flags) else ()


def reasoning_tokens(tokenizer: Any, ids: np.ndarray, markers: tuple[str, str]) -> np.ndarray:
    """Mark the tokens of every ``open … close`` block (and the whitespace after it)."""
    out = np.zeros(len(ids), dtype=bool)
    if tokenizer is None or not len(ids):
        return out
    pieces = tokenizer.decode_batch([[i] for i in ids.tolist()], skip_special_tokens=False)
    ends = np.cumsum([len(p) for p in pieces])
    starts = ends - np.array([len(p) for p in pieces])
    block = re.compile(rf"{re.escape(markers[0])}.*?{re.escape(markers[1])}\s*", re.S)
    for m in block.finditer("".join(pieces)):
        out[(ends > m.start()) & (starts < m.end())] = True
    return out


def inspect_row(
    out: str | Path, row: int = 0, shard: int = 0, tokenizer: str | None = None
) -> RowView:
    """Decode row ``row`` of shard ``shard`` with the recorded (or given) tokenizer.

    Raises:
        UsageError: ``--shard`` or ``--row`` out of range.
        InputError: the shard is missing.
        FormatError: the shard is damaged or belongs to another dataset.

    """
    folder = Path(out)
    manifest = load_manifest(folder)
    shards = manifest["shards"]
    if not 0 <= shard < len(shards):
        raise UsageError(f"--shard {shard} out of range (the folder has {len(shards)} shards)")
    name = shards[shard]["path"]
    try:
        path = inside_folder(folder, name)
    except FormatError as exc:
        if exc.problem != MISSING:
            problem = f"{exc.problem} (run packshard verify)"
            raise FormatError(str(folder / exc.path), problem) from None
        raise InputError(
            f"{folder / name}: shard missing (run packshard verify {out} to audit the folder)"
        ) from None
    table = read_shard(path, manifest["dataset_id"])
    if not 0 <= row < table.num_rows:
        raise UsageError(f"--row {row} out of range ({name} has {table.num_rows} rows)")
    broken = rows_problem(table.slice(row, 1))
    if broken is not None:  # a crafted row: say so instead of decoding nonsense
        why = broken.replace("row 0: ", "")
        raise FormatError(f"{path}", f"row {row}: {why} (run packshard verify)")
    packed: PackedRow = read_row(table, row)
    where = _index_entries(folder, manifest, packed.example_ids)
    tok = _decoder(tokenizer, manifest["tokenizer"])
    size = tok.get_vocab_size(with_added_tokens=True) if tok is not None else 1 << 31
    outside = np.flatnonzero((packed.input_ids < 0) | (packed.input_ids >= size))
    if outside.size:  # the tokenizer cannot decode it: say so in one line
        at = int(outside[0])
        raise FormatError(
            str(path),
            f"row {row}: token id {int(packed.input_ids[at])} at position {at} is not in the "
            f"tokenizer's vocabulary of {size:,} (run packshard verify)",
        )
    recorded = manifest["config"].get("reasoning_markers") or REASONING_MARKERS
    markers = (str(recorded[0]), str(recorded[1]))
    segments = []
    for s in range(packed.num_segments):
        lo, hi = int(packed.cu_seqlens[s]), int(packed.cu_seqlens[s + 1])
        eid = int(packed.example_ids[s])
        source, part, turn, repeat = where.get(eid, ("?", 0, 0, 0))
        trained = packed.labels[lo:hi] != IGNORE_INDEX
        ids = packed.input_ids[lo:hi]
        runs, reasoning = _runs(tok, ids, trained, reasoning_tokens(tok, ids, markers))
        segments.append(
            SegmentView(
                index=s,
                example_id=eid,
                source=source,
                part=part,
                num_tokens=hi - lo,
                num_loss_tokens=int(trained.sum()),
                positions=(int(packed.position_ids[lo]), int(packed.position_ids[hi - 1])),
                runs=runs,
                reasoning=reasoning,
                turn=turn,
                repeat=repeat,
            )
        )
    max_seq_len = int(manifest["config"]["max_seq_len"])
    return RowView(name, row, packed.num_tokens, max_seq_len, tuple(segments))


def _index_entries(
    folder: Path, manifest: dict[str, Any], example_ids: np.ndarray
) -> dict[int, tuple[str, int, int, int]]:
    """Return ``{example_id: ("file:line", part, turn, repeat)}`` for the ids ({}: unreadable)."""
    try:
        path = inside_folder(folder, manifest["files"]["examples"]["path"])
        table = read_examples(path, manifest["dataset_id"])
    except (FormatError, OSError):
        return {}  # the row still shows; verify reports the damaged index
    index = ExamplesIndex.from_table(table)
    parts = table["part"].to_numpy()
    turns = index.turns if index.turns is not None else np.zeros(len(parts), dtype=np.int32)
    repeats = index.repeats if index.repeats is not None else np.zeros(len(parts), dtype=np.int32)
    found = {}
    for eid, at in zip(example_ids.tolist(), index.lookup(example_ids).tolist(), strict=True):
        if at >= 0:
            found[eid] = (str(index.where(eid)), int(parts[at]), int(turns[at]), int(repeats[at]))
    return found


def _decoder(path: str | None, recorded: dict[str, Any]) -> Any:
    """Load ``path``, else the recorded tokenizer; None when it does not load."""
    if not path:  # the recorded path, or where pack resolved it when that is not found from here
        path, resolved = recorded["path"], recorded.get("resolved")
        if not Path(path).exists() and isinstance(resolved, str) and Path(resolved).exists():
            path = resolved
    try:
        from packshard.ingest import load_tokenizer

        return load_tokenizer(path).tokenizer
    except Exception:  # decoding is a convenience: fall back to ids
        return None


TRAINED_MARKS = ("⟦", "⟧")
"""What brackets trained text where colour is not seen (``marked``: a pipe, a log)."""


def render_row_console(view: RowView, marked: bool = False) -> Any:
    """Build a rich renderable: a header per segment, trained text highlighted, seams drawn.

    ``marked`` (stdout not a terminal) also brackets trained text with :data:`TRAINED_MARKS`
    and draws seams as a short line, so that the view keeps its meaning without colour.
    """
    from rich.console import Group
    from rich.rule import Rule
    from rich.text import Text

    parts: list[Any] = [
        Text(
            f"{view.shard} row {view.row}: {view.num_tokens}/{view.max_seq_len} tokens, "
            f"{len(view.segments)} segments",
            style="bold",
        )
    ]
    styles = {(True, False): "bold green", (False, False): "dim"}
    styles.update({(True, True): "bold magenta", (False, True): "dim magenta"})
    for seg in view.segments:
        if seg.index:
            parts.append(Text("══ seam ══") if marked else Rule("seam", style="red"))
        parts.append(Text(segment_title(seg), style="cyan"))
        body = Text()
        flags = seg.reasoning or (False,) * len(seg.runs)
        for (text, trained), thought in zip(seg.runs, flags, strict=True):
            shown = f"{TRAINED_MARKS[0]}{text}{TRAINED_MARKS[1]}" if marked and trained else text
            body.append(shown, style=styles[trained, thought])
        parts.append(body)
    legend = "legend: trained tokens in green, context dim"
    if marked:
        legend = "legend: trained tokens between ⟦ ⟧, context unmarked"
    if any(seg.reasoning for seg in view.segments):
        shown = "within its markers" if marked else "in magenta (bold: trained)"
        legend += f"; reasoning {shown}"
    parts.append(Text(legend, style="dim"))
    return Group(*parts)


def segment_title(seg: SegmentView) -> str:
    """Return the one-line header of a segment (the terminal and the HTML page share it)."""
    turn = f" · message {seg.turn}" if seg.turn else ""
    turn += f" · copy {seg.repeat + 1}" if seg.repeat else ""
    return (
        f"segment {seg.index} · example {seg.example_id} · {seg.source} · "
        f"part {seg.part}{turn} · {seg.num_tokens} tokens ({seg.num_loss_tokens} trained) · "
        f"positions {seg.positions[0]}…{seg.positions[1]}"
    )
