from __future__ import annotations

import pytest

from packshard.engine import EngineOptions
from packshard.errors import RecordError
from packshard.ingest.sources import expand_inputs
from packshard.ingest.templates import load_template
from packshard.ingest.tokenizer import load_tokenizer
from packshard.profile import profile_inputs, report_to_dict
from packshard.profile.units import profile_on_engine
from packshard.records import IngestOptions
from tests.helpers import scale_inputs


def test_profile_on_two_workers_is_the_one_process_report(tmp_path, packed_demo_tokenizer):
    files = expand_inputs([str(p) for p in scale_inputs(tmp_path)])
    bundle = load_tokenizer(str(packed_demo_tokenizer))
    options = IngestOptions()
    one = profile_inputs(files, bundle, load_template("chatml", bundle), options, 128, 8, 0)
    engine = EngineOptions("local", 2)
    tok = str(packed_demo_tokenizer)
    two = profile_on_engine(files, tok, "chatml", options, 128, 8, 0, engine, 8000, "offsets")
    assert report_to_dict(one) == report_to_dict(two)
    assert one.rejects == two.rejects and len(two.rejects) >= 2
    assert one.reject_codes == two.reject_codes
    fail = IngestOptions(on_error="fail")
    with pytest.raises(RecordError) as serial:
        profile_inputs(files, bundle, load_template("chatml", bundle), fail, 128)
    with pytest.raises(RecordError) as units:
        profile_on_engine(files, tok, "chatml", fail, 128, 8, 0, engine, 8000)
    assert str(serial.value) == str(units.value)
