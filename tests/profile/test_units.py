from __future__ import annotations

from typing import Any

import pytest

from packshard.engine import EngineOptions
from packshard.errors import RecordError
from packshard.ingest.read.sources import expand_inputs
from packshard.ingest.read.units import plan_ranges
from packshard.ingest.types import IngestOptions
from packshard.profile import ProfileConfig, profile_inputs, report_to_dict
from tests.helpers import scale_inputs


def config(tok: str, template: str, options: IngestOptions, **more: Any) -> ProfileConfig:
    return ProfileConfig((), tok, 128, template, ingest=options, **more)


def test_profile_on_two_workers_is_the_one_process_report(tmp_path, packed_demo_tokenizer):
    files = expand_inputs([str(p) for p in scale_inputs(tmp_path)])
    options = IngestOptions()
    tok = str(packed_demo_tokenizer)
    one = profile_inputs(files, config(tok, "chatml", options))
    engine = EngineOptions("local", 2)
    two = profile_inputs(files, config(tok, "chatml", options, engine=engine, split_bytes=8000))
    assert report_to_dict(one) == report_to_dict(two)
    assert one.rejects == two.rejects and len(two.rejects) >= 2
    assert one.reject_codes == two.reject_codes
    fail = IngestOptions(on_error="fail")
    with pytest.raises(RecordError) as serial:
        profile_inputs(files, config(tok, "chatml", fail))
    with pytest.raises(RecordError) as units:
        profile_inputs(files, config(tok, "chatml", fail, engine=engine, split_bytes=8000))
    assert str(serial.value) == str(units.value)


@pytest.mark.parametrize("turns", ["as_rendered", "expand"])
def test_reasoning_and_records_on_workers_are_the_one_process_report(tmp_path, turns):
    """Reasoning tokens, the trained ones and record counts (``--turns expand`` makes several
    examples of a record) merge from units exactly as one process counts them."""
    from tests.helpers import THINK, answer, build_qwen, chat, user, write_jsonl

    tok = str(build_qwen(tmp_path / "qwen"))
    records = [
        chat(
            user(f"{k}+{k}?"),
            answer(f"{2 * k}", reasoning_content="Add."),
            user(f"{k}*{k}?"),
            answer(f"{k * k}", reasoning_content="Multiply." if k % 3 else ""),
            domain="math" if k % 2 else "talk",
        )
        for k in range(30)
    ]
    files = expand_inputs([str(write_jsonl(tmp_path / "d.jsonl", records))])
    template_path = tmp_path / "think.jinja"
    template_path.write_text(THINK, encoding="utf-8")
    options = IngestOptions(turns=turns)
    one = profile_inputs(files, config(tok, str(template_path), options))
    engine = EngineOptions("local", 2)
    two = profile_inputs(
        files, config(tok, str(template_path), options, engine=engine, split_bytes=600)
    )
    assert len(plan_ranges(files, 600)) > 2  # records of one file, cut into several units
    assert report_to_dict(one) == report_to_dict(two)
    assert one.total.reasoning_tokens > 0 and one.total.records == 30
    assert one.total.examples == (60 if turns == "expand" else 30)


def test_small_inputs_gathered_give_the_report_of_a_unit_each(tmp_path, packed_demo_tokenizer):
    from tests.helpers import write_jsonl

    paths = [
        write_jsonl(tmp_path / f"s{k}.jsonl", [{"text": f"file {k}"}, "oops"][: 1 + k % 2])
        for k in range(8)
    ]
    files = expand_inputs([str(p) for p in paths])
    tok = str(packed_demo_tokenizer)
    gathered = profile_inputs(files, config(tok, "chatml", IngestOptions()))
    apart = profile_inputs(files, config(tok, "chatml", IngestOptions(), split_bytes=1))
    assert report_to_dict(gathered) == report_to_dict(apart)
    assert gathered.rejects == apart.rejects and len(gathered.rejects) == 4
    assert [r.ref.source for r in gathered.rejects] == [str(p) for p in paths[1::2]]
