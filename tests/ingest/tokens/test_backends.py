"""``--backend``: the fast encoder makes the same bytes as the reference, or is not used.

* shards and ``examples.parquet`` are byte-identical between ``--backend fast`` and
  ``--backend reference`` on every shared tokenizer and template, and on the demo;
* ``auto`` without a fast library is the reference path and says so once; a tokenizer the
  fast encoders cannot model falls back with their reasons (forced ``fast`` stops with one
  line); gigatoken is tried first on SentencePiece vocabularies, fastokens on byte-level ones;
* the SentencePiece prefix rule (:mod:`packshard.ingest.tokens.metaspace`) gives the reference's ids
  on the family imitations and on texts that start with and without added tokens.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from packshard.errors import UsageError
from packshard.ingest.tokens import backends
from packshard.ingest.tokens.backends import (
    Encoder,
    FastEncoder,
    canary_texts,
    fast_encoder,
    first_difference,
    libraries,
)
from packshard.ingest.tokens.giga import GigaEncoder
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.pack import PackConfig, pack_dataset
from packshard.pack.units import early
from tests.helpers import BY_NAME, FAMILIES

pytest.importorskip("fastokens")
pytest.importorskip("gigatoken")

CHAT = (
    "llamafactory_glaive_toolcall_en_demo.json",
    "fastchat_dummy_conversation.json",
    "llamafactory_identity.json",
)
# (tokenizer, template, inputs): every shared tokenizer with each template it has
SHARED = {
    "phi3-config": ("phi-3-mini", None, CHAT),
    "phi3-training": ("phi-3-mini", "tokenizers/phi-3-mini/chat_template.training.jinja", CHAT),
    "phi2-chatml": ("phi-2", "chatml", CHAT),
    "qwen3-config": ("qwen3", None, CHAT),
    "qwen3-training": ("qwen3", "tokenizers/qwen3/chat_template.training.jinja", CHAT),
    "qwen3-alpaca-zh": ("qwen3", None, ("llamafactory_alpaca_zh_demo.json",)),
}


def _digests(out: Path) -> dict[str, str]:
    """SHA-256 of every shard and the examples index (the manifest records the backend)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.parquet"))
    }


def _pack(shared: Path, tmp: Path, case: str, backend: str) -> PackConfig:
    tok, template, names = SHARED[case]
    if template is not None and template.endswith(".jinja"):
        template = str(shared / template)
    config = PackConfig.build(
        inputs=tuple(str(shared / "chat" / n) for n in names),
        tokenizer=str(shared / "tokenizers" / tok),
        template=template,
        out=str(tmp / backend),
        max_seq_len=4096,
        overlong="split",
        backend=backend,
        allow_split_markers=template == "chatml",  # phi-2 has no ChatML tokens: intended here
    )
    return config


@pytest.mark.shared_data
@pytest.mark.parametrize("case", sorted(SHARED))
def test_fast_and_reference_write_the_same_bytes(shared_data, tmp_path, case, monkeypatch):
    made = {}
    # a job is small under SMALL_JOB_BYTES: moved so that these inputs are large, then small
    for backend, small_below in (("reference", 0), ("fast", 0), ("fast", 1 << 40)):
        monkeypatch.setattr(early, "SMALL_JOB_BYTES", small_below)
        result = pack_dataset(_pack(shared_data, tmp_path / str(small_below), case, backend))
        encode = result.manifest["environment"]["backends"]["encode"]
        fast = "gigatoken" if case.startswith("phi3") else "fastokens"  # SentencePiece: giga
        fast = "gigatoken" if small_below else fast  # a small job: the one built soonest
        assert encode["name"] == (fast if backend == "fast" else "tokenizers")
        assert encode["requested"] == backend and encode["version"]
        render = result.manifest["environment"]["backends"]["render"]
        assert render["name"] == ("minijinja" if backend == "fast" else "jinja2"), render
        made[backend, small_below] = _digests(result.out)
    assert "examples.parquet" in made["fast", 0] and len(made["fast", 0]) > 1
    assert made["fast", 0] == made["reference", 0] == made["fast", 1 << 40]


def _demo(tmp: Path, tokenizer: Path, backend: str, **options) -> Path:
    """Pack the demo chats (one copy, so the recorded source is the same) into ``tmp/backend``."""
    return _demo_result(tmp / backend, tokenizer, backend=backend, **options).out


def _demo_result(out: Path, tokenizer: Path, **options):
    from packshard.demo import demo_data_path

    config = PackConfig.build(
        inputs=(str(demo_data_path()),),
        tokenizer=str(tokenizer),
        out=str(out),
        max_seq_len=256,
        template="chatml",
        shard_rows=4,
        **options,
    )
    return pack_dataset(config)


def test_demo_fast_and_reference_write_the_same_bytes(tmp_path, demo_tokenizer):
    fast = _demo(tmp_path, demo_tokenizer, "fast")
    reference = _demo(tmp_path, demo_tokenizer, "reference")
    manifest = json.loads((fast / "manifest.json").read_text())
    # byte-level BPE, but a small job: gigatoken, built sooner, first (backends.libraries)
    assert manifest["environment"]["backends"]["encode"]["name"] == "gigatoken"
    assert manifest["environment"]["backends"]["render"]["name"] == "minijinja"
    assert len(_digests(fast)) > 2 and _digests(fast) == _digests(reference)


def test_auto_proves_the_canary_and_the_first_records(tmp_path, demo_tokenizer, monkeypatch):
    monkeypatch.setattr(early, "SMALL_JOB_BYTES", 0)  # not a small job: fastokens first
    out = _demo(tmp_path, demo_tokenizer, "auto")
    encode = json.loads((out / "manifest.json").read_text())["environment"]["backends"]["encode"]
    assert encode == {
        "name": "fastokens",
        "version": encode["version"],
        "requested": "auto",
        "reason": "canary equal",
    }


@pytest.mark.parametrize("small", [False, True])
def test_workers_report_the_encoder_and_the_driver_builds_none(
    tmp_path, demo_tokenizer, monkeypatch, small
):
    built = []
    for kind in (FastEncoder, GigaEncoder):
        real_init = kind.__init__
        monkeypatch.setattr(
            kind,
            "__init__",
            lambda self, bundle, real=real_init: built.append(1) or real(self, bundle),
        )
    # the demo's 10 KB: a small job, or not one with the line moved below it; the workers
    # (forked from a server that built the encoder the job tries first) follow the job's size
    monkeypatch.setattr(early, "SMALL_JOB_BYTES", 1 << 40 if small else 0)
    two = _demo_result(tmp_path / "two", demo_tokenizer, workers=2, split_bytes=4096)
    encode = two.manifest["environment"]["backends"]["encode"]
    name = "gigatoken" if small else "fastokens"
    assert (encode["name"], encode["reason"]) == (name, "canary equal")
    assert built == []  # the workers built and proved theirs; this process none
    one = _demo(tmp_path, demo_tokenizer, "reference")
    assert built == []
    assert len(_digests(two.out)) > 1 and _digests(two.out) == _digests(one)


def test_units_that_disagree_on_the_encoder_are_all_named() -> None:
    fast = {"name": "fastokens", "version": "1", "requested": "auto", "reason": "canary equal"}
    slow = {"name": "tokenizers", "version": "2", "requested": "auto", "reason": "text 3 differs"}
    assert backends.merged_entry([]) is None and backends.merged_entry([None]) is None
    assert backends.merged_entry([fast, None, fast]) == fast
    assert backends.merged_entry([fast, slow, fast]) == {
        **fast,
        "reason": "fastokens in 2 of 3 units, tokenizers in 1 of 3 units "
        "(tokenizers: text 3 differs)",
    }


def test_auto_without_fastokens_is_the_reference_and_says_so_once(
    tmp_path, demo_tokenizer, monkeypatch
):
    _uninstall(monkeypatch, "fastokens", "gigatoken")
    from packshard.demo import demo_data_path

    config = PackConfig.build(
        inputs=(str(demo_data_path()),),
        tokenizer=str(demo_tokenizer),
        out=str(tmp_path / "out"),
        max_seq_len=256,
        template="chatml",
    )
    result = pack_dataset(config)
    notes = [w for w in result.warnings if "--backend" in w]
    assert notes == [
        "--backend auto: encoding with tokenizers: fastokens is not installed "
        "(pip install 'packshard[fast]')"
    ]
    assert result.manifest["environment"]["backends"]["encode"]["name"] == "tokenizers"
    with pytest.raises(UsageError, match=r"^--backend fast: fastokens is not installed"):
        Encoder(load_tokenizer(str(demo_tokenizer)), "fast")


def _uninstall(monkeypatch, *names: str) -> None:
    real = backends.installed_version
    monkeypatch.setattr(
        backends, "installed_version", lambda name: None if name in names else real(name)
    )


def test_a_tokenizer_the_fast_encoders_cannot_model_falls_back(demo_tokenizer, monkeypatch):
    monkeypatch.setattr(backends, "fast_spec", lambda spec: None)
    bundle = load_tokenizer(str(demo_tokenizer))
    assert libraries(bundle) == ("fastokens", "gigatoken")  # byte-level BPE: fastokens first
    auto = Encoder(bundle, "auto")  # fastokens refused, gigatoken next
    assert auto.name == "gigatoken"
    assert auto.reason == (
        "fastokens cannot load this tokenizer: its SentencePiece prefix rule is not one "
        "packshard models; canary equal"
    )

    def broken(self, bundle):
        raise ValueError("unsupported model\nmore lines")

    monkeypatch.setattr(GigaEncoder, "__init__", broken)
    bundle = load_tokenizer(str(demo_tokenizer))
    auto = Encoder(bundle, "auto")
    assert auto.name == "tokenizers"
    assert auto.reason == (
        "fastokens cannot load this tokenizer: its SentencePiece prefix rule is not one "
        "packshard models; gigatoken cannot load this tokenizer: unsupported model"
    )
    with pytest.raises(UsageError, match="use --backend auto or reference"):
        Encoder(load_tokenizer(str(demo_tokenizer)), "fast")


def test_the_fastest_library_of_the_family_is_tried_first(demo_tokenizer, monkeypatch):
    bundle = load_tokenizer(str(demo_tokenizer))
    assert libraries(bundle) == ("fastokens", "gigatoken")
    _uninstall(monkeypatch, "fastokens")
    assert libraries(bundle) == ("gigatoken",)
    auto = Encoder(bundle, "auto")
    assert (auto.name, auto.reason) == ("gigatoken", "canary equal")
    assert auto.entry()["version"] == backends.installed_version("gigatoken")


def test_a_small_job_tries_the_library_built_soonest_first(demo_tokenizer, tmp_path):
    bundle = load_tokenizer(str(demo_tokenizer))  # byte-level BPE
    assert libraries(bundle, small_job=True) == ("gigatoken", "fastokens")
    small = backends.encoder_for(bundle, "auto", True)
    large = backends.encoder_for(bundle, "auto", False)
    assert (small.name, large.name) == ("gigatoken", "fastokens")  # decided apart, each once
    assert backends.encoder_for(bundle, "auto", True) is small
    assert backends.encoder_for(bundle, "auto") is large
    assert backends.decided(bundle, "auto", True) == {**small.entry(), "name": "gigatoken"}
    llama2 = load_tokenizer(str(BY_NAME["llama2-metaspace"].build(tmp_path)))
    # SentencePiece: gigatoken first at any size
    assert libraries(llama2) == libraries(llama2, small_job=True) == ("gigatoken", "fastokens")


def test_gigatoken_encodes_a_batch_into_flat_ids_without_awkward(demo_tokenizer):
    import subprocess
    import sys

    bundle = load_tokenizer(str(demo_tokenizer))
    texts = ["Hello world", "", "x" * 150, "<|im_start|>user\nHi<|im_end|>", "a b c " * 30]
    got = GigaEncoder(bundle).encode_batch(texts)
    want = bundle.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    assert [list(g.ids) for g in got] == [list(w.ids) for w in want]
    assert got.lengths.tolist() == [len(w.ids) for w in want] and got.ids.dtype == np.int32
    empty = GigaEncoder(bundle).encode_batch([])
    assert len(empty) == 0 and len(empty.ids) == 0
    # the batch calls would import awkward (about a second of start-up); encode_batch must not
    code = (
        "import sys\n"
        "from packshard.ingest.tokens.tokenizer import load_tokenizer\n"
        "from packshard.ingest.tokens.giga import GigaEncoder\n"
        f"GigaEncoder(load_tokenizer({str(demo_tokenizer)!r})).encode_batch(['Hi there'])\n"
        "import gigatoken\n"
        "assert 'awkward' not in sys.modules, 'awkward imported'\n"
        "gigatoken.Tokenizer.from_json(open(sys.argv[1]).read()).encode_batch_list(['a'])\n"
        "print('awkward' in sys.modules)\n"  # the control: the batch call imports it
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(demo_tokenizer / "tokenizer.json")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "True"


TEXTS = [
    "Hello world",
    " Hello",
    "▁Hello",
    "",
    "  two",
    "\nnewline first",
    "你好",
    "<s>",
    "<s>Hi",
    "<s> Hi",
    "</s>tail",
    "[INST] Hi [/INST] Yes</s>",
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<start_of_turn>user\nHi<end_of_turn>\n",
    "<|im_start|>user\nHi<|im_end|>\n",
    "<unk>x",
    "<s",
    "emoji 😀 and bytes \x00\x7f",
]


# fastokens 0.3.5 spells the literal text "<0x0A>" as the byte token where the imitations'
# vocabulary lacks "<": the canary holds that text, so auto keeps these off fastokens
CANARY_CATCHES = {"mistral", "llama2-metaspace", "gemma", "gemma-strict"}
SENTENCEPIECE = {"mistral-legacy", *CANARY_CATCHES}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_family_imitations_encode_as_the_reference_or_fall_back(tmp_path, family):
    bundle = load_tokenizer(str(family.build(tmp_path)))
    auto = Encoder(bundle, "auto")
    texts = TEXTS + canary_texts(bundle)
    # gigatoken models every imitation, Metaspace's prepend_scheme=always included
    assert first_difference(bundle, GigaEncoder(bundle), texts) is None
    if family.name in SENTENCEPIECE:
        assert libraries(bundle)[0] == "gigatoken"
        assert (auto.name, auto.reason) == ("gigatoken", "canary equal")
    else:
        assert libraries(bundle)[0] == "fastokens"
        assert (auto.name, auto.reason) == ("fastokens", "canary equal")
    if family.name == "mistral-legacy":  # Metaspace prepend_scheme=always: not modelled
        with pytest.raises(ValueError, match="prefix rule is not one packshard models"):
            FastEncoder(bundle)
        return
    where = first_difference(bundle, FastEncoder(bundle), texts)
    if family.name in CANARY_CATCHES:
        assert where is not None and "lower one eighth block" in where
    else:
        assert where is None


@pytest.mark.parametrize("family", sorted(CANARY_CATCHES))
def test_without_gigatoken_a_family_fastokens_fails_is_the_reference(tmp_path, family, monkeypatch):
    imitation = next(f for f in FAMILIES if f.name == family)
    bundle = load_tokenizer(str(imitation.build(tmp_path)))
    _uninstall(monkeypatch, "gigatoken")
    auto = Encoder(bundle, "auto")
    assert auto.name == "tokenizers"
    assert auto.reason.startswith("fastokens disagrees with tokenizers on the canary: text")


@pytest.mark.shared_data
@pytest.mark.parametrize("name", ["phi-3-mini", "phi-2", "qwen3"])
def test_shared_tokenizers_encode_as_the_reference(shared_data, name):
    bundle = load_tokenizer(str(shared_data / "tokenizers" / name))
    texts = list(TEXTS)
    for record in json.loads((shared_data / "chat" / "codealpaca_code_alpaca_2k.json").read_text()):
        texts += [record["output"], " " + record["instruction"], "<s>" + record["output"]]
    auto = Encoder(bundle, "auto")  # its encoder is the one compared (1.6 s a fastokens build)
    first = "gigatoken" if name == "phi-3-mini" else "fastokens"
    assert libraries(bundle)[0] == first and auto.name == first
    for library in libraries(bundle):
        assert first_difference(bundle, fast_encoder(bundle, library), texts) is None


def test_profile_says_once_that_auto_is_the_reference(demo_tokenizer, monkeypatch):
    from click.testing import CliRunner

    from packshard.cli import main
    from packshard.demo import demo_data_path

    _uninstall(monkeypatch, "fastokens", "gigatoken")
    args = ["profile", str(demo_data_path()), "-t", str(demo_tokenizer), "--max-seq-len", "256"]
    result = CliRunner().invoke(main, [*args, "--template", "chatml"])
    assert result.exit_code == 0, result.output
    assert result.output.count("--backend auto: encoding with tokenizers: fastokens is not") == 1
    bad = CliRunner().invoke(main, [*args, "--backend", "quick"])
    assert bad.exit_code == 2 and "'quick' is not one of 'auto', 'fast', 'reference'" in bad.output


@pytest.mark.parametrize("batch_size", [1, 7, 64, 1024])
def test_ingest_chunks_are_the_same_with_the_fast_encoder(demo_tokenizer, batch_size):
    """Chunks of every size (several encode parts per chunk included) hold the same arrays."""
    from packshard.demo import demo_data_path
    from packshard.ingest.read.sources import expand_inputs
    from packshard.ingest.stream import ingest
    from packshard.ingest.template.render import load_template
    from packshard.ingest.types import IngestOptions

    bundle = load_tokenizer(str(demo_tokenizer))
    template = load_template("chatml", bundle)
    files = expand_inputs([str(demo_data_path())])
    got = {}
    for backend in ("reference", "fast"):
        options = IngestOptions(batch_size=batch_size, backend=backend)
        chunks = list(ingest(files, bundle, template, options))
        got[backend] = [(c.batch.input_ids.tolist(), c.batch.labels.tolist()) for c in chunks]
    assert got["fast"] == got["reference"]
    assert len(got["fast"]) == -(-65 // batch_size)  # chunks count records, bad ones too


def test_the_prefix_rule_encodes_again_when_an_added_text_does_not_match(tmp_path):
    """A text starting with an added token's text that is not matched as the token (single_word)
    gets the prefix like any text: the guess from the first characters is checked on the ids."""
    from tokenizers import AddedToken

    from packshard.ingest.tokens.metaspace import MetaspaceEncoder, encode_flat

    folder = BY_NAME["llama2-metaspace"].build(tmp_path)
    bundle = load_tokenizer(str(folder))
    bundle.tokenizer.add_special_tokens([AddedToken("<w>", single_word=True, normalized=False)])
    texts = ["<w>abc", "<w> abc", "<w>", "abc <w> d", "<s>abc", "x<w>"]
    want = [e.ids for e in bundle.tokenizer.encode_batch(texts, add_special_tokens=False)]
    fast = FastEncoder(bundle)
    assert isinstance(fast._metaspace, MetaspaceEncoder)
    got = fast.encode_batch(texts)
    assert [list(got[i].ids) for i in range(len(texts))] == want
    plain = encode_flat(fast._tok, ["<w>abc"])  # without the rule: no prefix, other ids
    assert list(plain[0].ids) != want[0]


@pytest.mark.parametrize("scheme", ["first", "never"])
def test_spaces_a_stripping_added_token_swallows_are_left_to_the_reference(tmp_path, scheme):
    """Spaces are replaced by ``▁`` before fastokens sees them; where an lstrip or rstrip added
    token would swallow a space with its whitespace, the reference encodes the text."""
    from tokenizers import AddedToken

    from packshard.ingest.tokens import metaspace

    folder = BY_NAME["llama2-metaspace"].build(tmp_path)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["pre_tokenizer"]["prepend_scheme"] = scheme
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    bundle = load_tokenizer(str(folder))
    bundle.tokenizer.add_special_tokens(
        [
            AddedToken("<|user|>", rstrip=True, normalized=False),
            AddedToken("<|end|>", lstrip=True, rstrip=True, normalized=False),
        ]
    )
    texts = [
        "<|user|>\n Hi there",  # rstrip swallows "\n " in the reference
        "<|user|>\nHi there",  # "\n" only: no space swallowed, fastokens encodes it
        "<|user|>\t\n  x<|end|>\n",
        "a  <|end|>b",  # lstrip swallows the two spaces
        "a\u3000 <|end|> b <|user|>  c",
        "plain text, two  spaces",
        " leading space",
        "",
    ]
    want = [e.ids for e in bundle.tokenizer.encode_batch(texts, add_special_tokens=False)]
    fast = FastEncoder(bundle)
    aside: list[int] = []
    real = bundle.tokenizer.encode_batch_fast

    def counted(batch, **kwargs):
        aside.append(len(batch))
        return real(batch, **kwargs)

    fast._metaspace._reference = SimpleNamespace(encode_batch_fast=counted)
    got = fast.encode_batch(texts)
    assert [list(got[i].ids) for i in range(len(texts))] == want
    assert aside == [4]  # texts 0, 2, 3 and 4
    assert metaspace.fast_spec(json.loads(bundle.tokenizer.to_str())) is not None


def test_forced_fast_on_a_tokenizer_that_needs_offsets_stops_before_reading(
    tmp_path, word_tokenizer
):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "w2 w3"}\n')
    config = PackConfig.build(
        inputs=(str(data),),
        tokenizer=str(word_tokenizer),
        out=str(tmp_path / "out"),
        max_seq_len=8,
        backend="fast",
    )
    with pytest.raises(UsageError, match=r"labels need them \(use --backend auto or reference\)$"):
        pack_dataset(config)
    assert not (tmp_path / "out").exists()


def test_a_replaced_bundle_gets_its_own_encoder(demo_tokenizer):
    """``dataclasses.replace`` shares the cache dict; the encoder still follows the tokenizer."""
    import dataclasses

    from packshard.ingest.tokens.backends import encoder_for

    bundle = load_tokenizer(str(demo_tokenizer))
    fast = encoder_for(bundle, "auto")
    assert fast.name == "fastokens" and encoder_for(bundle, "auto") is fast
    no_aligner = dataclasses.replace(bundle, aligner=None)
    assert encoder_for(no_aligner, "auto").name == "tokenizers"
    assert encoder_for(bundle, "auto") is fast


def test_the_fast_encoders_json_round_trips_what_the_standard_library_reads():
    from packshard.ingest.tokens.metaspace import dump_json, load_json

    spec = {"pieces": ["▁é", "😀", "\x00\n"], "score": 1e-05, "flags": [None, True, 0]}
    assert json.loads(dump_json(spec)) == spec and load_json(dump_json(spec)) == spec
    assert "▁é" in dump_json(spec)  # non-ASCII as is, as json.dumps(ensure_ascii=False)
    huge = {"id": 2**70, "bad": "\ud800"}  # what orjson refuses goes through json
    assert load_json(dump_json(huge)) == huge
