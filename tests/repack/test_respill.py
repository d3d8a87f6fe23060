"""``respill``: the parent's tokens back in example-id order, as pack's spill writer spills them.

Where no example is cut or dropped, the spill is made straight from pass 1's files
(:func:`whole_spill`); it must equal what the spill writer makes of the same examples
(:func:`policed_spill`), array by array, and a parent whose index disagrees with its shards
is refused.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from packshard.errors import FormatError
from packshard.format.manifest import load_manifest
from packshard.pack.units.parts import read_part_ranges
from packshard.repack import RepackConfig
from packshard.repack.respill import (
    parent_examples,
    parent_tokens,
    policed_spill,
    respill,
    whole_spill,
)
from tests.helpers import pack_demo_into


@pytest.fixture(scope="module")
def parent(tmp_path_factory, packed_demo_tokenizer) -> Path:
    root = tmp_path_factory.mktemp("parent")
    return pack_demo_into(root, packed_demo_tokenizer, max_seq_len=512, shard_rows=4, loss="all")


def spills(parent: Path, work: Path, max_seq_len: int):
    """Both spills of ``parent`` at ``max_seq_len``: made straight, and by the spill writer."""
    manifest = load_manifest(parent)
    config = RepackConfig.build(str(parent), str(work / "out"), max_seq_len=max_seq_len)
    pack_config = config.pack_config(manifest)
    examples, lengths = parent_examples(parent, manifest)
    stored = parent_tokens(parent, work / "parent", lengths)
    fmt = tuple(manifest["loss"]["by_format"])
    straight = whole_spill(stored, examples, fmt[:1])
    written, rejects = policed_spill(stored, examples, pack_config, work / "spill", fmt)
    return straight, written, rejects


def test_the_straight_spill_is_the_spill_writers(parent, tmp_path):
    straight, written, rejects = spills(parent, tmp_path, 512)
    assert rejects == []
    assert len(straight) == len(written) > 0
    for field in dataclasses.fields(straight):
        mine, theirs = getattr(straight, field.name), getattr(written, field.name)
        if field.name == "part_files":
            assert np.array_equal(mine.bases, theirs.bases)
            continue
        if isinstance(mine, np.ndarray):
            assert mine.dtype == theirs.dtype, field.name
            assert np.array_equal(mine, theirs), field.name
        else:
            assert mine == theirs, field.name
    # the same tokens and labels behind both
    starts, lengths = straight.offsets[:-1], straight.lengths
    got = read_part_ranges(straight.part_files, starts, lengths)
    want = read_part_ranges(written.part_files, starts, lengths)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_shorter_length_goes_through_the_spill_writer(parent, tmp_path):
    straight, written, rejects = spills(parent, tmp_path, 64)
    assert rejects  # the control: examples over 64 tokens are dropped, so the spills differ
    assert len(written) < len(straight)


def test_an_index_that_disagrees_with_the_shards_is_refused(parent, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in parent.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    index = pq.read_table(copy / "examples.parquet")
    lengths = index["num_tokens"].to_numpy().copy()
    lengths[0] += 1
    column = index.schema.get_field_index("num_tokens")
    changed = index.set_column(column, index.schema.field(column), [lengths])
    pq.write_table(changed, copy / "examples.parquet", compression="zstd")
    manifest = json.loads((copy / "manifest.json").read_text())
    config = RepackConfig.build(str(copy), str(tmp_path / "out"), max_seq_len=512)
    with pytest.raises(FormatError, match="disagree on its length"):
        respill(copy, manifest, config.pack_config(manifest), tmp_path / "work")
