"""The manifest: contents of a real pack, schema, hashing, atomic writes, version checks."""

from __future__ import annotations

import copy
import hashlib
import json
import platform
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packshard.digests import sha256_bytes, sha256_path
from packshard.errors import ManifestError
from packshard.format.manifest import (
    MANIFEST_NAME,
    build_manifest,
    compute_dataset_id,
    inline_refs,
    load_manifest,
    load_schema,
    manifest_text,
    manifest_validator,
    schema_errors,
    write_manifest,
)
from packshard.format.version import check_format_version
from packshard.options import AUTO_LOSS, FINAL_TURN_FORMATS


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def demo_pack(tmp_path, demo_tokenizer, run_pack):
    from packshard.demo import demo_data_path

    return run_pack(
        [demo_data_path()], demo_tokenizer, template="chatml", max_seq_len=256, shard_rows=6
    )


def test_manifest_of_a_demo_pack(demo_pack, demo_tokenizer):
    from packshard import __version__
    from packshard.demo import demo_data_path
    from packshard.ingest.template.render import CHATML
    from packshard.ingest.tokens.tokenizer import load_tokenizer

    m = demo_pack.manifest
    assert sorted(m) == [
        "config", "created_at", "dataset_id", "engine", "environment", "files", "format_version",
        "inputs", "loss", "packshard_version", "shards", "stats", "template", "tokenizer",
    ]  # fmt: skip
    assert m["format_version"] == 1 and m["packshard_version"] == __version__
    assert re.fullmatch(r"[0-9a-f]{32}", m["dataset_id"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", m["created_at"])
    assert m["config"] == {
        "max_seq_len": 256, "strategy": "bfd", "overlong": "drop", "loss": "auto",
        "position_ids": "reset", "seed": 0, "group_by_domain": False, "format": "auto",
        "domain_field": "domain", "compression": "zstd", "shard_rows": 6,
        "shard_bytes": 256 * 1024 * 1024, "plan_scope": "global", "reasoning": "train",
        "empty_reasoning": "train", "turns": "as_rendered",
        "reasoning_markers": ["<think>", "</think>"],
    }  # fmt: skip
    assert m["engine"] == {"name": "local", "workers": 1, "units": 1, "units_reused": 0}
    bundle = load_tokenizer(str(demo_tokenizer))
    assert m["tokenizer"] == {
        "path": str(demo_tokenizer),
        "resolved": str(demo_tokenizer.resolve()),
        "sha256": sha(demo_tokenizer / "tokenizer.json"),
        "vocab_size": bundle.tokenizer.get_vocab_size(with_added_tokens=True),
        "bos_token_id": None,
        "eos_token_id": bundle.tokenizer.token_to_id("<|im_end|>"),
        "pad_token_id": bundle.tokenizer.token_to_id("<|endoftext|>"),
    }
    assert m["template"] == {
        "source": "builtin:chatml",
        "sha256": hashlib.sha256(CHATML.encode("utf-8")).hexdigest(),
        "label_spans": "generation_tags",
        "reasoning_field": None,
    }
    data = demo_data_path()
    lines = data.read_text(encoding="utf-8").splitlines()
    assert m["inputs"] == [
        {
            "path": str(data),
            "resolved": str(data.resolve()),
            "sha256": sha(data),
            "records": sum(1 for x in lines if x.strip()),
        }
    ]
    assert m["files"] == {
        "examples": {"path": "examples.parquet", "sha256": sha(demo_pack.out / "examples.parquet")},
        "rejects": {"path": "rejects.jsonl", "sha256": sha(demo_pack.out / "rejects.jsonl")},
        "card": {"path": "README.md", "sha256": sha(demo_pack.out / "README.md")},
    }
    assert [s["path"] for s in m["shards"]] == [
        f"shard-{k:05d}.parquet" for k in range(len(m["shards"]))
    ]
    assert sum(s["rows"] for s in m["shards"]) == m["stats"]["rows"]
    assert all(0 < s["rows"] <= 6 for s in m["shards"])
    # --loss auto, resolved per record format: the demo has every format, one text record
    # (trained on all) and one prompt/completion record (trained on its completion)
    assert m["loss"] == {
        "option": "auto",
        "by_format": {k: v for k, v in AUTO_LOSS.items() if k not in FINAL_TURN_FORMATS},
        "examples_by_policy": {"all": 1, "assistant": m["stats"]["examples"] - 2, "completion": 1},
    }
    # the environment that made it: Python, the content libraries, the template conventions
    from importlib.metadata import version

    env = m["environment"]
    assert env["python"] == platform.python_version()
    assert env["libraries"] == {
        name: version(name)
        for name in ("tokenizers", "jinja2", "markupsafe", "pyarrow", "numpy", "numba")
    }
    assert env["template_conventions"]["id"] == "hf-chat-template/1"
    assert (
        "tojson: ensure_ascii=False, keys in given order, no HTML escaping"
        in (env["template_conventions"]["rules"])
    )


def test_manifest_stats(demo_pack):
    stats = demo_pack.manifest["stats"]
    assert set(stats["ordering"]) == {
        "segments_per_row_mean",
        "first_decile_mean_example_len",
        "last_decile_mean_example_len",
    }
    assert stats["ordering"]["segments_per_row_mean"] == round(stats["examples"] / stats["rows"], 4)
    # bfd fills rows longest first: the first rows hold the longest examples
    ordering = stats["ordering"]
    assert ordering["first_decile_mean_example_len"] > ordering["last_decile_mean_example_len"]
    domains = stats["domains"]
    assert sum(d["token_share_in"] for d in domains.values()) == pytest.approx(1, abs=1e-5)
    assert sum(d["token_share_out"] for d in domains.values()) == pytest.approx(1, abs=1e-5)
    for d in domains.values():
        assert d["token_share_out"] == round(d["tokens"] / stats["tokens"], 6)
    assert stats["rejects_by_code"] == {"invalid_json": 1}
    assert 0 < stats["fill_rate"] <= 1


def test_manifest_file_is_sorted_and_complete(demo_pack):
    text = (demo_pack.out / "manifest.json").read_text(encoding="utf-8")
    assert (
        text == json.dumps(demo_pack.manifest, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    )
    assert load_manifest(demo_pack.out) == demo_pack.manifest


BROKEN = [
    (lambda m: m.pop("dataset_id"), "(root): 'dataset_id' is a required property"),
    (lambda m: m["shards"][0].update(sha256="XYZ"), "shards/0/sha256: 'XYZ' does not match"),
    (lambda m: m["shards"][0].update(path="../evil.parquet"), "shards/0/path: "),
    (lambda m: m["shards"][0].update(path="/abs.parquet"), "shards/0/path: "),
    (lambda m: m["stats"].update(fill_rate=1.5), "stats/fill_rate: 1.5 is greater than the max"),
    (lambda m: m["config"].update(strategy="best"), "config/strategy: 'best' is not one of"),
    (
        lambda m: m["stats"]["domains"]["chat"].pop("records"),
        "stats/domains/chat: 'records' is a required property",
    ),
    (lambda m: m["stats"].update(rows=-1), "stats/rows: -1 is less than the minimum of 0"),
    (lambda m: m["loss"].pop("by_format"), "loss: 'by_format' is a required property"),
    (lambda m: m["loss"].update(option="most"), "loss/option: 'most' is not one of"),
    (lambda m: m["loss"]["by_format"].update(text="auto"), "loss/by_format/text: 'auto' is not"),
    (lambda m: m["environment"].pop("python"), "environment: 'python' is a required property"),
    (
        lambda m: m["environment"]["libraries"].update(numpy=2),
        "environment/libraries/numpy: 2 is not of type",
    ),
    (
        lambda m: m["environment"]["template_conventions"].pop("id"),
        "environment/template_conventions: 'id' is a required property",
    ),
]


def test_a_manifest_without_an_environment_is_still_format_1(demo_pack):
    older = copy.deepcopy(demo_pack.manifest)
    del older["environment"]  # written before packshard recorded one: an additive key
    assert schema_errors(older) == []


@pytest.mark.parametrize(("edit", "message"), BROKEN)
def test_schema_rejects_broken_manifests(demo_pack, edit, message):
    broken = copy.deepcopy(demo_pack.manifest)
    edit(broken)
    errors = schema_errors(broken)
    assert len(errors) == 1 and errors[0].startswith(f"manifest.json: {message}"), errors


def test_inlined_references_report_what_the_schema_itself_reports(demo_pack):
    import jsonschema

    raw = jsonschema.Draft202012Validator(load_schema())
    for edit, _ in BROKEN:
        broken = copy.deepcopy(demo_pack.manifest)
        edit(broken)
        broken["files"]["card"].pop("sha256")  # a $ref beside a description too
        expected = sorted((list(e.absolute_path), e.message) for e in raw.iter_errors(broken))
        found = sorted(
            (list(e.absolute_path), e.message) for e in manifest_validator().iter_errors(broken)
        )
        assert found == expected and len(found) == 2
    assert "$ref" not in json.dumps(inline_refs(load_schema(), load_schema()["$defs"]))


def test_load_manifest_refuses_missing_and_unknown_versions(tmp_path, demo_pack):
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path / "nowhere")
    assert str(info.value) == (
        f"{tmp_path / 'nowhere' / 'manifest.json'}: no manifest (is {tmp_path / 'nowhere'} a "
        "packshard output folder? a run that was interrupted leaves none: pack again)"
    )
    newer = dict(demo_pack.manifest, format_version=2)
    write_manifest(tmp_path, newer)
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path)
    assert str(info.value) == (
        f"{tmp_path / 'manifest.json'}: format_version 2 is not supported by this packshard "
        "(supports 1); upgrade packshard or re-pack the data"
    )
    with pytest.raises(ManifestError, match=r"format_version is '1', expected an integer"):
        check_format_version("1", "x")
    with pytest.raises(ManifestError, match=r"format_version is True, expected an integer"):
        check_format_version(True, "x")


def test_write_manifest_atomic_and_hashes(tmp_path):
    write_manifest(tmp_path, {"b": 1, "a": {"d": "é", "c": [2, 1]}})
    path = tmp_path / MANIFEST_NAME
    assert path.read_text(encoding="utf-8") == (
        '{\n  "a": {\n    "c": [\n      2,\n      1\n    ],\n    "d": "é"\n  },\n  "b": 1\n}\n'
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]  # no temporary left
    assert sha256_path(path, chunk=3) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert sha256_bytes(path.read_bytes()) == sha256_path(path)


def stdlib_text(value) -> str:
    return json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False)


LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(codec="utf-8"), max_size=8)
)
TREES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(alphabet=st.characters(codec="utf-8"), max_size=6), inner, max_size=4
        )
    ),
    max_leaves=24,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=6), TREES, max_size=5))
def test_manifest_text_is_the_standard_librarys_text(tree):
    assert manifest_text(tree) == stdlib_text(tree)


def test_manifest_text_of_a_real_pack_and_its_unusual_values(demo_pack):
    text = (demo_pack.out / MANIFEST_NAME).read_text(encoding="utf-8")
    assert manifest_text(demo_pack.manifest) + "\n" == text
    # what it leaves to the library: the library's text, or the library's error
    odd = {"nan": float("nan"), "inf": [float("-inf")], "t": (1, "\u2028", "\x00"), 3: "k"}
    with pytest.raises(TypeError):
        stdlib_text(odd)  # int and str keys do not sort together
    with pytest.raises(TypeError):
        manifest_text(odd)
    del odd[3]
    odd[True] = {2: 1.5}  # a bool key, nested int keys
    with pytest.raises(TypeError):
        manifest_text(odd)
    del odd[True]
    odd["n"] = {2: 1.5, 1: None}
    assert manifest_text(odd) == stdlib_text(odd)
    assert "NaN" in manifest_text(odd) and "-Infinity" in manifest_text(odd)

    class Count(int):
        pass

    assert manifest_text({"c": Count(3), "e": {}, "l": []}) == stdlib_text(
        {"c": 3, "e": {}, "l": []}
    )
    with pytest.raises(TypeError, match="not JSON serializable"):
        manifest_text({"a": {1, 2}})
    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(ValueError, match="Circular reference"):
        manifest_text(loop)


def test_build_manifest_holds_the_blocks_and_the_version(demo_pack):
    m = demo_pack.manifest
    names = ("config", "tokenizer", "template", "stats", "files", "loss", "engine", "environment")
    blocks = {k: m[k] for k in names}
    built = build_manifest(
        dataset_id=m["dataset_id"], inputs=m["inputs"], shards=m["shards"], **blocks
    )
    assert {k: v for k, v in built.items() if k != "created_at"} == {
        k: v for k, v in m.items() if k != "created_at"
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", built["created_at"])
    assert schema_errors(built) == []


def test_dataset_id_depends_on_config_and_inputs_only():
    config = {"max_seq_len": 8, "seed": 0}
    prints = {"inputs": ["a" * 64], "tokenizer": "b" * 64}
    one = compute_dataset_id(config, prints)
    assert one == compute_dataset_id(dict(reversed(config.items())), dict(prints))
    assert len(one) == 32
    assert one != compute_dataset_id({**config, "seed": 1}, prints)
    assert one != compute_dataset_id(config, {**prints, "inputs": ["c" * 64]})
