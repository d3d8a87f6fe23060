"""``respill``: the parent's examples, as pack's spill writer spills them.

Where no example is cut or dropped, the spill is made straight from the index (and pass 1's
files, for ``wrapped``: :func:`whole_spill`); it must equal what the spill writer makes of
the same examples (:func:`policed_spill`), array by array.  :func:`lay_out` reads the tokens
into the planned order, and a parent whose index disagrees with its shards is refused.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from packshard.arrays import exclusive_cumsum
from packshard.errors import FormatError
from packshard.format.manifest import load_manifest
from packshard.pack.plan.rows import RowPlan
from packshard.pack.units.parts import read_part_ranges
from packshard.repack import RepackConfig, repack_dataset
from packshard.repack.respill import parent_examples, policed_spill, whole_spill
from packshard.repack.tokens import lay_out, parent_tokens
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
    examples, lengths, targets = parent_examples(parent, manifest)
    stored = parent_tokens(parent, work / "parent", lengths, targets)
    fmt = tuple(manifest["loss"]["by_format"])
    straight = whole_spill(stored.offsets, stored.loss_tokens, examples, fmt[:1], stored.part_files)
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


def test_lay_out_puts_each_segment_where_the_plan_writes_it(parent, tmp_path):
    manifest = load_manifest(parent)
    _, lengths, targets = parent_examples(parent, manifest)
    stored = parent_tokens(parent, tmp_path / "by-id", lengths, targets)
    rng = np.random.default_rng(0)
    planned = rng.permutation(len(lengths))[: len(lengths) - 3]  # three left out
    planned = np.concatenate([planned, planned[:2]])  # and two planned twice (--mix)
    plan = RowPlan.from_segments(
        np.array([0, len(planned)], np.int64),
        planned,
        np.zeros(len(planned), np.int64),
        lengths[planned],
        int(lengths.sum()),
        "bfd",
    )
    empty = whole_spill(exclusive_cumsum(lengths), targets, *_examples_fmt(parent, manifest))
    laid = lay_out(parent, tmp_path / "laid", lengths, targets, empty, plan)
    starts = laid.offsets[planned]
    assert (starts[:-2] == exclusive_cumsum(lengths[planned[:-2]])[:-1]).all()  # consecutive
    assert (starts[-2:] == starts[:2]).all()  # a second copy reads the first
    got = read_part_ranges(laid.part_files, starts, lengths[planned])
    want = read_part_ranges(stored.part_files, stored.offsets[planned], lengths[planned])
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert (laid.offsets[np.setdiff1d(np.arange(len(lengths)), planned)] == -1).all()


def _examples_fmt(parent: Path, manifest):
    examples, _, _ = parent_examples(parent, manifest)
    return examples, tuple(manifest["loss"]["by_format"])[:1]


def _copy(parent: Path, to: Path) -> Path:
    to.mkdir()
    for path in parent.iterdir():
        if path.is_file():
            (to / path.name).write_bytes(path.read_bytes())
    return to


@pytest.mark.parametrize(
    ("column", "why"),
    [("num_tokens", "disagree on its length"), ("num_loss_tokens", "disagree on its targets")],
)
@pytest.mark.parametrize("max_seq_len", [512, 64])  # laid out after planning; pass 1 first
def test_an_index_that_disagrees_with_the_shards_is_refused(
    parent, tmp_path, column, why, max_seq_len
):
    copy = _copy(parent, tmp_path / "copy")
    index = pq.read_table(copy / "examples.parquet")
    values = index[column].to_numpy().copy()
    values[0] += 1
    at = index.schema.get_field_index(column)
    changed = index.set_column(at, index.schema.field(at), [values])
    pq.write_table(changed, copy / "examples.parquet", compression="zstd")
    config = RepackConfig.build(str(copy), str(tmp_path / "out"), max_seq_len=max_seq_len)
    with pytest.raises(FormatError, match=why):
        repack_dataset(config)
    assert not (tmp_path / "out" / "manifest.json").exists()
