"""Acceptance on the shared preference pairs (300, multi-turn, system prompts): phi-3, Qwen3.

Every pair is packed once or rejected with its reason; both branches sit adjacent in one row,
chosen first; each branch's ids are ``apply_chat_template(prompt + [answer])`` as
``transformers`` renders them; its trained tokens are exactly the final assistant turn (from
the end of the prompt's generation prompt through the end marker); rows are within 1% of the
lower bound; and the same pairs converted to every input layout give the same tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from packshard.ingest.read.sources import expand_inputs
from packshard.ingest.stage.loaded import loaded
from packshard.ingest.stream import ingest
from packshard.ingest.types import IngestOptions
from packshard.pack import PackConfig, pack_dataset
from packshard.records import IGNORE_INDEX
from tests.helpers import write_jsonl

transformers = pytest.importorskip("transformers")

PAIRS = Path("preference") / "llamafactory_dpo_en_demo.json"
ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
MAX_SEQ_LEN = 4096


def prompt_of(record: dict[str, Any]) -> list[dict[str, str]]:
    turns = [{"role": ROLES[m["from"]], "content": m["value"]} for m in record["conversations"]]
    system = record.get("system")
    return [{"role": "system", "content": system}, *turns] if system else turns


def answer(record: dict[str, Any], key: str) -> dict[str, str]:
    return {"role": "assistant", "content": record[key]["value"]}


@pytest.fixture(scope="module", params=["phi-3-mini", "qwen3"])
def packed(request, shared_data, tmp_path_factory) -> dict[str, Any]:
    name = request.param
    tokenizer = shared_data / "tokenizers" / name
    out = tmp_path_factory.mktemp(f"pairs-{name}") / "out"
    config = PackConfig.build(
        inputs=(str(shared_data / PAIRS),),
        tokenizer=str(tokenizer),
        out=str(out),
        max_seq_len=MAX_SEQ_LEN,
    )
    pack_dataset(config)
    records = json.loads((shared_data / PAIRS).read_text(encoding="utf-8"))
    hf = transformers.AutoTokenizer.from_pretrained(str(tokenizer))
    return {"out": out, "records": records, "hf": hf, "name": name}


def segments(out: Path) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Every packed segment's ids and labels, by example id."""
    found = {}
    for path in sorted(out.glob("shard-*.parquet")):
        for row in pq.read_table(path).to_pylist():
            cu = row["cu_seqlens"]
            for k, eid in enumerate(row["example_ids"]):
                lo, hi = cu[k], cu[k + 1]
                found[eid] = (np.asarray(row["input_ids"][lo:hi]), np.asarray(row["labels"][lo:hi]))
    return found


def test_every_pair_is_packed_once_or_rejected_with_its_reason(packed):
    out = packed["out"]
    index = pq.read_table(out / "examples.parquet").to_pylist()
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    packed_lines = [e["line"] for e in index if e["branch"] == "chosen"]
    rejected_lines = [r["line"] for r in rejects]
    assert sorted(packed_lines + rejected_lines) == list(range(1, 301))
    assert all(r["code"] == "too_long" and "chosen + rejected" in r["reason"] for r in rejects)
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    assert stats["pairs"]["seen"] == 300 == stats["pairs"]["packed"] + stats["pairs"]["rejected"]
    assert stats["rows"] <= stats["lower_bound_rows"] * 1.01, (
        stats["rows"],
        stats["lower_bound_rows"],
    )


def test_both_branches_sit_adjacent_in_one_row_chosen_first(packed):
    for path in sorted(packed["out"].glob("shard-*.parquet")):
        for row in pq.read_table(path, columns=["example_ids", "branch"]).to_pylist():
            branch, ids = row["branch"], row["example_ids"]
            assert branch[::2] == [1] * (len(branch) // 2) and branch[1::2] == [2] * (
                len(branch) // 2
            )
            assert ids[1::2] == [e + 1 for e in ids[::2]]


def test_ids_are_the_template_per_branch_and_labels_the_final_turn(packed):
    hf, records = packed["hf"], packed["records"]
    index = pq.read_table(packed["out"] / "examples.parquet").to_pylist()
    found = segments(packed["out"])
    heads: dict[int, list[int]] = {}  # the prompt is the pair's: rendered once for both branches
    checked = 0
    for entry in index:
        record = records[entry["line"] - 1]
        prompt = prompt_of(record)
        whole = [*prompt, answer(record, entry["branch"])]
        want = list(hf.apply_chat_template(whole, tokenize=True, return_dict=False))
        if entry["line"] not in heads:
            heads[entry["line"]] = list(
                hf.apply_chat_template(
                    prompt, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
        head = heads[entry["line"]]
        ids, labels = found[entry["example_id"]]
        assert ids.tolist() == want
        assert want[: len(head)] == head
        trained = np.flatnonzero(labels != IGNORE_INDEX)
        assert trained[0] == len(head) and np.all(np.diff(trained) == 1)
        assert (labels[trained] == ids[trained]).all()
        assert not hf.decode(want[trained[-1] + 1 :]).strip()  # past the end marker: only space
        checked += 1
    assert checked >= 2 * 270


# --- the same pairs in every input layout -------------------------------------------------------


def layouts(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"llamafactory": records}
    trl, implicit, branch, strings = [], [], [], []
    for r in records:
        prompt, good, bad = prompt_of(r), answer(r, "chosen"), answer(r, "rejected")
        trl.append({"prompt": prompt, "chosen": [good], "rejected": [bad]})
        implicit.append({"chosen": [*prompt, good], "rejected": [*prompt, bad]})
        branch.append({"chosen_messages": [*prompt, good], "rejected_messages": [*prompt, bad]})
        if len(r["conversations"]) == 1:  # a string prompt is one user turn
            strings.append(
                {
                    "prompt": r["conversations"][0]["value"],
                    "chosen": good["content"],
                    "rejected": bad["content"],
                    **({"system": r["system"]} if r.get("system") else {}),
                }
            )
    out.update(trl_lists=trl, trl_implicit=implicit, branch_messages=branch)
    out["trl_strings"] = strings
    return out


def test_every_layout_gives_the_same_tokens(shared_data, tmp_path):
    records = json.loads((shared_data / PAIRS).read_text(encoding="utf-8"))[:60]
    bundle, template = loaded(str(shared_data / "tokenizers" / "qwen3"), None)
    single = [r for r in records if len(r["conversations"]) == 1]
    assert len(single) < len(records)  # multi-turn pairs are among them
    got = {}
    for name, converted in layouts(records).items():
        path = write_jsonl(tmp_path / f"{name}.jsonl", converted)
        (chunk,) = ingest(expand_inputs([str(path)]), bundle, template, IngestOptions())
        assert not chunk.rejects and chunk.pairs_read == len(converted)
        got[name] = chunk.batch
    keep = np.repeat([len(r["conversations"]) == 1 for r in records], 2)
    base = got["llamafactory"]
    for name, batch in got.items():
        lengths = np.diff(base.offsets)
        mask = keep if name == "trl_strings" else np.ones(len(keep), bool)
        want_ids = np.concatenate([base.example(i)[0] for i in np.flatnonzero(mask)])
        want_labels = np.concatenate([base.example(i)[1] for i in np.flatnonzero(mask)])
        assert batch.input_ids.tolist() == want_ids.tolist(), name
        assert batch.labels.tolist() == want_labels.tolist(), name
        assert batch.pairs.tolist() == [1, 2] * int(mask.sum() // 2), name
        assert lengths.size == len(keep)
