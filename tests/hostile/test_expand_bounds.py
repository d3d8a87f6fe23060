"""``--turns expand`` is bounded, and ``--overlong`` applies to each turn example.

One record of n turns renders n prefixes (O(n²) tokens): ``--max-expanded-tokens`` bounds
what one record's turn examples may hold together (a ``too_large`` reject past it, found
before rendering the rest when the text alone is far past it).  Under ``--overlong drop`` a
turn example that fits is kept and only the ones that do not are dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from packshard.errors import NothingToPackError
from packshard.pack import PackConfig, pack_dataset


def long_chat(path: Path, pairs: int) -> Path:
    messages = []
    for i in range(pairs):
        messages += [
            {"role": "user", "content": f"question {i} " + "why " * 4},
            {"role": "assistant", "content": f"answer {i} " + "because " * 4},
        ]
    path.write_text(json.dumps({"messages": messages}) + "\n")
    return path


def config(data: Path, tokenizer: Path, out: Path, **options) -> PackConfig:
    settings = {"template": "chatml", "turns": "expand", "loss": "assistant", **options}
    return PackConfig.build(inputs=(str(data),), tokenizer=str(tokenizer), out=str(out), **settings)  # type: ignore[arg-type]


def test_turn_examples_that_fit_are_kept_under_drop(tmp_path, packed_demo_tokenizer):
    data = long_chat(tmp_path / "chat.jsonl", 60)
    whole = pack_dataset(config(data, packed_demo_tokenizer, tmp_path / "all", max_seq_len=65536))
    lengths = pq.read_table(tmp_path / "all" / "examples.parquet")["num_tokens"].to_pylist()
    assert len(lengths) == 60 and whole.manifest["stats"]["records_packed"] == 1
    fit = sum(1 for n in lengths if n <= 512)
    assert 0 < fit < 60
    result = pack_dataset(config(data, packed_demo_tokenizer, tmp_path / "out", max_seq_len=512))
    stats = result.manifest["stats"]
    assert stats["examples"] == fit
    assert (stats["records_packed"], stats["rejected"], stats["dropped"]) == (1, 0, 0)


def test_a_record_past_max_expanded_tokens_is_one_too_largereject_record(
    tmp_path, packed_demo_tokenizer
):
    data = long_chat(tmp_path / "chat.jsonl", 60)
    data.write_text(data.read_text() + json.dumps({"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
    ]}) + "\n")  # fmt: skip
    for limit in (2000, 10):  # past it once tokenized; past it already in the rendered text
        out = tmp_path / f"out{limit}"
        cfg = config(data, packed_demo_tokenizer, out, max_seq_len=65536, max_expanded_tokens=limit)
        result = pack_dataset(cfg) if limit > 10 else None
        if result is None:
            with pytest.raises(NothingToPackError):
                pack_dataset(cfg)
            rejects = (tmp_path / f".{out.name}.rejects.jsonl").read_text().splitlines()
        else:
            assert result.manifest["stats"]["records_packed"] == 1
            assert result.manifest["config"]["limits"] == {"max_expanded_tokens": limit}
            rejects = (out / "rejects.jsonl").read_text().splitlines()
        first = json.loads(rejects[0])
        assert (first["line"], first["code"]) == (1, "too_large")
        assert first["reason"] == (
            f"its 60 turn examples (--turns expand) hold more than {limit:,} tokens together "
            "(use --max-expanded-tokens to allow more, or --turns as_rendered)"
        )
