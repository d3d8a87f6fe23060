"""Shared fixtures: real third-party inputs from ``../shared/data`` when present."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of real tokenizers and chat datasets; skip when this checkout has none."""
    if not (SHARED_DATA / "tokenizers").is_dir():
        pytest.skip(
            f"real third-party data not found at {SHARED_DATA} (kept outside the repository)"
        )
    return SHARED_DATA


# --- pack: hermetic tokenizers and a checked runner -------------------------------------------

import json  # noqa: E402
from collections import Counter  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from packshard.records import IGNORE_INDEX  # noqa: E402
from packshard.pack.spill import Spill  # noqa: E402


def make_spill(labels: list[list[int]]) -> Spill:
    """An in-memory spill whose example i has tokens 100*i + k and the given labels."""
    n = len(labels)
    lengths = [len(lab) for lab in labels]
    tokens = np.concatenate([[], *(100 * i + np.arange(k) for i, k in enumerate(lengths))])
    flat = np.array([v for lab in labels for v in lab], dtype=np.int32)
    trained = [sum(v != IGNORE_INDEX for v in lab[1:]) for lab in labels]
    zeros = np.zeros(n, dtype=np.int32)
    return Spill(
        tokens=tokens.astype(np.int32),
        labels=flat,
        offsets=np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
        loss_tokens=np.array(trained, dtype=np.int32),
        source_index=zeros,
        lines=np.arange(1, n + 1, dtype=np.int64),
        parts=zeros,
        starts=np.zeros(n, dtype=np.int64),
        domain_codes=zeros,
        truncated=np.zeros(n, dtype=bool),
        record_ids=np.arange(n, dtype=np.int64),
    )


WORD_VOCAB = {"<eos>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, 500)}}


@pytest.fixture(scope="session")
def demo_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The offline demo BPE (ChatML special tokens), trained once per session."""
    from packshard.demo import build_demo_tokenizer

    return build_demo_tokenizer(tmp_path_factory.mktemp("demo_tokenizer"))


@pytest.fixture(scope="session")
def word_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer whose token ``wN`` has id N and ``<eos>`` id 0.

    A ``text`` record ``"w5 w6 w7"`` encodes to ``[5, 6, 7, 0]`` (text + EOS, every token a
    target), so packs can be computed by hand.
    """
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    folder = tmp_path_factory.mktemp("word_tokenizer")
    tok = Tokenizer(models.WordLevel(vocab=WORD_VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken("<eos>", special=True, normalized=False)])
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<eos>", "add_bos_token": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def write_jsonl(path: Path, records: list[Any]) -> Path:
    """Write one JSON value per line (strings are written verbatim, for broken lines)."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@dataclass
class PackOutput:
    """A finished pack, read back: manifest, rows per shard, examples index, rejects."""

    out: Path
    manifest: dict[str, Any]
    rows: list[Any]  # PackedRow, in shard order then row order
    row_place: list[tuple[int, int]]  # (shard, row) of each entry of ``rows``
    examples: dict[str, list[Any]]  # examples.parquet as columns
    rejects: list[dict[str, Any]]

    def segment(self, example_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(input_ids, labels, position_ids)`` of one example, found via the index."""
        i = self.examples["example_id"].index(example_id)
        shard, row = self.examples["shard"][i], self.examples["row"][i]
        packed = self.rows[self.row_place.index((shard, row))]
        j = int(np.flatnonzero(packed.example_ids == example_id)[0])
        lo, hi = int(packed.cu_seqlens[j]), int(packed.cu_seqlens[j + 1])
        return packed.input_ids[lo:hi], packed.labels[lo:hi], packed.position_ids[lo:hi]

    def records(self) -> dict[tuple[str, int], list[int]]:
        """Example ids per record ``(source, line)``, in part order."""
        out: dict[tuple[str, int], list[tuple[int, int]]] = {}
        ex = self.examples
        for k, eid in enumerate(ex["example_id"]):
            out.setdefault((ex["source"][k], ex["line"][k]), []).append((ex["part"][k], eid))
        return {key: [eid for _, eid in sorted(parts)] for key, parts in out.items()}


def check_pack_output(out: Path) -> PackOutput:
    """Read ``out`` and check every property of the shard contract that needs no source."""
    import pyarrow.parquet as pq

    from packshard.format.manifest import schema_errors, sha256_path
    from packshard.records import PackedRow
    from packshard.format.shards import read_row

    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert schema_errors(manifest) == []
    stats = manifest["stats"]
    max_seq_len = manifest["config"]["max_seq_len"]
    # counting rule, in total and per domain
    assert stats["records"] == stats["records_packed"] + stats["rejected"] + stats["dropped"]
    assert stats["records"] == sum(i["records"] for i in manifest["inputs"])
    for key in ("records", "records_packed", "rejected", "dropped", "examples", "tokens"):
        assert sum(d[key] for d in stats["domains"].values()) == stats[key], key
    for d in stats["domains"].values():
        assert d["records"] == d["records_packed"] + d["rejected"] + d["dropped"]
    rejects_text = (out / "rejects.jsonl").read_text(encoding="utf-8")
    rejects = [json.loads(line) for line in rejects_text.splitlines()]
    assert len(rejects) == stats["rejected"] + stats["dropped"]
    assert Counter(r["code"] for r in rejects) == Counter(stats["rejects_by_code"])
    for reject in rejects:
        assert sorted(reject) == ["code", "domain", "line", "reason", "source"]
    # files and shards against the manifest
    names = {"manifest.json", "examples.parquet", "rejects.jsonl"}
    names |= {s["path"] for s in manifest["shards"]}
    assert {p.name for p in out.iterdir()} == names
    for entry in manifest["files"].values():
        assert sha256_path(out / entry["path"]) == entry["sha256"]
    rows: list[PackedRow] = []
    place: list[tuple[int, int]] = []
    for k, entry in enumerate(manifest["shards"]):
        path = out / entry["path"]
        assert sha256_path(path) == entry["sha256"]
        assert path.stat().st_size == entry["bytes"]
        table = pq.read_table(path)
        meta = table.schema.metadata
        assert meta[b"packshard.format_version"] == b"1"
        assert meta[b"packshard.dataset_id"] == manifest["dataset_id"].encode()
        assert table.num_rows == entry["rows"]
        assert sum(table["num_tokens"].to_pylist()) == entry["tokens"]
        assert sum(table["num_loss_tokens"].to_pylist()) == entry["loss_tokens"]
        for r in range(table.num_rows):
            row = read_row(table, r)
            cu = row.cu_seqlens
            assert cu[0] == 0 and cu[-1] == row.num_tokens <= max_seq_len
            assert np.all(np.diff(cu) > 0)
            assert len(row.example_ids) == row.num_segments
            assert np.all(row.labels[cu[:-1]] == IGNORE_INDEX)
            trained = row.labels != IGNORE_INDEX
            assert np.array_equal(row.labels[trained], row.input_ids[trained])
            seg_len = np.diff(cu)
            expect_pos = np.arange(row.num_tokens) - np.repeat(cu[:-1], seg_len)
            assert np.array_equal(row.position_ids, expect_pos)
            assert table["num_tokens"][r].as_py() == row.num_tokens
            assert table["num_loss_tokens"][r].as_py() == int(trained.sum())
            assert table["max_seqlen"][r].as_py() == int(seg_len.max())
            rows.append(row)
            place.append((k, r))
    assert stats["rows"] == len(rows)
    assert stats["tokens"] == sum(r.num_tokens for r in rows)
    assert stats["loss_tokens"] == sum(int((r.labels != IGNORE_INDEX).sum()) for r in rows)
    assert stats["lower_bound_rows"] == -(-stats["tokens"] // max_seq_len)
    if rows:
        assert stats["fill_rate"] == pytest.approx(
            stats["tokens"] / (len(rows) * max_seq_len), abs=5e-7
        )
    # the examples index: one row per segment, ids 0..n-1, pointing at the right row
    examples = pq.read_table(out / "examples.parquet").to_pydict()
    n = stats["examples"]
    assert examples["example_id"] == list(range(n))
    assert sorted(int(e) for r in rows for e in r.example_ids) == list(range(n))
    output = PackOutput(out, manifest, rows, place, examples, rejects)
    for k in range(n):
        ids, labels, _ = output.segment(k)
        assert len(ids) == examples["num_tokens"][k]
        assert int((labels != IGNORE_INDEX).sum()) == examples["num_loss_tokens"][k]
    return output


@pytest.fixture
def run_pack(tmp_path: Path) -> Any:
    """Pack with :func:`packshard.pipeline.pack_dataset` and check the output (see above)."""
    from packshard.pack.pipeline import PackConfig, pack_dataset

    def run(inputs: list[Path | str], tokenizer: Path | str, out: Path | None = None,
            **options: Any) -> PackOutput:  # fmt: skip
        out = out if out is not None else tmp_path / "out"
        config = PackConfig(
            inputs=tuple(str(p) for p in inputs), tokenizer=str(tokenizer), out=str(out), **options
        )
        result = pack_dataset(config)
        assert result.out == out
        packed = check_pack_output(out)
        assert packed.manifest == result.manifest
        return packed

    return run


@pytest.fixture
def make_jsonl() -> Any:
    """The :func:`write_jsonl` helper, for test modules."""
    return write_jsonl


# --- packed demo folders for the verify / inspect / CLI tests ---------------------------------


def pack_demo_into(root: Path, tokenizer: Path, **options: object) -> Path:
    """Pack a private copy of the embedded demo chats into ``root/out`` and return it.

    The data file is copied under ``root`` so the manifest records an absolute path that
    stays valid (and private to the caller) for the source check.
    """
    import shutil

    from packshard.demo import demo_data_path
    from packshard.pack.pipeline import PackConfig, pack_dataset

    data = root / "data" / "demo_chat.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(demo_data_path(), data)
    settings: dict[str, object] = {"max_seq_len": 256, "template": "chatml", "shard_rows": 4}
    settings.update(options)
    config = PackConfig(
        inputs=(str(data),), tokenizer=str(tokenizer), out=str(root / "out"), **settings
    )  # type: ignore[arg-type]
    pack_dataset(config)
    return root / "out"


@pytest.fixture(scope="session")
def packed_demo_tokenizer(tmp_path_factory) -> Path:
    """The offline demo BPE (vocabulary 1,024), trained once per session."""
    from packshard.demo import build_demo_tokenizer

    return build_demo_tokenizer(tmp_path_factory.mktemp("packed_demo_tok"))


@pytest.fixture(scope="session")
def packed_demo(tmp_path_factory, packed_demo_tokenizer) -> Path:
    """A good ``pack`` output of the demo chats: 256-token rows, 4 rows per shard (4 shards).

    Never modify it: tests that corrupt a folder take ``packed_demo_copy``.
    """
    return pack_demo_into(tmp_path_factory.mktemp("packed_demo"), packed_demo_tokenizer)


@pytest.fixture
def packed_demo_copy(packed_demo, tmp_path) -> Path:
    """A private copy of ``packed_demo`` for a test to corrupt."""
    import shutil

    return Path(shutil.copytree(packed_demo, tmp_path / "out"))


@pytest.fixture
def check_pack() -> Any:
    """The :func:`check_pack_output` helper, for outputs written another way (the CLI)."""
    return check_pack_output


@pytest.fixture(scope="module")
def torch_one_thread() -> Any:
    """One intra-op torch thread: on two shared cores, two spinning threads ran 8x slower."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
