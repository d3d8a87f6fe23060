"""The pair figures of ``profile``: prompt and answer shares, padded DPO batches vs packed rows."""

from __future__ import annotations

import numpy as np

from packshard.profile.pairs import describe_pairs, pair_profile


def test_figures_by_hand():
    # pairs (6, 4) and (3, 5) with prompts 2 + 2 and 1 + 1, a plain example, an overlong pair
    lengths = np.array([6, 4, 3, 5, 7, 9, 9])
    prompts = np.array([2, 2, 1, 1, 0, 3, 3])
    codes = np.array([1, 2, 1, 2, 0, 1, 2])
    got = pair_profile(lengths, prompts, codes, max_seq_len=10, batch_size=2, seed=0)
    assert got["pairs"] == 2 and got["over_max"] == 1
    assert (got["tokens"], got["prompt_tokens"], got["answer_tokens"]) == (18, 6, 12)
    assert got["computed_tokens"] == {
        "pair_padded": 2 * 6 + 2 * 5,
        "batch_padded": 2 * 2 * 6,  # one batch of both pairs, padded to 6
        "packed": 2 * 10,  # each pair fills its own row: 10 and 8 tokens
    }
    assert (got["rows"], got["lower_bound_rows"]) == (2, 2)
    assert got["useful_fraction"]["packed"] == 0.9
    line = describe_pairs(got, 2)
    assert line.startswith("pairs: 2, 1 over max_seq_len left out; prompt 33.3%")
    assert "packed rows waste 10.0% (2 rows, lower bound 2)" in line


def test_no_pairs_no_figures():
    assert pair_profile(np.array([3, 4]), np.zeros(2), np.array([0, 3]), 10, 2, 0) == {}


def test_profile_of_an_ingest_stream_reports_its_pairs(demo_tokenizer, tmp_path):
    from packshard.ingest.read.sources import expand_inputs
    from packshard.ingest.stream import ingest
    from packshard.ingest.template.render import load_template
    from packshard.ingest.tokens.tokenizer import load_tokenizer
    from packshard.ingest.types import IngestOptions
    from packshard.profile.gather import profile_chunks, prompt_tokens
    from packshard.records import IGNORE_INDEX
    from tests.helpers import write_jsonl

    bundle = load_tokenizer(str(demo_tokenizer))
    template = load_template("chatml", bundle)
    user = {"role": "user", "content": "Name a colour."}
    rows = [
        {"prompt": [user], "chosen": "Blue.", "rejected": "Seven, the number of the day."},
        {"messages": [user, {"role": "assistant", "content": "Red."}]},
        {"prompt": "Pick one.", "chosen": "This one.", "rejected": "No."},
    ]
    files = expand_inputs([str(write_jsonl(tmp_path / "p.jsonl", rows))])
    (chunk,) = ingest(files, bundle, template, IngestOptions())
    batch = chunk.batch
    want = [int(np.flatnonzero(batch.example(i)[1] != IGNORE_INDEX)[0]) for i in range(5)]
    assert prompt_tokens(batch).tolist() == want
    report = profile_chunks(ingest(files, bundle, template, IngestOptions()), 512)
    assert report.total.records == 3 and report.total.examples == 5
    lengths = np.diff(batch.offsets)
    assert report.pairs["pairs"] == 2
    assert report.pairs["tokens"] == int(lengths.sum() - lengths[2])
    assert report.pairs["prompt_tokens"] == sum(want) - want[2]
