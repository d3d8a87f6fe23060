"""Preference pairs through pack: one unit under --overlong, adjacent in one row, traced.

Hand-made batches check :func:`police_pairs`; a module-scoped pack of mixed records (every
preference layout, KTO, plain chat, bad lines) checks the shard and index contract, the
counts and ``verify`` — and that a pair split or swapped in a copy is caught.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packshard.errors import RecordError
from packshard.ingest.types import TokenizedBatch
from packshard.pack.overlong import police_pairs
from packshard.records import IGNORE_INDEX as X
from packshard.records import SourceRef
from packshard.verify.run import VerifyOptions, verify_dataset
from tests.helpers import pack_rows

# --- police_pairs on a hand-made batch: pair (0, 1) with prompts of 3 and 2 tokens ---------


def batch(lengths: list[int], prompts: list[int], pairs: list[int]) -> TokenizedBatch:
    ids = np.arange(1, sum(lengths) + 1, dtype=np.int32)
    labels = ids.copy()
    offsets = np.cumsum([0, *lengths])
    for k, p in enumerate(prompts):
        labels[offsets[k] : offsets[k] + p] = X
    refs = tuple(SourceRef("p.jsonl", line) for line in (1, 1, 2)[: len(lengths)])
    return TokenizedBatch(
        ids,
        labels,
        offsets.astype(np.int64),
        refs,
        ("d",) * len(lengths),
        ("preference",) * len(lengths),
        pairs=np.asarray(pairs, np.int8),
    )


def test_a_pair_that_fits_passes_untouched():
    b = batch([5, 4, 3], [3, 2, 1], [1, 2, 0])
    out, cut, rejects, tokens = police_pairs(b, 9, "drop")
    assert out is b and not cut.any() and rejects == () and tokens == 0


@pytest.mark.parametrize("policy", ["drop", "split"])
def test_drop_makes_one_reject_naming_both_lengths(policy):
    b = batch([6, 5, 3], [3, 2, 1], [1, 2, 0])
    out, cut, rejects, tokens = police_pairs(b, 10, policy)
    (reject,) = rejects
    assert (reject.code, reject.ref.line) == ("too_long", 1)
    assert "pair of 6 + 5 = 11 tokens (chosen + rejected) > max_seq_len 10" in reject.reason
    assert len(out) == 1 and out.pairs.tolist() == [0] and out.input_ids.tolist() == [12, 13, 14]
    assert tokens == 0 and not cut.any()


def test_error_stops_at_the_pair():
    with pytest.raises(RecordError, match="pair of 6 \\+ 5") as info:
        police_pairs(batch([6, 5], [3, 2], [1, 2]), 10, "error")
    assert (info.value.code, info.value.line) == ("too_long", 1)


@pytest.mark.parametrize(
    ("lengths", "limit", "kept"),
    [
        ([3 + 2, 2 + 9], 12, [5, 7]),  # the short answer (2) fits in half the budget (7): whole
        ([3 + 9, 2 + 2], 12, [8, 4]),  # the same, the other way round
        ([3 + 9, 2 + 9], 12, [6, 6]),  # both long: halves of the budget of 7, the odd one last
    ],
)
def test_truncate_cuts_the_answers_never_the_prompts(lengths, limit, kept):
    b = batch(lengths, [3, 2], [1, 2])
    out, cut, rejects, tokens = police_pairs(b, limit, "truncate")
    assert rejects == () and np.diff(out.offsets).tolist() == kept
    assert cut.tolist() == [k < n for k, n in zip(kept, lengths, strict=True)]
    assert tokens == sum(lengths) - sum(kept)
    first = out.input_ids[: kept[0]]
    assert first.tolist() == list(range(1, kept[0] + 1))  # the head kept, the tail cut
    for k in range(2):
        labels = out.labels[out.offsets[k] : out.offsets[k + 1]]
        assert (labels[: [3, 2][k]] == X).all() and (labels[[3, 2][k] :] != X).all()


def test_truncate_drops_a_pair_whose_prompts_leave_no_room():
    out, _, rejects, _ = police_pairs(batch([6, 6], [5, 5], [1, 2]), 11, "truncate")
    assert len(out) == 0
    assert "prompts of 5 + 5 tokens leave no room for the answers" in rejects[0].reason


# --- a mixed pack ------------------------------------------------------------------------------

USER = {"role": "user", "content": "What is the capital of France? Answer briefly."}


def records() -> list[Any]:
    out: list[Any] = []
    for i in range(12):
        sys_msg = {"role": "system", "content": f"You are helper number {i}."}
        turn = [sys_msg, USER, {"role": "assistant", "content": "Paris."}]
        more = {"role": "user", "content": f"And of Italy, {i}?"}
        good = {"role": "assistant", "content": "Rome, the capital of Italy." + " Yes." * i}
        bad = {"role": "assistant", "content": "Milan." * (1 + i % 3)}
        layout = i % 4
        if layout == 0:
            out.append({"prompt": [*turn, more], "chosen": [good], "rejected": [bad]})
        elif layout == 1:
            out.append({"chosen": [*turn, more, good], "rejected": [*turn, more, bad]})
        elif layout == 2:
            out.append(
                {
                    "system": sys_msg["content"],
                    "conversations": [{"from": "human", "value": more["content"]}],
                    "chosen": {"from": "gpt", "value": good["content"]},
                    "rejected": {"from": "gpt", "value": bad["content"]},
                }
            )
        else:
            out.append({"chosen_messages": [more, good], "rejected_messages": [more, bad]})
    out.append({"prompt": "Same?", "chosen": "yes", "rejected": "yes"})  # identical_pair
    out.append({"prompt": "Two?", "chosen": [USER, USER], "rejected": "no"})  # invalid_pair
    out.append("{not json")
    out.append({"messages": [USER, {"role": "assistant", "content": "Paris."}], "label": True})
    out.append({"messages": [USER, {"role": "assistant", "content": "Lyon."}], "label": False})
    out.append({"messages": [USER, {"role": "assistant", "content": "Paris, France."}]})
    return out


@pytest.fixture(scope="module")
def pair_pack(tmp_path_factory, demo_tokenizer) -> Path:
    root = tmp_path_factory.mktemp("pairs")
    return pack_rows(root, records(), demo_tokenizer, "pairs.jsonl", shard_rows=3)


def shards(out: Path) -> list[pa.Table]:
    return [pq.read_table(p) for p in sorted(out.glob("shard-*.parquet"))]


def test_counts_add_up_pair_by_pair(pair_pack):
    from packshard.format.manifest import schema_errors

    manifest = json.loads((pair_pack / "manifest.json").read_text())
    assert schema_errors(manifest) == []
    assert manifest["loss"]["by_format"]["preference"] == "last_assistant"
    stats = manifest["stats"]
    assert stats["pairs"] == {"seen": 14, "packed": 12, "rejected": 2, "truncated": 0}
    assert stats["kto"] == {"desirable": 1, "undesirable": 1}
    assert stats["records"] == 18 == stats["records_packed"] + stats["rejected"]
    assert stats["records_packed"] == 15 and stats["examples"] == 27
    assert stats["rejects_by_code"] == {"identical_pair": 1, "invalid_json": 1, "invalid_pair": 1}


def test_the_index_traces_every_branch_to_its_pair(pair_pack):
    index = pq.read_table(pair_pack / "examples.parquet").to_pylist()
    assert [c for c in ("pair_id", "branch", "kto_label") if c in index[0]] == [
        "pair_id",
        "branch",
        "kto_label",
    ]
    branches = [e for e in index if e["branch"] is not None]
    assert len(branches) == 24
    for chosen, rejected in zip(branches[::2], branches[1::2], strict=True):
        assert (chosen["branch"], rejected["branch"]) == ("chosen", "rejected")
        assert chosen["pair_id"] == rejected["pair_id"] == chosen["example_id"]
        assert rejected["example_id"] == chosen["example_id"] + 1
        assert (chosen["line"], chosen["shard"], chosen["row"]) == (
            rejected["line"],
            rejected["shard"],
            rejected["row"],
        )
    kto = [(e["line"], e["kto_label"]) for e in index if e["kto_label"] is not None]
    assert kto == [(16, True), (17, False)]
    plain = [e for e in index if e["branch"] is None and e["kto_label"] is None]
    assert [(e["line"], e["pair_id"]) for e in plain] == [(18, None)]


def test_shards_carry_branch_and_kto_label_per_segment(pair_pack):
    index = pq.read_table(pair_pack / "examples.parquet").to_pylist()
    code = {None: 0, "chosen": 1, "rejected": 2}
    kto = {None: -1, False: 0, True: 1}
    for table in shards(pair_pack):
        assert table.column_names[-2:] == ["branch", "kto_label"]
        assert table.schema.field("branch").type == pa.list_(pa.int8())
        for row in table.to_pylist():
            ids = row["example_ids"]
            assert row["branch"] == [code[index[e]["branch"]] for e in ids]
            assert row["kto_label"] == [kto[index[e]["kto_label"]] for e in ids]
            for k, b in enumerate(row["branch"]):
                if b == 1:
                    assert row["branch"][k + 1] == 2 and ids[k + 1] == ids[k] + 1


def test_a_pair_trains_its_final_answer_only(pair_pack):
    table = shards(pair_pack)[0]
    row = table.to_pylist()[0]
    cu = row["cu_seqlens"]
    for k, b in enumerate(row["branch"]):
        if b == 0:
            continue
        labels = np.asarray(row["labels"][cu[k] : cu[k + 1]])
        trained = np.flatnonzero(labels != X)
        assert trained.size and np.all(np.diff(trained) == 1)  # one contiguous final turn
        assert trained[-1] == len(labels) - 2  # through <|im_end|>, the newline after it not


def test_verify_passes_on_a_pair_pack(pair_pack):
    report = verify_dataset(pair_pack, VerifyOptions(model="none"))
    assert report.ok, [str(f) for f in report.findings.items]
    assert report.checks["source"]["status"] == "passed"


def test_a_pack_without_pairs_has_no_pair_columns(tmp_path, demo_tokenizer):
    pack_rows(tmp_path, records()[-1:], demo_tokenizer, "chat.jsonl")
    assert "branch" not in pq.read_schema(tmp_path / "out" / "shard-00000.parquet").names
    assert "pair_id" not in pq.read_schema(tmp_path / "out" / "examples.parquet").names
    assert "pairs" not in json.loads((tmp_path / "out" / "manifest.json").read_text())["stats"]


# --- a pair torn apart in a copy is caught by verify ------------------------------------------


def rewrite(path: Path, edit: Any) -> None:
    """Rewrite a shard's rows through ``edit`` (same schema and metadata; checksum now stale)."""
    schema = pq.read_schema(path)
    rows = pq.read_table(path).to_pylist()
    edit(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, compression="zstd")


def reseal(out: Path) -> None:
    """Record the edited shards' checksums, so only the pair checks can object."""
    from packshard.digests import sha256_path

    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["shards"]:
        entry["sha256"] = sha256_path(out / entry["path"])
        entry["bytes"] = (out / entry["path"]).stat().st_size
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))


def swap_segments(row: dict[str, Any], k: int) -> None:
    """Swap segments ``k`` and ``k + 1`` of a row, every per-token and per-segment list."""
    cu = row["cu_seqlens"]
    a, b, c = cu[k], cu[k + 1], cu[k + 2]
    for name in ("input_ids", "labels", "position_ids"):
        seq = row[name]
        row[name] = seq[:a] + seq[b:c] + seq[a:b] + seq[c:]
    cu[k + 1] = a + (c - b)
    for name in ("example_ids", "branch", "kto_label", "seq_lengths"):
        seq = row[name]
        seq[k], seq[k + 1] = seq[k + 1], seq[k]


def first_pair(out: Path) -> tuple[Path, int, int]:
    """The first pair in a row of at least three segments: shard, row, chosen segment."""
    for path in sorted(out.glob("shard-*.parquet")):
        for r, row in enumerate(pq.read_table(path).to_pylist()):
            if 1 in row["branch"] and len(row["branch"]) >= 3:
                return path, r, row["branch"].index(1)
    raise AssertionError("no pair")


def structure_findings(out: Path) -> list[str]:
    report = verify_dataset(out, VerifyOptions(model="none", source=False))
    assert not report.ok
    return [f.message for f in report.findings.items if f.check == "structure"]


def test_swapped_branches_fail_verify(pair_pack, tmp_path):
    out = Path(shutil.copytree(pair_pack, tmp_path / "out"))
    path, r, k = first_pair(out)
    rewrite(path, lambda rows: swap_segments(rows[r], k))
    reseal(out)
    messages = structure_findings(out)
    assert "a chosen branch is not followed in its row by its rejected one" in messages
    assert "a rejected branch does not follow its chosen one in its row" in messages


def test_a_pair_moved_apart_fails_verify(pair_pack, tmp_path):
    out = Path(shutil.copytree(pair_pack, tmp_path / "out"))
    path, r, k = first_pair(out)

    def tear(rows: list[dict[str, Any]]) -> None:
        row = rows[r]
        if k + 2 < len(row["example_ids"]):  # put the next segment between the branches
            swap_segments(row, k + 1)
        else:  # the pair ends the row: the segment before it goes between the branches
            swap_segments(row, k - 1)

    rewrite(path, tear)
    reseal(out)
    messages = structure_findings(out)
    assert any("followed in its row by its rejected one" in m for m in messages)


def test_a_branch_column_that_disagrees_with_the_index_fails_verify(pair_pack, tmp_path):
    out = Path(shutil.copytree(pair_pack, tmp_path / "out"))
    path, r, k = first_pair(out)

    def relabel(rows: list[dict[str, Any]]) -> None:
        rows[r]["branch"][k] = 0

    rewrite(path, relabel)
    reseal(out)
    assert "branch disagrees with examples.parquet" in structure_findings(out)


def test_group_by_domain_keeps_pairs_whole(tmp_path, demo_tokenizer):
    # planning each domain alone must hand the planner the pair codes, not the domain codes
    rows = [{**r, "domain": ("a", "b")[k % 2]} for k, r in enumerate(records()[:12])]
    pack_rows(tmp_path, rows, demo_tokenizer, "pairs.jsonl", group_by_domain=True)
    index = pq.read_table(tmp_path / "out" / "examples.parquet").to_pylist()
    by_id = {e["example_id"]: e for e in index}
    assert sum(e["branch"] == "chosen" for e in index) == 12
    for e in index:
        if e["branch"] == "chosen":
            other = by_id[e["example_id"] + 1]
            assert other["branch"] == "rejected" and (other["shard"], other["row"]) == (
                e["shard"],
                e["row"],
            )
    report = verify_dataset(tmp_path / "out", VerifyOptions(model="none"))
    assert report.ok, report


def test_mix_refuses_pairs_in_one_line(tmp_path, demo_tokenizer):
    from packshard.errors import UsageError

    with pytest.raises(UsageError, match="--mix does not take preference"):
        pack_rows(tmp_path, records()[:4], demo_tokenizer, "pairs.jsonl", mix="pairs=1.0")
    assert not (tmp_path / "out").exists()


def test_trls_unpaired_kto_layout_packs_with_its_label(tmp_path, demo_tokenizer):
    rows = [
        {"prompt": "Capital of France?", "completion": "Paris.", "label": True},
        {
            "prompt": [USER],
            "completion": [{"role": "assistant", "content": "Lyon."}],
            "label": False,
        },
        {"prompt": "Capital of Italy?", "completion": "Rome."},  # no label: SFT, as before
    ]
    pack_rows(tmp_path, rows, demo_tokenizer, "kto.jsonl")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["stats"]["kto"] == {"desirable": 1, "undesirable": 1}
    index = pq.read_table(tmp_path / "out" / "examples.parquet").to_pylist()
    assert sorted((e["line"], e["kto_label"]) for e in index) == [(1, True), (2, False), (3, None)]
    (table,) = shards(tmp_path / "out")
    by_example = {
        e: k
        for row in table.to_pylist()
        for e, k in zip(row["example_ids"], row["kto_label"], strict=True)
    }
    assert sorted((index[e]["line"], k) for e, k in by_example.items()) == [(1, 1), (2, 0), (3, -1)]
    assert verify_dataset(tmp_path / "out", VerifyOptions(model="none")).ok
