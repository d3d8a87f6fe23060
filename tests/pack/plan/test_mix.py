"""``pack --mix``: seeded token-budget mixtures, repeat caps, the record of what was realised."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from packshard.errors import UsageError
from packshard.pack.plan.mix import MixTarget, choose_copies, example_repeats, parse_mix
from packshard.pack.plan.rows import RowPlan
from tests.helpers import check_pack_output

DOMAINS = {
    "llamafactory_alpaca_en_demo": 0.6,
    "codealpaca_code_alpaca_2k": 0.3,
    "llamafactory_glaive_toolcall_en_demo": 0.1,
}
MIX = ",".join(f"{name}={share}" for name, share in DOMAINS.items())
TOLERANCE = 0.005  # half a percentage point


def _files(out: Path) -> dict[str, bytes]:
    """The bytes of the shards and the examples index (the manifest records a time)."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix == ".parquet"}


# --- the choice alone ---------------------------------------------------------------------------


def test_parse_mix_refuses_what_is_not_a_mixture():
    assert parse_mix("a=0.6, b=0.4") == (("a", 0.6), ("b", 0.4))
    assert parse_mix("x=y=1") == (("x=y", 1.0),)  # the last '=' separates the share
    for text, match in (
        ("a=0.6,b=0.3", "add up to 1"),
        ("a=0.6,a=0.4", "twice"),
        ("a", "DOMAIN=SHARE"),
        ("a=x,b=1", "DOMAIN=SHARE"),
        ("a=-0.5,b=1.5", "DOMAIN=SHARE"),
        ("a=nan,b=1", "DOMAIN=SHARE"),
    ):
        with pytest.raises(UsageError, match=match):
            parse_mix(text)


def test_choose_copies_meets_budgets_within_a_record_and_respects_the_cap():
    rng = np.random.default_rng(0)
    domain = np.repeat([0, 1, 2], [500, 800, 300])
    weight = rng.integers(20, 200, len(domain)).astype(np.float64)
    names = ["a", "b", "c"]
    target = MixTarget((("a", 0.6), ("b", 0.3), ("c", 0.1)), max_repeat=3)
    choice = choose_copies(domain, weight, names, target, seed=0)
    got = np.bincount(domain, weights=weight * choice.copies)
    assert choice.copies.max() <= 3
    assert np.all(np.abs(got - choice.budget) <= 200 / 2)  # within half a record
    assert np.allclose(got / got.sum(), [0.6, 0.3, 0.1], atol=1e-3)
    other = choose_copies(domain, weight, names, target, seed=1)
    assert not np.array_equal(other.copies, choice.copies)  # another seed, another choice
    again = choose_copies(domain, weight, names, target, seed=0)
    assert np.array_equal(again.copies, choice.copies)


def test_choose_copies_names_the_limiting_domain_or_shrinks_with_best_effort():
    domain = np.repeat([0, 1], [10, 90])
    weight = np.ones(100)
    target = MixTarget((("small", 0.5), ("big", 0.5)), by="examples", max_repeat=2)
    with pytest.raises(UsageError) as err:
        choose_copies(domain, weight, ["small", "big"], target, seed=0)
    message = str(err.value)
    assert "\n" not in message
    assert "small has 10 examples" in message and "--max-repeat 2" in message
    assert "reaches at most 28.6%" in message  # 20 / (20 + 0.5 * 100)
    assert "raise --max-repeat to 5" in message and "--mix-best-effort" in message
    best = MixTarget(target.shares, by="examples", max_repeat=2, best_effort=True)
    choice = choose_copies(domain, weight, ["small", "big"], best, seed=0)
    assert choice.note is not None
    assert np.bincount(domain, weights=choice.copies).tolist() == [20, 20]  # 40 in all


def test_example_repeats_number_the_copies_of_each_example_by_id():
    """Copies of one example (same spilled example and start) have consecutive ids."""
    # segments in row order: example 4 (3 copies), example 7 split at 0 and 5, example 9
    seg_example = np.array([4, 7, 4, 9, 7, 4], dtype=np.int32)
    seg_start = np.array([0, 0, 0, 0, 5, 0], dtype=np.int32)
    example_id = np.array([1, 3, 0, 5, 4, 2], dtype=np.int32)
    zeros = np.zeros(6, dtype=np.int32)
    plan = RowPlan(np.array([0, 3, 6]), seg_example, seg_start, zeros, zeros, zeros, example_id, 8)
    # by id: 0,1,2 are example 4 (copies 0,1,2); 3 is 7@0; 4 is 7@5; 5 is 9
    assert example_repeats(plan).tolist() == [1, 0, 0, 0, 0, 2]


def test_mix_options_without_mix_and_unknown_domains_are_refused(
    tmp_path, make_jsonl, word_tokenizer, run_pack
):
    data = make_jsonl(tmp_path / "a.jsonl", [{"text": "w2 w3"}, {"text": "w4 w5 w6"}])
    with pytest.raises(UsageError, match="--max-repeat applies to a mixture"):
        run_pack([data], word_tokenizer, max_seq_len=8, max_repeat=2)
    with pytest.raises(UsageError, match="no share"):
        run_pack([data], word_tokenizer, max_seq_len=8, mix="b=1")
    with pytest.raises(UsageError, match="wrapped"):
        run_pack([data], word_tokenizer, max_seq_len=8, mix="a=1", strategy="wrapped")


def test_workers_one_and_two_make_the_same_mixture(tmp_path, make_jsonl, word_tokenizer, run_pack):
    texts = [" ".join(f"w{2 + (i * 7 + k) % 400}" for k in range(2 + i % 9)) for i in range(60)]
    a = make_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts[:40]])
    b = make_jsonl(tmp_path / "b.jsonl", [{"text": t} for t in texts[40:]])
    options = {"max_seq_len": 16, "mix": "a=0.3,b=0.7", "max_repeat": 3, "loss": "all"}
    one = run_pack([a, b], word_tokenizer, out=tmp_path / "one", workers=1, **options)
    two = run_pack([a, b], word_tokenizer, out=tmp_path / "two", workers=2, **options)
    assert _files(one.out) == _files(two.out)
    mix = one.manifest["stats"]["mix"]["domains"]
    assert mix["b"]["repeats"] > 0 and mix["a"]["records_dropped"] > 0
    # a repeat is a new example traced to the same source:line
    ex = one.examples
    keys = list(zip(ex["source"], ex["line"], strict=True))
    first = {key: k for k, key in enumerate(keys) if ex["repeat"][k] == 0}
    for k, r in enumerate(ex["repeat"]):
        if r:
            twin = first[(ex["source"][k], ex["line"][k])]
            assert ex["example_id"][k] == ex["example_id"][twin] + r
            assert ex["num_tokens"][k] == ex["num_tokens"][twin]
    # inspect names the copy
    from packshard.cli.inspect import inspect_row, segment_title

    k = ex["repeat"].index(1)
    view = inspect_row(one.out, row=ex["row"][k], shard=ex["shard"][k])
    titles = [segment_title(seg) for seg in view.segments]
    assert any(f"example {ex['example_id'][k]} " in t and "· copy 2 ·" in t for t in titles)


# --- the shared chat data -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_mixes(tmp_path_factory, request):
    """The same three-domain mixture packed with seed 0 (twice) and seed 1."""
    shared = request.getfixturevalue("shared_data")
    from packshard.pack import PackConfig, pack_dataset

    root = tmp_path_factory.mktemp("mix")
    inputs = tuple(str(shared / "chat" / f"{name}.json") for name in DOMAINS)
    outs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        config = PackConfig.build(
            inputs=inputs,
            tokenizer=str(shared / "tokenizers" / "phi-3-mini"),
            out=str(root / name),
            max_seq_len=4096,
            mix=MIX,
            max_repeat=2,
            seed=seed,
        )
        outs[name] = pack_dataset(config).out
    return outs


@pytest.mark.shared_data
def test_shared_chat_mixture_meets_its_targets_within_half_a_point(chat_mixes):
    packed = check_pack_output(chat_mixes["a"])
    stats = packed.manifest["stats"]
    mix = stats["mix"]
    assert mix["by"] == "trained_tokens" and mix["max_repeat"] == 2
    for name, share in DOMAINS.items():
        assert abs(mix["domains"][name]["share_trained_tokens"] - share) <= TOLERANCE, name
        assert mix["domains"][name]["max_copies"] <= 2
    assert max(packed.examples["repeat"]) == 1  # two copies at most
    assert mix["domains"]["llamafactory_alpaca_en_demo"]["repeats"] > 0
    dropped = sum(d["records_dropped"] for d in mix["domains"].values())
    assert stats["rejects_by_code"]["mix_subsampled"] == dropped > 0
    # realised shares are what the shards hold
    trained = {name: 0 for name in DOMAINS}
    for domain, loss in zip(
        packed.examples["domain"], packed.examples["num_loss_tokens"], strict=True
    ):
        trained[domain] += loss
    for name in DOMAINS:
        assert mix["domains"][name]["trained_tokens"] == trained[name]


@pytest.mark.shared_data
def test_shared_chat_mixture_is_deterministic_and_seeded(chat_mixes):
    a, b, c = (_files(chat_mixes[k]) for k in "abc")
    assert a == b
    assert a["examples.parquet"] != c["examples.parquet"]
    mixes = [
        json.loads((chat_mixes[k] / "manifest.json").read_text())["stats"]["mix"] for k in "ac"
    ]
    for name, share in DOMAINS.items():
        for mix in mixes:
            assert abs(mix["domains"][name]["share_trained_tokens"] - share) <= TOLERANCE


@pytest.mark.shared_data
def test_shared_chat_mixture_unreachable_without_repeats(shared_data, tmp_path, run_pack):
    inputs = [shared_data / "chat" / f"{name}.json" for name in DOMAINS]
    tok = shared_data / "tokenizers" / "phi-3-mini"
    with pytest.raises(UsageError) as err:
        run_pack(inputs, tok, max_seq_len=4096, mix=MIX)
    message = str(err.value)
    assert message.startswith("--mix llamafactory_alpaca_en_demo=0.6 by trained_tokens:")
    assert "reaches at most" in message and "raise --max-repeat to 2" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.shared_data
def test_verify_recounts_the_mixture_and_fails_on_dropped_repeats(chat_mixes, tmp_path):
    from packshard.verify.run import VerifyOptions, verify_dataset

    options = VerifyOptions(source=False, model="none")
    assert verify_dataset(chat_mixes["a"], options).ok
    for how in ("rows removed", "repeat zeroed"):
        out = Path(shutil.copytree(chat_mixes["a"], tmp_path / how.replace(" ", "_")))
        path = out / "examples.parquet"
        table = pq.read_table(path)
        theirs = pc.and_(
            pc.equal(table["domain"], "llamafactory_alpaca_en_demo"),
            pc.greater(table["repeat"], 0),
        )
        if how == "rows removed":
            table = table.filter(pc.invert(theirs))
        else:
            repeat = pc.if_else(theirs, 0, table["repeat"]).cast(table.schema.field("repeat").type)
            table = table.set_column(table.schema.get_field_index("repeat"), "repeat", repeat)
        pq.write_table(table, path, compression="zstd")  # resealed: its checksum recorded
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["files"]["examples"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
        report = verify_dataset(out, options)
        assert not report.ok, how
        messages = [f.message for f in report.findings.items]
        assert any("'llamafactory_alpaca_en_demo': the manifest records repeats" in m
                   for m in messages), (how, messages)  # fmt: skip


def test_the_reader_shuffles_mixed_rows_per_epoch_and_keeps_sequential_order(
    tmp_path, make_jsonl, word_tokenizer, run_pack
):
    pytest.importorskip("torch")
    from packshard.torch import PackedIterableDataset

    texts = [" ".join(f"w{2 + (i * 5 + k) % 400}" for k in range(2 + i % 7)) for i in range(48)]
    a = make_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts[:30]])
    b = make_jsonl(tmp_path / "b.jsonl", [{"text": t} for t in texts[30:]])
    options = {"max_seq_len": 16, "mix": "a=0.4,b=0.6", "max_repeat": 2, "loss": "all"}
    mixed = run_pack([a, b], word_tokenizer, out=tmp_path / "bfd", **options)
    n = mixed.manifest["stats"]["examples"]
    assert max(mixed.examples["repeat"]) == 1
    reads = []
    for epoch in range(2):
        ds = PackedIterableDataset(mixed.out, seed=3, rank=0, world_size=1)
        ds.set_epoch(epoch)
        reads.append([int(e) for row in ds for e in row["example_ids"].tolist()])
        assert sorted(reads[-1]) == list(range(n))  # every copy once an epoch
    assert reads[0] != reads[1]
    ordered = run_pack(
        [a, b], word_tokenizer, out=tmp_path / "seq", strategy="sequential", **options
    )
    stats = ordered.manifest["stats"]
    assert stats["bfd_rows"] == mixed.manifest["stats"]["rows"]  # BFD of the same copies
    assert stats["bfd_fill_rate"] == mixed.manifest["stats"]["fill_rate"]
    ds = PackedIterableDataset(ordered.out, shuffle=False, rank=0, world_size=1)
    read = [int(e) for row in ds for e in row["example_ids"].tolist()]
    assert read == list(range(ordered.manifest["stats"]["examples"]))
    ex = ordered.examples
    places = [(ex["source"][k], ex["line"][k], ex["repeat"][k]) for k in read]
    assert places == sorted(places)  # input order, each copy after the one before


@pytest.mark.shared_data
def test_profile_predicts_the_packed_mixture_and_both_print_it(chat_mixes, shared_data):
    from packshard.cli.tables import console, render_mixture, render_profile_table
    from packshard.ingest.read.sources import expand_inputs
    from packshard.profile import ProfileConfig, profile_inputs, report_to_dict

    inputs = tuple(str(shared_data / "chat" / f"{name}.json") for name in DOMAINS)
    tok = str(shared_data / "tokenizers" / "phi-3-mini")
    config = ProfileConfig.build(
        inputs=inputs, tokenizer=tok, max_seq_len=4096, mix=MIX, max_repeat=2
    )
    report = profile_inputs(expand_inputs(inputs), config)
    packed = json.loads((chat_mixes["a"] / "manifest.json").read_text())["stats"]["mix"]
    assert json.loads(json.dumps(report.mixture)) == packed  # the same choice, predicted
    assert report_to_dict(report)["mixture"] == report.mixture
    out = console()  # stdout is not a terminal under pytest: plain text, one line a row
    with out.capture() as captured:
        out.print(render_profile_table(report))
        out.print(render_mixture(packed, "after"))
    text = captured.get()
    assert "\x1b[" not in text
    rows = [line for line in text.splitlines() if "llamafactory_alpaca_en_demo " in line]
    assert len(rows) >= 2 and all("60.00%" in row and "42.03%" in row for row in rows[:1])


def test_a_mixture_of_nothing_says_nothing_was_packed(tmp_path, make_jsonl, word_tokenizer):
    from packshard.errors import NothingToPackError
    from packshard.pack import PackConfig, pack_dataset

    data = make_jsonl(tmp_path / "a.jsonl", ['{"text": "w2"', "[1]"])
    config = PackConfig.build(
        inputs=(str(data),), tokenizer=str(word_tokenizer), out=str(tmp_path / "out"),
        max_seq_len=8, mix="a=1",
    )  # fmt: skip
    with pytest.raises(NothingToPackError, match="nothing to pack"):
        pack_dataset(config)


def test_best_effort_warns_and_the_cli_stops_in_one_line(tmp_path, make_jsonl, word_tokenizer):
    from click.testing import CliRunner

    from packshard.cli.commands import main
    from packshard.pack import PackConfig, pack_dataset

    a = make_jsonl(tmp_path / "a.jsonl", [{"text": f"w{2 + i} w3"} for i in range(4)])
    b = make_jsonl(tmp_path / "b.jsonl", [{"text": f"w{9 + i} w4"} for i in range(20)])
    args = [str(a), str(b), "-t", str(word_tokenizer), "--max-seq-len", "8", "--loss", "all"]
    result = CliRunner().invoke(
        main, ["pack", *args, "-o", str(tmp_path / "o"), "--mix", "a=0.5,b=0.5"]
    )
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "--mix a=0.5" in result.output
    config = PackConfig.build(
        inputs=(str(a), str(b)), tokenizer=str(word_tokenizer), out=str(tmp_path / "best"),
        max_seq_len=8, loss="all", mix="a=0.5,b=0.5", mix_best_effort=True,
    )  # fmt: skip
    done = pack_dataset(config)
    assert any(w.startswith("--mix-best-effort: --mix a=0.5") for w in done.warnings)
    shares = {
        k: v["share_trained_tokens"] for k, v in done.manifest["stats"]["mix"]["domains"].items()
    }
    assert shares == {"a": 0.5, "b": 0.5}
    assert done.manifest["stats"]["mix"]["best_effort"] is True
