from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packshard.arrays import count_trained
from packshard.errors import UsageError
from packshard.ingest.types import IngestChunk, TokenizedBatch
from packshard.profile import (
    Utilization,
    compute_histogram_edges,
    measure_lengths,
    profile_chunks,
    profile_lengths,
    report_to_dict,
)
from packshard.records import IGNORE_INDEX, Reject, SourceRef

M = IGNORE_INDEX


def profile(lengths, max_seq_len, batch_size=8, domains=None, loss=None, rejected=None, seed=0):
    lengths = np.asarray(lengths, dtype=np.int64)
    if domains is None:
        names, codes = ["chat"], np.zeros(len(lengths), dtype=np.int64)
    else:
        names = sorted(set(domains))
        codes = np.array([names.index(d) for d in domains], dtype=np.int64)
    loss = np.zeros_like(lengths) if loss is None else np.asarray(loss)
    return profile_lengths(
        lengths, loss, codes, names, rejected or {}, max_seq_len, batch_size, seed
    )


def fractions(d):
    return {u.strategy: (u.useful_tokens, u.computed_tokens, u.rows) for u in d.utilization}


def test_three_examples_by_hand():
    # U = 8.  pad: 3 × 8 = 24.  One batch of 3, longest 5: 15 (any order).  BFD: 1 row.
    report = profile([5, 2, 1], max_seq_len=8, batch_size=3)
    assert fractions(report.total) == {
        "pad_to_max": (8, 24, 3),
        "random_batches": (8, 15, 3),
        "bucketed": (8, 15, 3),
        "packed": (8, 8, 1),
    }
    assert report.total.strategy("packed").fraction == 1.0
    assert report.total.strategy("pad_to_max").fraction == pytest.approx(1 / 3)
    assert report.total.lower_bound_rows == 1
    assert report.verdict.startswith(
        "packing removes 67% of computed tokens vs padding to max_seq_len 8 "
        "(3 padded rows → 1 packed rows, fill 100.0%"
    )


def test_bucketed_batches_sort_and_keep_a_short_last_batch():
    # clipped [3 3 3 1 8] → sorted [1 3 | 3 3 | 8]: 3·2 + 3·2 + 8·1 = 20 computed, U = 18
    report = profile([3, 3, 3, 1, 9], max_seq_len=8, batch_size=2)
    useful, computed, _ = fractions(report.total)["bucketed"]
    assert (useful, computed) == (18, 20)
    assert fractions(report.total)["pad_to_max"] == (18, 40, 5)


def test_random_batches_follow_the_documented_seeded_permutation():
    lengths = np.array([1, 8, 2, 7, 3, 6, 4], dtype=np.int64)
    for seed in (0, 1, 7):
        perm = np.random.default_rng(seed).permutation(len(lengths))
        shuffled = lengths[perm]
        batches = [shuffled[0:3], shuffled[3:6], shuffled[6:]]
        expected = sum(int(b.max()) * len(b) for b in batches)
        report = profile(lengths, max_seq_len=8, batch_size=3, seed=seed)
        assert fractions(report.total)["random_batches"] == (31, expected, 7)


def test_equal_lengths_waste_nothing_in_any_batching():
    report = profile([4] * 10, max_seq_len=4, batch_size=3)
    assert {u.strategy: u.fraction for u in report.total.utilization} == dict.fromkeys(
        ("pad_to_max", "random_batches", "bucketed", "packed"), 1.0
    )


def test_overlong_examples_count_as_truncated():
    report = profile([10, 4, 8], max_seq_len=8, batch_size=8)
    t = report.total
    assert (t.over_max, t.over_max_share) == (1, pytest.approx(1 / 3))
    assert t.tokens == 22  # the raw lengths
    assert fractions(t)["pad_to_max"] == (20, 24, 3)  # useful = 8 + 4 + 8
    assert fractions(t)["packed"] == (20, 24, 3)
    assert t.lower_bound_rows == 3  # ceil(20 / 8)


def test_nearest_rank_percentiles():
    s = measure_lengths(np.arange(1, 101))
    assert (s.p50, s.p90, s.p95, s.p99, s.max, s.mean) == (50, 90, 95, 99, 100, 50.5)
    s = measure_lengths(np.array([10, 20, 30]))
    assert (s.p50, s.p90, s.p95, s.p99, s.max) == (20, 30, 30, 30, 30)
    s = measure_lengths(np.array([7]))
    assert (s.p50, s.p99, s.max) == (7, 7, 7)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=300))
def test_percentiles_match_numpy_inverted_cdf(values):
    s = measure_lengths(np.sort(np.array(values)))
    expected = np.percentile(values, [50, 90, 95, 99], method="inverted_cdf")
    assert [s.p50, s.p90, s.p95, s.p99] == [int(v) for v in expected]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=200),
    st.integers(1, 9),
    st.integers(0, 3),
)
def test_strategies_are_ordered_and_above_the_lower_bound(values, batch_size, seed):
    report = profile(values, max_seq_len=256, batch_size=batch_size, seed=seed)
    f = {u.strategy: u for u in report.total.utilization}
    assert len({u.useful_tokens for u in f.values()}) == 1
    assert 0 < f["pad_to_max"].fraction <= f["random_batches"].fraction <= 1.0
    assert f["pad_to_max"].fraction <= f["bucketed"].fraction <= 1.0
    if len(values) % batch_size == 0:  # with full batches sorted grouping is optimal
        assert f["random_batches"].fraction <= f["bucketed"].fraction
    assert f["packed"].rows >= report.total.lower_bound_rows
    assert f["packed"].fraction <= 1.0


def test_domains_add_up_to_the_total_and_reject_only_domains_appear():
    domains = ["b", "a", "b", "a", "a", "c"]
    report = profile(
        [5, 12, 3, 7, 1, 9],
        max_seq_len=8,
        domains=domains,
        loss=[2, 6, 1, 3, 0, 4],
        rejected={"a": 2, "z<bad>": 3},
    )
    names = [d.name for d in report.domains]
    assert names == ["a", "b", "c", "z<bad>"]
    by = {d.name: d for d in report.domains}
    for field in ("records", "examples", "rejected", "tokens", "loss_tokens", "over_max"):
        assert sum(getattr(d, field) for d in report.domains) == getattr(report.total, field)
    hist = np.sum([d.histogram for d in report.domains], axis=0)
    assert hist.tolist() == list(report.total.histogram)
    assert sum(report.total.histogram) == 6
    a = by["a"]
    assert (a.records, a.examples, a.rejected, a.tokens, a.loss_tokens) == (5, 3, 2, 20, 9)
    assert (a.prompt_tokens, a.loss_share) == (11, pytest.approx(9 / 20))
    assert a.lengths is not None and (a.lengths.p50, a.lengths.max) == (7, 12)
    z = by["z<bad>"]
    assert (z.records, z.examples, z.rejected, z.lengths, z.utilization) == (3, 0, 3, None, ())
    assert report.total.records == 11


def test_histogram_edges_are_log_spaced_and_cover_the_longest():
    floor_2_pow_k_4 = [1, 2, 3, 4, 5, 6, 8, 9, 11, 13, 16, 19, 22]
    assert compute_histogram_edges(16, 8).tolist() == floor_2_pow_k_4  # 9 is already there
    assert compute_histogram_edges(16, 16).tolist() == sorted([*floor_2_pow_k_4, 17])
    for longest, max_seq_len in ((1, 1), (7, 3), (4096, 4096), (100_000, 8192)):
        edges = compute_histogram_edges(longest, max_seq_len)
        assert edges[0] == 1 and edges[-1] > longest and np.all(np.diff(edges) > 0)
        assert max_seq_len + 1 in edges


def make_chunk(lengths, labels, domains, rejects=(), paths=None, loss_tokens=None):
    """An ingest chunk; ``loss_tokens`` defaults to what ingest counts (first label excluded)."""
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    n = len(lengths)
    batch = TokenizedBatch(
        input_ids=np.arange(offsets[-1], dtype=np.int32),
        labels=np.array(labels, dtype=np.int32),
        offsets=offsets,
        refs=tuple(SourceRef("x.jsonl", i + 1) for i in range(n)),
        domains=tuple(domains),
        formats=("messages",) * n,
    )
    rej = tuple(Reject(SourceRef("x.jsonl", 99), d, "invalid_json", "bad") for d in rejects)
    loss = count_trained(batch.labels, offsets) if loss_tokens is None else np.array(loss_tokens)
    return IngestChunk(batch, rej, n + len(rej), loss, paths or {})


def test_profile_chunks_accumulates_across_chunks():
    chunks = [
        make_chunk([3, 2], [M, 1, 2, 3, 4], ["chat", "code"], rejects=["chat"]),
        make_chunk([4], [M, M, 7, 7], ["chat"], rejects=["lost"]),
        make_chunk([], [], []),
    ]
    report = profile_chunks(chunks, max_seq_len=4, batch_size=2, label_path="generation_tags")
    by = {d.name: d for d in report.domains}
    assert list(by) == ["chat", "code", "lost"]
    assert (by["chat"].examples, by["chat"].tokens, by["chat"].loss_tokens) == (2, 7, 4)
    assert (by["code"].tokens, by["code"].loss_tokens) == (2, 1)  # [3, 4]: first not counted
    assert (by["chat"].rejected, by["lost"].rejected, report.total.records) == (1, 1, 5)
    assert report.label_path == "generation_tags"  # no chunk said otherwise


def test_profile_chunks_takes_ingest_loss_counts_and_label_paths():
    # the chunk's loss_tokens are what ingest counted; the profile does not count again
    chunk = make_chunk([3], [M, 1, 2], ["chat"], paths={"offsets": 3, "none": 1}, loss_tokens=[1])
    more = make_chunk([2], [M, 5], ["chat"], paths={"none": 1})
    report = profile_chunks([chunk, more], max_seq_len=4)
    assert report.total.loss_tokens == 2
    assert report.label_path == "offsets 3, none 2"


def test_empty_input_profiles_to_an_empty_report():
    report = profile_chunks([], max_seq_len=16)
    assert report.total.examples == 0 and report.domains == ()
    assert report.verdict == "no accepted examples: nothing to pack"
    assert report.total.utilization == ()
    json.dumps(report_to_dict(report))


def test_utilization_fraction():
    assert Utilization("packed", 3, 24, 18).fraction == 0.75
    assert Utilization("packed", 0, 0, 0).fraction == 0.0  # nothing computed, nothing useful


def test_bad_settings_raise_usage_errors():
    with pytest.raises(UsageError, match=r"max_seq_len 0 and batch_size 8 must be positive"):
        profile([1], max_seq_len=0)
    with pytest.raises(UsageError, match="one entry per example"):
        profile_lengths(np.ones(3), np.ones(2), np.zeros(3), ["a"], {}, 8)


def test_report_dict_has_stable_keys_and_rounded_fractions():
    report = profile([5, 2, 1], max_seq_len=8, batch_size=3, loss=[1, 1, 0])
    data = report_to_dict(report)
    assert sorted(data) == [
        "batch_size",
        "domains",
        "fit",
        "histogram_edges",
        "label_path",
        "max_seq_len",
        "overlong",
        "packed_shape",
        "percentile_method",
        "seed",
        "total",
        "verdict",
    ]
    total = data["total"]
    assert sorted(total) == sorted(
        [
            "name", "records", "examples", "rejected", "tokens", "loss_tokens", "prompt_tokens",
            "loss_share", "over_max", "over_max_share", "lengths", "utilization",
            "lower_bound_rows", "histogram", "reasoning_examples", "reasoning_tokens",
            "reasoning_loss_tokens", "reasoning_loss_share", "fit",
        ]
    )  # fmt: skip
    assert total["fit"] == {
        "over_max_tokens": 0,
        "over_max_parts": 0,
        "keep_length": 5,
        "effect": "none over: every example kept whole",
    }
    assert data["fit"]["overlong"] == "drop" and data["fit"]["keep_share"] == 0.99
    assert total["utilization"]["pad_to_max"] == {
        "rows": 3,
        "computed_tokens": 24,
        "useful_tokens": 8,
        "useful_fraction": 0.333333,
    }
    assert total["lengths"] == {"p50": 2, "p90": 5, "p95": 5, "p99": 5, "max": 5, "mean": 2.667}
    assert data["domains"][0]["name"] == "chat"
    assert json.loads(json.dumps(data)) == data


@pytest.mark.shared_data
def test_profile_inputs_on_real_chat_files(shared_data):
    from packshard.ingest.read.sources import expand_inputs
    from packshard.ingest.types import IngestOptions
    from packshard.profile import ProfileConfig, profile_inputs

    tokenizer = str(shared_data / "tokenizers" / "phi-3-mini")
    chat = shared_data / "chat"
    files = expand_inputs(
        [
            str(chat / "openai_cookbook_toy_chat_fine_tuning.jsonl"),
            str(chat / "fastchat_dummy_conversation.json"),
        ]
    )
    options = IngestOptions(batch_size=64)
    config = ProfileConfig((), tokenizer, 2048, batch_size=4, ingest=options)
    report = profile_inputs(files, config)
    by = {d.name: d for d in report.domains}
    assert set(by) == {"openai_cookbook_toy_chat_fine_tuning", "fastchat_dummy_conversation"}
    assert by["fastchat_dummy_conversation"].records == 500
    toy = by["openai_cookbook_toy_chat_fine_tuning"]
    assert toy.records == 5
    # record 5 is one 26,000-character assistant message: ≈12k phi-3 tokens, over 2048
    assert toy.over_max == 1 and toy.lengths is not None and toy.lengths.max > 12_000
    assert report.total.records == 505
    assert 0 < report.total.loss_tokens < report.total.tokens
    assert report.label_path == "offsets"
    fill = report.total.strategy("packed").fraction
    assert report.total.strategy("pad_to_max").fraction < fill <= 1.0


def test_profile_plain_text_with_a_tokenizer_without_chat_template(shared_data, tmp_path):
    """`profile` on `text` records with phi-2 (no chat template): every token but the first."""
    import json as _json

    from click.testing import CliRunner

    from packshard.cli.commands import main

    records = _json.loads((shared_data / "chat" / "codealpaca_code_alpaca_2k.json").read_text())
    data = tmp_path / "code_text.jsonl"
    data.write_text("".join(_json.dumps({"text": r["output"]}) + "\n" for r in records[:40]))
    out = tmp_path / "profile.json"
    tokenizer = str(shared_data / "tokenizers" / "phi-2")
    result = CliRunner().invoke(
        main, ["profile", str(data), "-t", tokenizer, "--max-seq-len", "256", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    report = _json.loads(out.read_text())
    total = report["total"]
    assert report["label_path"] == "none"
    assert total["records"] == 40 and total["rejected"] == 0
    assert total["loss_tokens"] == total["tokens"] - total["examples"]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(shared_data / "tokenizers" / "phi-2" / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    expected = sum(
        len(tok.encode(r["output"], add_special_tokens=False).ids) + 1 for r in records[:40]
    )
    assert eos is not None and total["tokens"] == expected


# --- reasoning per domain ---------------------------------------------------------------------


def test_profile_reports_reasoning_per_domain(tmp_path) -> None:
    from packshard.ingest.read.sources import expand_inputs
    from packshard.ingest.types import IngestOptions
    from packshard.profile import ProfileConfig, profile_inputs
    from tests.helpers import THINK, answer, build_qwen, chat, user, write_jsonl

    tokenizer = str(build_qwen(tmp_path / "qwen"))
    template = tmp_path / "think.jinja"
    template.write_text(THINK, encoding="utf-8")
    thinking = chat(user("2+2?"), answer("4", reasoning_content="Add 2 and 2."), domain="math")
    two_turns = chat(
        user("2+2?"),
        answer("4", reasoning_content="Add."),
        user("3+3?"),
        answer("6", reasoning_content="Add again."),
        domain="math",
    )
    plain = chat(user("hi"), answer("hello"), domain="talk")
    files = expand_inputs([str(write_jsonl(tmp_path / "d.jsonl", [thinking, two_turns, plain]))])

    def run(**options):
        config = ProfileConfig((), tokenizer, 64, str(template), ingest=IngestOptions(**options))
        report = profile_inputs(files, config)
        return {d.name: d for d in report.domains}, report.total

    domains, total = run()
    assert (domains["math"].reasoning_examples, domains["talk"].reasoning_examples) == (2, 0)
    math = domains["math"]
    assert math.reasoning_loss_tokens == math.reasoning_tokens > 0  # trained with the answer
    assert 0 < math.reasoning_loss_share < 1 and domains["talk"].reasoning_loss_share == 0
    assert total.reasoning_tokens == math.reasoning_tokens
    masked, _ = run(reasoning="mask")
    assert masked["math"].reasoning_tokens == math.reasoning_tokens
    assert masked["math"].reasoning_loss_tokens == 0 == masked["math"].reasoning_loss_share
    expanded, total = run(turns="expand")
    assert (expanded["math"].records, expanded["math"].examples) == (2, 3)
    assert (total.records, total.examples) == (3, 4)
    assert expanded["math"].reasoning_examples == 3  # each turn trained with its reasoning
