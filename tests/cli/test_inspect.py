"""``inspect``: a known packed row shows its seams, segment headers, sources and positions."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from rich.console import Console

from packshard.cli.commands import main
from packshard.cli.inspect import inspect_row, render_row_console
from packshard.errors import FormatError
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.records import IGNORE_INDEX

SHARD = "shard-00001.parquet"


def expected_segments(out: Path, shard: str, row: int) -> list[dict]:
    """Segment facts of a stored row, read from the shard and the examples index."""
    stored = pq.read_table(out / shard).slice(row, 1).to_pylist()[0]
    index = {e["example_id"]: e for e in pq.read_table(out / "examples.parquet").to_pylist()}
    cu = stored["cu_seqlens"]
    segments = []
    for s, eid in enumerate(stored["example_ids"]):
        lo, hi = cu[s], cu[s + 1]
        labels = stored["labels"][lo:hi]
        segments.append(
            {
                "example_id": eid,
                "source": f"{index[eid]['source']}:{index[eid]['line']}",
                "num_tokens": hi - lo,
                "trained": sum(1 for x in labels if x != IGNORE_INDEX),
                "ids": stored["input_ids"][lo:hi],
            }
        )
    return segments


def render_text(view) -> str:
    console = Console(width=400, record=True, color_system=None, file=open("/dev/null", "w"))
    console.print(render_row_console(view))
    return console.export_text()


def test_known_row_view_matches_the_shard_and_index(packed_demo, packed_demo_tokenizer):
    view = inspect_row(packed_demo, row=0, shard=1)
    expected = expected_segments(packed_demo, SHARD, 0)
    assert len(expected) == 2
    assert (view.shard, view.row, view.max_seq_len) == (SHARD, 0, 256)
    assert view.num_tokens == sum(e["num_tokens"] for e in expected)
    tok = load_tokenizer(str(packed_demo_tokenizer)).tokenizer
    for seg, want in zip(view.segments, expected, strict=True):
        assert (seg.example_id, seg.source, seg.part) == (want["example_id"], want["source"], 0)
        assert (seg.num_tokens, seg.num_loss_tokens) == (want["num_tokens"], want["trained"])
        assert seg.positions == (0, want["num_tokens"] - 1)
        assert "".join(text for text, _ in seg.runs) == tok.decode(
            want["ids"], skip_special_tokens=False
        )
        assert seg.runs[0][0].startswith("<|im_start|>")
        # the masked first label makes the first run context; runs then alternate
        assert [trained for _, trained in seg.runs] == [i % 2 == 1 for i in range(len(seg.runs))]
        assert len(seg.runs) >= 2


def test_console_view_has_headers_seams_and_positions(packed_demo):
    text = render_text(inspect_row(packed_demo, row=0, shard=1))
    expected = expected_segments(packed_demo, SHARD, 0)
    lines = text.splitlines()
    total = sum(e["num_tokens"] for e in expected)
    assert lines[0] == f"{SHARD} row 0: {total}/256 tokens, 2 segments"
    for s, want in enumerate(expected):
        n = want["num_tokens"]
        header = (
            f"segment {s} · example {want['example_id']} · {want['source']} · part 0 · "
            f"{n} tokens ({want['trained']} trained) · positions 0…{n - 1}"
        )
        assert header in lines
    seams = [i for i, line in enumerate(lines) if " seam " in line and set(line) <= set("─ seam")]
    assert len(seams) == 1
    assert lines[seams[0] + 1].startswith("segment 1 · ")
    assert lines[-1] == "legend: trained tokens in green, context dim"


def test_unloadable_tokenizer_falls_back_to_ids(packed_demo, tmp_path):
    view = inspect_row(packed_demo, row=0, shard=0, tokenizer=str(tmp_path / "none"))
    first = view.segments[0].runs[0][0]
    assert first.startswith("[") and first.endswith("]")


@pytest.mark.parametrize(("shard", "row"), [(-1, 0), (0, -1)])
def test_negative_indices_are_refused(packed_demo, shard, row):
    from packshard.errors import UsageError

    with pytest.raises(UsageError, match="out of range"):
        inspect_row(packed_demo, row=row, shard=shard)


def test_missing_shard_is_a_usage_error(packed_demo_copy):
    import os

    os.remove(packed_demo_copy / "shard-00000.parquet")
    result = CliRunner().invoke(main, ["inspect", str(packed_demo_copy)], prog_name="packshard")
    assert result.exit_code == 2
    path = packed_demo_copy / "shard-00000.parquet"
    assert result.stderr == (
        f"error: {path}: shard missing (run packshard verify {packed_demo_copy} to audit the "
        "folder)\n"
    )


def test_missing_examples_index_still_shows_the_row(packed_demo_copy):
    import os

    os.remove(packed_demo_copy / "examples.parquet")
    view = inspect_row(packed_demo_copy, row=0, shard=1)
    assert [s.source for s in view.segments] == ["?", "?"]
    assert view.segments[0].positions[0] == 0


def test_a_shard_of_another_pack_is_refused(packed_demo_copy):
    path = packed_demo_copy / "shard-00000.parquet"
    table = pq.read_table(path)
    meta = dict(table.schema.metadata) | {b"packshard.dataset_id": b"f" * 32}
    pq.write_table(table.replace_schema_metadata(meta), path)
    with pytest.raises(FormatError) as info:
        inspect_row(packed_demo_copy, row=0, shard=0)
    assert info.value.problem.startswith(f"packshard.dataset_id {'f' * 32} differs from the")
    result = CliRunner().invoke(main, ["inspect", str(packed_demo_copy)], prog_name="packshard")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {path}: packshard.dataset_id {'f' * 32} differs")
    assert result.stderr.count("\n") == 1


def test_reasoning_tokens_are_shown_apart(tmp_path) -> None:
    from packshard.cli.html import write_row_html
    from packshard.pack import PackConfig, pack_dataset
    from tests.helpers import THINK, answer, build_qwen, chat, user, write_jsonl

    template = tmp_path / "think.jinja"
    template.write_text(THINK, encoding="utf-8")
    record = chat(
        user("2+2?"),
        answer("It is 4.", reasoning_content="Add."),
        user("3+3?"),
        answer("It is 6.", reasoning_content="Add again."),
    )
    data = write_jsonl(tmp_path / "r.jsonl", [record])
    qwen = build_qwen(tmp_path / "qwen")
    for turns, masked in (("as_rendered", "train"), ("expand", "mask")):
        out = tmp_path / turns
        config = PackConfig.build(
            inputs=(str(data),),
            tokenizer=str(qwen),
            template=str(template),
            out=str(out),
            max_seq_len=256,
            turns=turns,
            reasoning=masked,
        )
        pack_dataset(config)
        view = inspect_row(out)
        for seg in view.segments:
            thought = "".join(t for (t, _), r in zip(seg.runs, seg.reasoning, strict=True) if r)
            assert thought == "<think>\nAdd again.\n</think>\n\n" or seg.turn == 2
            trained = {tr for (_, tr), r in zip(seg.runs, seg.reasoning, strict=True) if r}
            assert trained == {masked == "train"}
        text = render_text(view)
        assert "legend: trained tokens in green, context dim; reasoning in magenta" in text
        if turns == "expand":
            assert " · part 0 · message 2 · " in text and " · part 0 · message 4 · " in text
        page = tmp_path / f"{turns}.html"
        write_row_html(view, page)
        kind = "t r" if masked == "train" else "c r"
        assert f'class="{kind}">&lt;think&gt;' in page.read_text(encoding="utf-8")
