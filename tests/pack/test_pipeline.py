"""pack end to end: hand-computed packs, real data round trips, determinism, atomic output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packshard.errors import UsageError
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.records import IGNORE_INDEX as X

# ``wN`` has id N, ``<eos>`` id 0: "w2 w3 w4" is [2, 3, 4, 0], every label a target.
TEXTS = ["w2 w3 w4", "w5 w6", "w7 w8 w9 w10 w11", "w12", "w13 w14 w15 w16"]


def text_file(tmp_path: Path, make_jsonl, texts: list[str], name: str = "t.jsonl") -> Path:
    return make_jsonl(tmp_path / name, [{"text": t} for t in texts])


def rows_by_examples(packed) -> dict[tuple[int, ...], object]:
    return {tuple(int(e) for e in row.example_ids): row for row in packed.rows}


def assert_row(row, ids, labels, positions, cu, example_ids) -> None:
    assert row.input_ids.tolist() == ids
    assert row.labels.tolist() == labels
    assert row.position_ids.tolist() == positions
    assert row.cu_seqlens.tolist() == cu
    assert row.example_ids.tolist() == example_ids
    for arr, dtype in ((row.input_ids, np.int32), (row.example_ids, np.int64)):
        assert arr.dtype == dtype


# --- hand-computed packs ----------------------------------------------------------------------


def test_bfd_tiny_pack_by_hand(tmp_path, make_jsonl, word_tokenizer, run_pack):
    # lengths 4 3 6 2 5, L = 8.  BFD, longest first: 6 opens A (room 2), 5 opens B (3),
    # 4 opens C (4), 3 best-fits B (3 -> 0), 2 best-fits A (2 -> 0).
    packed = run_pack([text_file(tmp_path, make_jsonl, TEXTS)], word_tokenizer, max_seq_len=8)
    rows = rows_by_examples(packed)
    assert sorted(rows) == [(0,), (2, 3), (4, 1)]
    assert_row(
        rows[(2, 3)],
        [7, 8, 9, 10, 11, 0, 12, 0],
        [X, 8, 9, 10, 11, 0, X, 0],
        [0, 1, 2, 3, 4, 5, 0, 1],
        [0, 6, 8],
        [2, 3],
    )
    assert_row(
        rows[(4, 1)],
        [13, 14, 15, 16, 0, 5, 6, 0],
        [X, 14, 15, 16, 0, X, 6, 0],
        [0, 1, 2, 3, 4, 0, 1, 2],
        [0, 5, 8],
        [4, 1],
    )
    assert_row(rows[(0,)], [2, 3, 4, 0], [X, 3, 4, 0], [0, 1, 2, 3], [0, 4], [0])
    table = pq.read_table(packed.out / "shard-00000.parquet")
    by_first = {r.example_ids[0]: k for k, r in enumerate(packed.rows)}
    got = {
        name: [table[name][by_first[e]].as_py() for e in (2, 4, 0)]
        for name in ("num_tokens", "num_loss_tokens", "max_seqlen")
    }
    assert got == {"num_tokens": [8, 8, 4], "num_loss_tokens": [6, 6, 3], "max_seqlen": [6, 5, 4]}
    ex = packed.examples
    assert ex["line"] == [1, 2, 3, 4, 5]
    assert ex["part"] == [0] * 5 and ex["token_offset"] == [0] * 5
    assert ex["num_tokens"] == [4, 3, 6, 2, 5]
    assert ex["num_loss_tokens"] == [3, 2, 5, 1, 4]
    assert ex["truncated"] == [False] * 5
    stats = packed.manifest["stats"]
    assert (stats["rows"], stats["lower_bound_rows"], stats["tokens"]) == (3, 3, 20)
    assert (stats["loss_tokens"], stats["fill_rate"]) == (15, round(20 / 24, 6))
    assert stats["tokens_in"] == 20 and stats["examples"] == 5


BFD_FFD = ["w2 w3 w4 w5 w6", "w7 w8 w9 w10 w11", "w12 w13 w14", "w15"]  # lengths 6 6 4 2


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        # 6 -> A (room 4), 6 -> B (4); 4: A and B tie, BFD takes the row changed last (B),
        # FFD the first (A); 2 goes to the row left with room.
        ("bfd", [(0, 3), (1, 2)]),
        ("ffd", [(0, 2), (1, 3)]),
    ],
)
def test_bfd_and_ffd_differ_on_ties(
    tmp_path, make_jsonl, word_tokenizer, run_pack, strategy, expected
):
    packed = run_pack(
        [text_file(tmp_path, make_jsonl, BFD_FFD)],
        word_tokenizer,
        max_seq_len=10,
        strategy=strategy,
    )
    rows = rows_by_examples(packed)
    assert sorted(rows) == expected
    lengths = {0: 6, 1: 6, 2: 4, 3: 2}
    for key, row in rows.items():
        assert row.cu_seqlens.tolist() == [0, lengths[key[0]], lengths[key[0]] + lengths[key[1]]]
    assert packed.manifest["config"]["strategy"] == strategy


def test_wrapped_tiny_pack_by_hand(tmp_path, make_jsonl, word_tokenizer, run_pack):
    # Stream of 20 tokens cut every 9: record 3 (6 tokens at 7..13) and record 5 (5 tokens
    # at 15..20) cross a cut and become parts 0 and 1.
    packed = run_pack(
        [text_file(tmp_path, make_jsonl, TEXTS)], word_tokenizer, max_seq_len=9, strategy="wrapped"
    )
    assert [
        r.example_ids.tolist() for r in sorted(packed.rows, key=lambda r: r.example_ids[0])
    ] == [
        [0, 1, 2],
        [3, 4, 5],
        [6],
    ]
    rows = rows_by_examples(packed)
    assert_row(
        rows[(0, 1, 2)],
        [2, 3, 4, 0, 5, 6, 0, 7, 8],
        [X, 3, 4, 0, X, 6, 0, X, 8],
        [0, 1, 2, 3, 0, 1, 2, 0, 1],
        [0, 4, 7, 9],
        [0, 1, 2],
    )
    assert_row(
        rows[(3, 4, 5)],
        [9, 10, 11, 0, 12, 0, 13, 14, 15],
        [X, 10, 11, 0, X, 0, X, 14, 15],
        [0, 1, 2, 3, 0, 1, 0, 1, 2],
        [0, 4, 6, 9],
        [3, 4, 5],
    )
    assert_row(rows[(6,)], [16, 0], [X, 0], [0, 1], [0, 2], [6])
    ex = packed.examples
    assert ex["line"] == [1, 2, 3, 3, 4, 5, 5]
    assert ex["part"] == [0, 0, 0, 1, 0, 0, 1]
    assert ex["token_offset"] == [0, 0, 0, 2, 0, 0, 3]
    assert ex["num_tokens"] == [4, 3, 2, 4, 2, 3, 2]
    stats = packed.manifest["stats"]
    assert (stats["records"], stats["records_packed"], stats["split"]) == (5, 5, 2)
    assert (stats["examples"], stats["rows"], stats["parts_dropped"]) == (7, 3, 0)


def test_wrapped_drops_parts_without_targets(tmp_path, make_jsonl, word_tokenizer, run_pack):
    # L = 8: record 1 is 7 tokens; record 2 ("w9" + eos) straddles the cut at 8, one token
    # each side, and each one-token part's only label is the masked segment start.
    texts = ["w2 w3 w4 w5 w6 w7", "w9", "w10 w11"]
    packed = run_pack(
        [text_file(tmp_path, make_jsonl, texts)], word_tokenizer, max_seq_len=8, strategy="wrapped"
    )
    assert sorted(r.input_ids.tolist() for r in packed.rows) == [[2, 3, 4, 5, 6, 7, 0], [10, 11, 0]]
    stats = packed.manifest["stats"]
    assert (stats["records"], stats["records_packed"], stats["dropped"]) == (3, 2, 1)
    assert stats["parts_dropped"] == 2
    assert stats["rejects_by_code"] == {"split_no_targets": 1}
    [reject] = packed.rejects
    assert (reject["line"], reject["code"]) == (2, "split_no_targets")
    assert reject["source"].endswith("t.jsonl") and reject["domain"] == "t"
    assert packed.examples["line"] == [1, 3]


# --- real tokenizers and chat data: every example comes back exactly --------------------------


def unpacked_examples(packed, inputs, tokenizer, template, **options):
    """Re-ingest the inputs alone: ``{(source, line): (input_ids, labels)}`` and the rejects."""
    from packshard.ingest.read.sources import expand_inputs
    from packshard.ingest.stream import ingest
    from packshard.ingest.template.render import load_template
    from packshard.ingest.tokens.tokenizer import load_tokenizer
    from packshard.ingest.types import IngestOptions

    bundle = load_tokenizer(str(tokenizer))
    tmpl = load_template(template, bundle)
    files = expand_inputs([str(p) for p in inputs])
    examples, rejects = {}, set()
    for chunk in ingest(files, bundle, tmpl, IngestOptions(**options)):
        batch = chunk.batch
        for i, ref in enumerate(batch.refs):
            ids, labels = batch.example(i)
            examples[(ref.source, ref.line)] = (ids.copy(), labels.copy())
        rejects |= {(r.ref.source, r.ref.line) for r in chunk.rejects}
    return examples, rejects


def assert_round_trip(packed, unpacked, ingest_rejects, overlong: str, wrapped: bool) -> None:
    """Each packed record's parts give back its unpacked ids and labels (first label masked)."""
    max_seq_len = packed.manifest["config"]["max_seq_len"]
    ex = packed.examples
    by_record = packed.records()
    rejected = {(r["source"], r["line"]) for r in packed.rejects}
    assert rejected.isdisjoint(by_record)
    assert rejected | set(by_record) == set(unpacked) | ingest_rejects
    assert ingest_rejects <= rejected
    codes = {(r["source"], r["line"]): r["code"] for r in packed.rejects}
    for key, (ids, labels) in unpacked.items():
        if key not in by_record:
            assert codes[key] in ("too_long", "truncated_no_targets", "split_no_targets"), key
            if codes[key] == "too_long":
                assert len(ids) > max_seq_len and overlong == "drop"
            continue
        covered = 0
        for eid in by_record[key]:
            seg_ids, seg_labels, positions = packed.segment(eid)
            offset = ex["token_offset"][eid]
            n = len(seg_ids)
            assert n <= max_seq_len
            assert np.array_equal(seg_ids, ids[offset : offset + n]), key
            assert seg_labels[0] == X
            assert np.array_equal(seg_labels[1:], labels[offset + 1 : offset + n]), key
            assert np.array_equal(positions, np.arange(n))
            assert ex["truncated"][eid] == (overlong == "truncate" and len(ids) > max_seq_len)
            covered += n
        parts = [ex["part"][e] for e in by_record[key]]
        offsets = [ex["token_offset"][e] for e in by_record[key]]
        if overlong == "truncate" and not wrapped:
            assert (parts, offsets, covered) == ([0], [0], min(len(ids), max_seq_len))
        elif packed.manifest["stats"]["parts_dropped"] == 0:
            # parts 0, 1, … tile the example exactly: their concatenation is the original
            assert parts == list(range(len(parts)))
            assert covered == len(ids)
            assert offsets == [sum(ex["num_tokens"][e] for e in by_record[key][:k])
                               for k in range(len(parts))]  # fmt: skip
            if not wrapped:
                assert offsets == [max_seq_len * k for k in range(len(parts))]


CHAT_FILES = [
    "llamafactory_alpaca_en_demo.json",
    "llamafactory_alpaca_zh_demo.json",
    "codealpaca_code_alpaca_2k.json",
    "llamafactory_identity.json",
    "llamafactory_glaive_toolcall_en_demo.json",
    "fastchat_dummy_conversation.json",
    "openai_cookbook_toy_chat_fine_tuning.jsonl",
    "anthropic_cookbook_json_mode_dataset.jsonl",
]

# (tokenizer, template, max_seq_len, overlong, strategy, files)
SHARED_CASES = {
    "phi3-config-split": ("phi-3-mini", None, 2048, "split", "bfd", CHAT_FILES),
    "phi3-generation-truncate": (
        "phi-3-mini",
        "tokenizers/phi-3-mini/chat_template.training.jinja",
        4096,
        "truncate",
        "ffd",
        CHAT_FILES[3:],
    ),
    "phi2-chatml-drop": ("phi-2", "chatml", 2048, "drop", "bfd", CHAT_FILES[3:]),
    "phi2-chatml-wrapped": ("phi-2", "chatml", 2048, "split", "wrapped", CHAT_FILES[5:]),
}


@pytest.mark.shared_data
@pytest.mark.parametrize("case", sorted(SHARED_CASES))
def test_real_data_round_trips(shared_data, run_pack, case):
    tok_name, template, max_seq_len, overlong, strategy, names = SHARED_CASES[case]
    tokenizer = shared_data / "tokenizers" / tok_name
    if template is not None and template.endswith(".jinja"):
        template = str(shared_data / template)
    inputs = [shared_data / "chat" / name for name in names]
    packed = run_pack(
        inputs,
        tokenizer,
        template=template,
        max_seq_len=max_seq_len,
        overlong=overlong,
        strategy=strategy,
        allow_split_markers=tok_name == "phi-2",  # a base model taught ChatML: markers are text
    )
    unpacked, ingest_rejects = unpacked_examples(packed, inputs, tokenizer, template)
    assert_round_trip(packed, unpacked, ingest_rejects, overlong, strategy == "wrapped")
    stats = packed.manifest["stats"]
    assert stats["records"] == len(unpacked) + len(ingest_rejects)
    assert stats["tokens_in"] == sum(len(ids) for ids, _ in unpacked.values())
    # the one 12k-token cookbook record and the 11.6k tool-call record exceed every L here
    assert stats["split"] + stats["truncated"] + stats["rejects_by_code"].get("too_long", 0) >= 1
    expected_spans = "offsets" if case == "phi3-config-split" else "generation_tags"
    assert packed.manifest["template"]["label_spans"] == expected_spans


@pytest.mark.shared_data
def test_real_plain_text_with_phi2(shared_data, tmp_path, make_jsonl, run_pack):
    source = json.loads((shared_data / "chat" / CHAT_FILES[0]).read_text(encoding="utf-8"))
    texts = [{"text": r["output"], "domain": "prose" if k % 3 else "other"}
             for k, r in enumerate(source[:300])]  # fmt: skip
    path = make_jsonl(tmp_path / "plain.jsonl", texts)
    tokenizer = shared_data / "tokenizers" / "phi-2"
    packed = run_pack([path], tokenizer, max_seq_len=512, overlong="split", format="text")
    unpacked, ingest_rejects = unpacked_examples(packed, [path], tokenizer, None, format="text")
    assert ingest_rejects == set()
    assert_round_trip(packed, unpacked, ingest_rejects, "split", False)
    for ids, labels in unpacked.values():  # phi-2 adds no BOS and no EOS: text only, all trained
        assert np.array_equal(ids, labels)
    assert sorted(packed.manifest["stats"]["domains"]) == ["other", "prose"]


# --- domains, determinism, seeds -----------------------------------------------------------


def mixed_domains(tmp_path: Path, make_jsonl) -> list[Path]:
    rng = np.random.default_rng(7)
    records = []
    for k in range(60):
        words = " ".join(f"w{w}" for w in rng.integers(2, 400, size=int(rng.integers(1, 30))))
        records.append({"text": words, "domain": ["code", "chat", "math"][k % 3]})
    return [
        make_jsonl(tmp_path / "mixed.jsonl", records),
        make_jsonl(tmp_path / "plain.jsonl", [{"text": "w2 w3 w4"}] * 5),
    ]


def test_group_by_domain_keeps_rows_single_domain(tmp_path, make_jsonl, word_tokenizer, run_pack):
    inputs = mixed_domains(tmp_path, make_jsonl)
    mixed = run_pack(inputs, word_tokenizer, out=tmp_path / "mixed", max_seq_len=64)
    grouped = run_pack(
        inputs, word_tokenizer, out=tmp_path / "grouped", max_seq_len=64, group_by_domain=True
    )
    domain = grouped.examples["domain"]
    assert all(len({domain[int(e)] for e in row.example_ids}) == 1 for row in grouped.rows)
    mixed_domain = mixed.examples["domain"]
    assert any(len({mixed_domain[int(e)] for e in row.example_ids}) > 1 for row in mixed.rows)
    domains = grouped.manifest["stats"]["domains"]
    assert sorted(domains) == ["chat", "code", "math", "plain"]
    assert [domains[d]["records"] for d in ("chat", "code", "math", "plain")] == [20, 20, 20, 5]
    assert grouped.manifest["config"]["group_by_domain"] is True
    # same examples either way, numbered in input order
    for key in ("source", "line", "num_tokens", "domain"):
        assert grouped.examples[key] == mixed.examples[key]


def test_same_inputs_give_byte_identical_output(tmp_path, make_jsonl, word_tokenizer, run_pack):
    inputs = mixed_domains(tmp_path, make_jsonl)
    options = {"max_seq_len": 48, "shard_rows": 7, "overlong": "split", "seed": 3}
    a = run_pack(inputs, word_tokenizer, out=tmp_path / "a", **options)
    b = run_pack(inputs, word_tokenizer, out=tmp_path / "b", **options)
    assert len(a.manifest["shards"]) > 1
    names = sorted(p.name for p in a.out.iterdir())
    assert names == sorted(p.name for p in b.out.iterdir())
    for name in names:
        if name != "manifest.json":
            assert (a.out / name).read_bytes() == (b.out / name).read_bytes(), name
    a.manifest.pop("created_at")
    b.manifest.pop("created_at")
    assert a.manifest == b.manifest


def test_seed_changes_row_order_only(tmp_path, make_jsonl, word_tokenizer, run_pack):
    inputs = mixed_domains(tmp_path, make_jsonl)
    a = run_pack(inputs, word_tokenizer, out=tmp_path / "a", max_seq_len=48, seed=0)
    b = run_pack(inputs, word_tokenizer, out=tmp_path / "b", max_seq_len=48, seed=1)

    def content(packed):
        return [
            (r.input_ids.tolist(), r.labels.tolist(), r.cu_seqlens.tolist(), r.example_ids.tolist())
            for r in packed.rows
        ]

    assert content(a) != content(b)
    assert sorted(content(a)) == sorted(content(b))
    assert a.examples["example_id"] == b.examples["example_id"]
    assert a.manifest["dataset_id"] != b.manifest["dataset_id"]
    assert a.manifest["stats"]["ordering"] == b.manifest["stats"]["ordering"]


# --- atomic output ------------------------------------------------------------------------------


def pack_config(inputs, tokenizer, out, **options):
    from packshard.pack import PackConfig

    return PackConfig.build(
        inputs=tuple(str(p) for p in inputs), tokenizer=str(tokenizer), out=str(out),
        max_seq_len=options.pop("max_seq_len", 32), **options,
    )  # fmt: skip


def test_non_empty_out_is_refused_without_overwrite(
    tmp_path, make_jsonl, word_tokenizer, check_pack
):
    from packshard.cli.commands import main
    from packshard.pack import pack_dataset

    data = text_file(tmp_path, make_jsonl, TEXTS)
    out = tmp_path / "out"
    out.mkdir()
    pack_dataset(pack_config([data], word_tokenizer, out))  # an empty folder is fine
    with pytest.raises(UsageError) as info:
        pack_dataset(pack_config([data], word_tokenizer, out))
    assert str(info.value) == f"{out}: output folder exists and is not empty (use --overwrite)"
    args = ["pack", str(data), "-t", str(word_tokenizer), "--max-seq-len", "32", "-o", str(out)]
    result = CliRunner().invoke(main, [*args, "--no-progress"])
    assert result.exit_code == 2
    assert "output folder exists and is not empty (use --overwrite)" in result.output
    result = CliRunner().invoke(main, [*args, "--no-progress", "--overwrite"])
    assert result.exit_code == 0, result.output
    check_pack(out)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()])
def test_interrupted_run_leaves_only_its_units_and_resume_finishes(
    tmp_path, make_jsonl, word_tokenizer, monkeypatch, exc
):
    import packshard.pack.pipeline as pipeline
    import packshard.pack.write.shards as shards
    from packshard.engine import TaskFailed

    data = text_file(tmp_path, make_jsonl, TEXTS)
    real_write = shards.write_shard

    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(shards, "write_shard", fail)
    expected = TaskFailed if isinstance(exc, OSError) else KeyboardInterrupt
    with pytest.raises(expected):
        pipeline.pack_dataset(pack_config([data], word_tokenizer, tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    assert leftovers(tmp_path) == [".out.units"]  # the finished units, for --resume
    monkeypatch.setattr(shards, "write_shard", real_write)
    config = pack_config([data], word_tokenizer, tmp_path / "out", resume=True)
    manifest = pipeline.pack_dataset(config).manifest
    assert manifest["engine"] == {"name": "local", "workers": 1, "units": 1, "units_reused": 1}
    assert leftovers(tmp_path) == []


def test_interrupted_overwrite_keeps_the_old_output(
    tmp_path, make_jsonl, word_tokenizer, monkeypatch
):
    import packshard.pack.pipeline as pipeline
    import packshard.pack.write.shards as shards

    data = text_file(tmp_path, make_jsonl, TEXTS)
    out = tmp_path / "out"
    pipeline.pack_dataset(pack_config([data], word_tokenizer, out))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_write = shards.write_shard
    calls = []

    def write_then_fail(*args, **kwargs):
        calls.append(real_write(*args, **kwargs))
        raise KeyboardInterrupt

    monkeypatch.setattr(shards, "write_shard", write_then_fail)
    with pytest.raises(KeyboardInterrupt):
        pipeline.pack_dataset(pack_config([data], word_tokenizer, out, overwrite=True, seed=9))
    assert len(calls) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert leftovers(tmp_path) == [".out.units"]  # kept for --resume
    # and a failed publish (rename) puts the old folder back
    monkeypatch.setattr(shards, "write_shard", real_write)
    real_replace = os.replace

    def replace(src, dst):
        if Path(src).name.startswith(".out.partial-"):  # the publishing rename only
            raise OSError("rename failed")
        return real_replace(src, dst)

    monkeypatch.setattr(pipeline.os, "replace", replace)
    with pytest.raises(OSError, match="rename failed"):
        pipeline.pack_dataset(pack_config([data], word_tokenizer, out, overwrite=True, seed=9))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert leftovers(tmp_path) == [".out.units"]


# --- edges --------------------------------------------------------------------------------------


def test_nothing_usable_is_an_error_and_writes_nothing(tmp_path, make_jsonl, word_tokenizer):
    from packshard.errors import NothingToPackError
    from packshard.pack import pack_dataset

    data = make_jsonl(tmp_path / "bad.jsonl", ['{"text": "w2"', "[1, 2]", {"text": ""}])
    with pytest.raises(NothingToPackError) as info:
        pack_dataset(pack_config([data], word_tokenizer, tmp_path / "out", max_seq_len=8))
    assert str(info.value) == (
        "nothing to pack: none of the 3 records read was packed (invalid_json 1, "
        "no_trainable_tokens 1, not_an_object 1); no output was written (fix the inputs or "
        f"the options, e.g. --max-seq-len, --overlong); its rejects are in {tmp_path}/"
        ".out.rejects.jsonl"
    )
    assert info.value.exit_code == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.rejects.jsonl", "bad.jsonl"]


def test_group_by_domain_with_wrapped(tmp_path, make_jsonl, word_tokenizer, run_pack):
    packed = run_pack(
        mixed_domains(tmp_path, make_jsonl), word_tokenizer, max_seq_len=16,
        strategy="wrapped", group_by_domain=True,
    )  # fmt: skip
    domain = packed.examples["domain"]
    assert all(len({domain[int(e)] for e in row.example_ids}) == 1 for row in packed.rows)
    # within a domain the stream is cut every 16 tokens: only a domain's last row is short
    # (or a row that lost a one-token part)
    short = [r for r in packed.rows if r.num_tokens < 16]
    assert len(short) <= 4 + packed.manifest["stats"]["parts_dropped"]


def test_shard_bytes_caps_rows_per_shard(tmp_path, make_jsonl, word_tokenizer, run_pack):
    packed = run_pack(
        [text_file(tmp_path, make_jsonl, TEXTS)], word_tokenizer, max_seq_len=8, shard_bytes=1
    )
    assert [s["rows"] for s in packed.manifest["shards"]] == [1, 1, 1]
    shards = packed.examples["shard"]
    assert sorted(shards.count(k) for k in range(3)) == [1, 2, 2]
    assert set(packed.examples["row"]) == {0}


def test_output_does_not_depend_on_the_number_of_workers(tmp_path, make_jsonl, word_tokenizer):
    """Separate processes (the tokenizer's thread pool is per process), 1 vs 2 workers."""
    import subprocess
    import sys

    inputs = [str(p) for p in mixed_domains(tmp_path, make_jsonl)]
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        args = [*inputs, "-t", str(word_tokenizer), "--max-seq-len", "48", "-o", str(out)]
        args += ["--num-workers", str(workers), "--no-progress"]
        code = (
            "import sys; from packshard.cli.commands import main; sys.argv[0] = 'packshard'; main()"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, "pack", *args], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        outs.append(out)
    names = sorted(p.name for p in outs[0].iterdir())
    assert names == sorted(p.name for p in outs[1].iterdir())
    for name in names:
        if name != "manifest.json":
            assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


# --- --turns expand ---------------------------------------------------------------------------


def _turns(*pairs: tuple[str, str], **fields) -> dict:
    messages = []
    for question, reply in pairs:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
    return {"messages": messages, **fields}


def test_expand_packs_one_example_per_trained_turn(
    tmp_path, make_jsonl, demo_tokenizer, run_pack
) -> None:
    from packshard.verify.run import VerifyOptions, verify_dataset

    weighted = _turns(("a", "one"), ("b", "two"), ("c", "three"))
    weighted["messages"][3]["weight"] = 0
    data = make_jsonl(
        tmp_path / "chat.jsonl",
        [_turns(("hi", "hello"), ("and?", "more"), ("bye", "ciao")), _turns(("q", "r")), weighted],
    )
    packed = run_pack([data], demo_tokenizer, max_seq_len=256, turns="expand", template="chatml")
    ex = packed.examples
    expected = [(1, 2, 0), (1, 4, 0), (1, 6, 0), (2, 2, 0), (3, 2, 0), (3, 6, 0)]
    assert sorted(zip(ex["line"], ex["turn"], ex["part"], strict=True)) == expected
    stats = packed.manifest["stats"]
    assert (stats["records"], stats["records_packed"], stats["examples"]) == (3, 3, 6)
    assert packed.manifest["config"]["turns"] == "expand"
    tok = load_tokenizer(str(demo_tokenizer)).tokenizer
    for k, eid in enumerate(ex["example_id"]):
        ids, labels, _ = packed.segment(eid)
        trained = tok.decode(ids[labels != X].tolist(), skip_special_tokens=False)
        reply = {(1, 2): "hello", (1, 4): "more", (1, 6): "ciao", (2, 2): "r", (3, 2): "one"}
        want = reply.get((ex["line"][k], ex["turn"][k]), "three")
        assert trained == f"{want}<|im_end|>"  # the last turn of each example alone
    report = verify_dataset(packed.out, VerifyOptions(model="none"))
    assert report.ok, [str(f) for f in report.findings.items]
    assert report.checks["source"]["examples_compared"] == 6


def test_expand_refuses_the_wrapped_strategy(tmp_path, make_jsonl, demo_tokenizer) -> None:
    from packshard.pack import PackConfig, pack_dataset

    data = make_jsonl(tmp_path / "chat.jsonl", [_turns(("hi", "hello"))])
    config = PackConfig.build(
        inputs=(str(data),),
        tokenizer=str(demo_tokenizer),
        out=str(tmp_path / "o"),
        max_seq_len=64,
        strategy="wrapped",
        turns="expand",
    )
    with pytest.raises(UsageError, match=r"--turns expand builds one example per turn; "):
        pack_dataset(config)


@pytest.mark.shared_data
def test_sequential_keeps_the_input_order_at_a_high_fill(shared_data, run_pack):
    inputs = [shared_data / "chat" / name for name in CHAT_FILES]
    packed = run_pack(
        inputs, shared_data / "tokenizers" / "phi-3-mini", max_seq_len=4096, strategy="sequential"
    )
    # read row after row (shard order, row order), the examples are the inputs in order
    read = [int(e) for row in packed.rows for e in row.example_ids]
    assert read == list(range(len(read)))
    ex = packed.examples
    sources = [str(p) for p in inputs]
    order = sorted(range(len(read)), key=lambda k: ex["example_id"][k])
    places = [(sources.index(ex["source"][k]), ex["line"][k]) for k in order]
    assert places == sorted(places)
    stats = packed.manifest["stats"]
    assert stats["fill_rate"] >= 0.95
    assert stats["bfd_fill_rate"] >= stats["fill_rate"]
    assert stats["bfd_rows"] <= stats["rows"]


def test_sequential_rows_are_not_shuffled_and_refuse_group_by_domain(
    tmp_path, make_jsonl, word_tokenizer, run_pack
):
    texts = [" ".join(f"w{2 + (i * 7 + k) % 400}" for k in range(2 + i % 6)) for i in range(40)]
    data = text_file(tmp_path, make_jsonl, texts)
    packed = run_pack([data], word_tokenizer, max_seq_len=16, strategy="sequential", seed=7)
    read = [int(e) for row in packed.rows for e in row.example_ids]
    assert read == list(range(40))
    assert len(packed.rows) > 3  # several rows, and still in order whatever the seed
    with pytest.raises(UsageError, match="--group-by-domain"):
        run_pack([data], word_tokenizer, out=tmp_path / "o2", max_seq_len=16,
                 strategy="sequential", group_by_domain=True)  # fmt: skip


def test_rejects_are_written_in_input_and_line_order(tmp_path, make_jsonl, word_tokenizer):
    """An overlong record before a broken line: its reject comes first, as its line does."""
    from packshard.pack import pack_dataset

    long = " ".join(f"w{i % 7}" for i in range(40))
    first = make_jsonl(tmp_path / "a.jsonl", [{"text": long}, '{"text": "w2"', {"text": "w1 w2"}])
    second = make_jsonl(tmp_path / "b.jsonl", ["[1]", {"text": long}])
    config = pack_config([first, second], word_tokenizer, tmp_path / "out", max_seq_len=8)
    pack_dataset(config)
    lines = (tmp_path / "out" / "rejects.jsonl").read_text(encoding="utf-8").splitlines()
    places = [(json.loads(x)["source"], json.loads(x)["line"]) for x in lines]
    assert places == [(str(first), 1), (str(first), 2), (str(second), 1), (str(second), 2)]
