"""The engine path gives the single-process output byte for byte, survives faults, resumes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from packshard.engine import TaskFailed
from packshard.errors import RecordError
from packshard.pack import PackConfig, pack_dataset
from packshard.pack.units.scale import work_folder
from tests.helpers import StartingEngine, check_pack_output, output_digests, scale_inputs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[Path]:
    return scale_inputs(tmp_path_factory.mktemp("scale_inputs"))


@pytest.fixture(scope="module")
def tokenizer(packed_demo_tokenizer) -> Path:
    return packed_demo_tokenizer


def pack(inputs, tokenizer, out: Path, **options) -> dict:
    settings = {"max_seq_len": 256, "template": "chatml", "shard_rows": 5, "batch_size": 7}
    settings.update(options)
    config = PackConfig.build(
        inputs=tuple(map(str, inputs)), tokenizer=str(tokenizer), out=str(out), **settings
    )  # type: ignore[arg-type]
    return pack_dataset(config).manifest


SPLIT = 8000  # bytes per unit: 6 byte ranges of chat.jsonl, 2 of rows.parquet, array.json whole


def units(inputs) -> list:
    from packshard.ingest.read.sources import expand_inputs
    from packshard.ingest.read.units import plan_units

    return plan_units(expand_inputs([str(p) for p in inputs]), SPLIT)


VARIANTS = {
    "bfd": {},
    "wrapped": {"strategy": "wrapped"},
    "split": {"overlong": "split"},
    "truncate-by-domain": {"overlong": "truncate", "group_by_domain": True},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_two_local_workers_write_the_same_bytes_as_one_process(
    inputs, tokenizer, tmp_path, variant
):
    options = VARIANTS[variant]
    one = pack(inputs, tokenizer, tmp_path / "one", **options)
    two = pack(inputs, tokenizer, tmp_path / "two", workers=2, split_bytes=SPLIT, **options)
    # one unit: the three small inputs gathered; nine: chat.jsonl's six ranges, two of
    # rows.parquet, array.json whole
    assert one["engine"] == {"name": "local", "workers": 1, "units": 1, "units_reused": 0}
    assert two["engine"] == {"name": "local", "workers": 2, "units": 9, "units_reused": 0}
    assert output_digests(tmp_path / "one") == output_digests(tmp_path / "two")
    assert {k: v for k, v in one.items() if k not in ("created_at", "engine")} == {
        k: v for k, v in two.items() if k not in ("created_at", "engine")
    }
    assert one["stats"]["rejected"] >= 2 and one["stats"]["domains"]
    check_pack_output(tmp_path / "two")
    assert not work_folder(tmp_path / "two").exists()  # removed once published


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_ray_writes_the_same_bytes_as_one_process(inputs, tokenizer, tmp_path, ray_cluster):
    pack(inputs, tokenizer, tmp_path / "one", overlong="split")
    ray = pack(
        inputs, tokenizer, tmp_path / "ray", overlong="split", engine="ray", split_bytes=SPLIT
    )
    assert ray["engine"]["name"] == "ray" and ray["engine"]["units"] == 9
    assert output_digests(tmp_path / "one") == output_digests(tmp_path / "ray")


def test_a_unit_that_keeps_failing_fails_the_job_and_resume_finishes_it(
    inputs, tokenizer, tmp_path, monkeypatch
):
    whole = pack(inputs, tokenizer, tmp_path / "whole")
    out = tmp_path / "out"
    second = units(inputs)[1].ranges[0]  # a byte range of chat.jsonl: a unit of its own
    assert second.describe() == f"{inputs[0]} bytes {second.start}–{second.stop}"
    monkeypatch.setenv("PACKSHARD_FAULTS", f"raise:bytes {second.start}–:9")
    with pytest.raises(TaskFailed) as err:
        pack(inputs, tokenizer, out, workers=2, split_bytes=SPLIT)
    assert str(err.value).startswith(f"{second.describe()}: failed 3 times (OSError: rehearsed")
    assert not out.exists()  # nothing that looks complete
    assert not list(tmp_path.glob(".out.partial-*"))
    done = {p.parent.name for p in work_folder(out).glob("*/unit.json")}
    assert len(done) == 8 and second.name not in done  # every other unit is kept
    monkeypatch.delenv("PACKSHARD_FAULTS")
    resumed = pack(inputs, tokenizer, out, workers=2, split_bytes=SPLIT, resume=True)
    assert resumed["engine"] == {"name": "local", "workers": 2, "units": 9, "units_reused": 8}
    assert output_digests(out) == output_digests(tmp_path / "whole")
    assert resumed["dataset_id"] == whole["dataset_id"]


def test_a_worker_that_dies_once_is_retried_with_the_same_bytes(
    inputs, tokenizer, tmp_path, monkeypatch
):
    pack(inputs, tokenizer, tmp_path / "whole")
    monkeypatch.setenv("PACKSHARD_FAULTS", "crash:bytes 0–:1,raise:shard-00001:1")
    pack(inputs, tokenizer, tmp_path / "out", workers=2, split_bytes=SPLIT)
    assert output_digests(tmp_path / "out") == output_digests(tmp_path / "whole")


def test_a_shard_that_cannot_be_written_fails_the_job(inputs, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("PACKSHARD_FAULTS", "raise:shard-00002:9")
    with pytest.raises(TaskFailed, match=r"^shard-00002\.parquet: failed 3 times"):
        pack(inputs, tokenizer, tmp_path / "out", workers=2, split_bytes=SPLIT)
    assert not (tmp_path / "out").exists()


def test_a_resume_with_other_options_starts_afresh(inputs, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("PACKSHARD_FAULTS", "raise:array.json:9")
    with pytest.raises(TaskFailed):
        pack(inputs, tokenizer, tmp_path / "out", workers=2, split_bytes=SPLIT)
    monkeypatch.delenv("PACKSHARD_FAULTS")
    options = {"workers": 2, "split_bytes": SPLIT, "resume": True, "max_seq_len": 200}
    again = pack(inputs, tokenizer, tmp_path / "out", **options)
    assert again["engine"]["units_reused"] == 0


def test_on_error_fail_names_the_absolute_line(inputs, tokenizer, tmp_path):
    with pytest.raises(RecordError) as one:
        pack(inputs, tokenizer, tmp_path / "one", on_error="fail")
    with pytest.raises(RecordError) as two:
        pack(inputs, tokenizer, tmp_path / "two", on_error="fail", workers=2, split_bytes=SPLIT)
    assert str(one.value) == str(two.value)
    assert str(two.value).startswith(f"{inputs[0]}:")


def test_plan_scope_group_is_recorded_and_costs_few_rows(inputs, tokenizer, tmp_path):
    whole = pack(inputs, tokenizer, tmp_path / "global")
    grouped = pack(inputs, tokenizer, tmp_path / "group", plan_scope="group:20")
    pack(inputs, tokenizer, tmp_path / "two", plan_scope="group:20", workers=2, split_bytes=SPLIT)
    assert grouped["config"]["plan_scope"] == "group:20"
    assert whole["config"]["plan_scope"] == "global"
    assert grouped["dataset_id"] != whole["dataset_id"]
    groups = -(-whole["stats"]["examples"] // 20)  # each group may leave one row part-filled
    assert whole["stats"]["rows"] <= grouped["stats"]["rows"] <= whole["stats"]["rows"] + groups
    assert grouped["stats"]["tokens"] == whole["stats"]["tokens"]
    check_pack_output(tmp_path / "group")
    assert output_digests(tmp_path / "group") == output_digests(tmp_path / "two")


@pytest.mark.parametrize("turns", ["as_rendered", "expand"])
def test_reasoning_turns_on_workers_write_the_same_bytes(tmp_path, turns):
    """Reasoning records, history reasoning the template drops, one example per turn on expand:
    the units' turns, record counts and dropped-reasoning counts merge as one process makes them.
    """
    from tests.helpers import THINK, answer, build_qwen, chat, user, write_jsonl

    template = tmp_path / "think.jinja"
    template.write_text(THINK, encoding="utf-8")
    records = [
        chat(
            user(f"{k}+{k}?"),
            answer(f"{2 * k}", reasoning="Add."),
            user(f"{k}*{k}?"),
            answer(f"{k * k}", reasoning="Multiply."),
        )
        for k in range(40)
    ]
    data = write_jsonl(tmp_path / "r.jsonl", records)
    qwen = build_qwen(tmp_path / "qwen")
    settings = {"template": str(template), "turns": turns, "batch_size": 7, "shard_rows": 4}
    one = pack([data], qwen, tmp_path / "one", **settings)
    two = pack([data], qwen, tmp_path / "two", workers=2, split_bytes=1500, **settings)
    assert two["engine"]["units"] > 2
    assert output_digests(tmp_path / "one") == output_digests(tmp_path / "two")
    assert one["stats"] == two["stats"]
    expected_examples = 80 if turns == "expand" else 40
    assert one["stats"]["examples"] == expected_examples
    assert one["stats"]["reasoning_dropped"] == (0 if turns == "expand" else 40)


@pytest.mark.parametrize("broken", ["tokenizer", "template"])
def test_a_tokenizer_or_template_that_cannot_load_fails_as_one_process_does(
    inputs, tokenizer, tmp_path, broken
):
    """The driver loads them while the workers map: its error still comes first, word for
    word the one-process error, and no work folder is left beside OUT."""
    from packshard.errors import TemplateError, TokenizerError

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text('{"model": {"type": "nothing"}}', encoding="utf-8")
    (bad / "template.jinja").write_text("{% for m in messages %}", encoding="utf-8")
    options = (
        {"tokenizer": bad}
        if broken == "tokenizer"
        else {"tokenizer": tokenizer, "template": str(bad / "template.jinja")}
    )
    error = TokenizerError if broken == "tokenizer" else TemplateError
    messages = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        with pytest.raises(error) as caught:
            pack(
                inputs,
                options.get("tokenizer"),
                out,
                workers=workers,
                split_bytes=SPLIT,
                **{k: v for k, v in options.items() if k != "tokenizer"},
            )
        messages.append(str(caught.value))
        assert not out.exists() and not work_folder(out).exists()
    assert messages[0] == messages[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]


@pytest.mark.parametrize("workers", [1, 3])
def test_inputs_are_hashed_in_a_few_runs_each_file_its_own_digest(tmp_path, workers) -> None:
    from packshard.digests import sha256_path
    from packshard.engine import EngineOptions, open_engine
    from packshard.ingest.read.sources import InputFile
    from packshard.pack.units.scale import HASH_TASKS, hash_inputs

    files = []
    for i, size in enumerate([5, 0, 4000, 17, 17, 900, 3, 1, 250, 6000, 2]):
        path = tmp_path / f"in{i}.jsonl"
        path.write_bytes(bytes([i]) * size)
        files.append(InputFile(str(path), path))
    calls: list[int] = []
    with open_engine(EngineOptions(workers=1)) as engine:
        real = engine.run

        def counted(fn, args, keys, **kwargs):
            calls.append(len(args))
            return real(fn, args, keys, **kwargs)

        engine.run = counted  # type: ignore[method-assign]
        engine.workers = workers  # type: ignore[misc]
        met: list[int] = []
        digests = hash_inputs(engine, files, meanwhile=lambda: met.append(1))
        assert digests == [sha256_path(f.real) for f in files]
    # an engine that is up: the driver's thread may have taken a file or two before it heard
    assert not met and len(calls) <= 1 and (not calls or calls[0] <= HASH_TASKS * workers)


@pytest.mark.parametrize("polls", [0, 1, 1000])
def test_the_driver_hashes_while_its_workers_start_and_hands_them_the_rest(tmp_path, polls):
    """Workers starting: the driver hashes (and loads, once) meanwhile; up: they hash the rest.

    With workers that stay starting, the driver hashes every file and no task is sent; with
    workers up at once, the digests are the same whoever computed which.
    """
    from packshard.digests import sha256_path
    from packshard.ingest.read.sources import InputFile
    from packshard.pack.units.scale import hash_inputs

    files = []
    for i in range(40):
        path = tmp_path / f"in{i}.jsonl"
        path.write_bytes(bytes([i]) * (i * 997))
        files.append(InputFile(str(path), path))
    files.append(InputFile("gone.jsonl", tmp_path / "gone.jsonl"))  # a worker's task reports it
    engine, met = StartingEngine(polls), []
    with pytest.raises(FileNotFoundError, match=r"gone\.jsonl"):
        hash_inputs(engine, files, meanwhile=lambda: met.append(1))  # type: ignore[arg-type]
    assert engine.runs == 1  # the unreadable file went to the workers, whoever hashed the rest
    files.pop()
    engine, met = StartingEngine(polls), []
    digests = hash_inputs(engine, files, meanwhile=lambda: met.append(1))  # type: ignore[arg-type]
    assert digests == [sha256_path(f.real) for f in files]
    assert met == ([1] if polls else [])
    if polls == 1000:
        assert engine.runs == 0


def test_the_driver_leaves_the_file_in_hand_to_the_workers_once_they_are_up(tmp_path, monkeypatch):
    """A large file: the driver stops within a chunk, not at the file's end; same digests.

    The driver's hash waits a little at each chunk, so that 64 chunks outlast the workers'
    start however fast the machine hashes.
    """
    from packshard.digests import CHUNK, sha256_path
    from packshard.ingest.read.sources import InputFile
    from packshard.pack.units import scale
    from packshard.pack.units.scale import hash_inputs

    def slowly(path, until=None):
        if until is None:  # not the driver's own hash
            return sha256_path(path)
        return sha256_path(path, until=lambda: time.sleep(0.004) or until())

    monkeypatch.setattr(scale, "sha256_path", slowly)

    big = tmp_path / "big.jsonl"
    big.write_bytes(b"x" * (64 * CHUNK))
    small = tmp_path / "small.jsonl"
    small.write_bytes(b"y" * 10)
    files = [InputFile(str(big), big), InputFile(str(small), small)]
    engine, met = StartingEngine(1), []
    sent: list[list[str]] = []
    real = engine.run

    def run(fn, args, keys, **kwargs):
        sent.extend(args)
        return real(fn, args, keys, **kwargs)

    engine.run = run  # type: ignore[method-assign]
    digests = hash_inputs(engine, files, meanwhile=lambda: met.append(1))  # type: ignore[arg-type]
    assert digests == [sha256_path(big), sha256_path(small)]
    assert [p for run_ in sent for p in run_] == [str(big), str(small)]  # big left mid-file


def test_a_hash_stops_after_the_chunk_where_it_is_told_to():
    import pytest as _pytest

    from packshard.digests import sha256_path

    asked: list[int] = []

    def until() -> bool:
        asked.append(1)
        return len(asked) == 3

    with _pytest.raises(InterruptedError, match="hashing stopped"):
        sha256_path(__file__, chunk=64, until=until)
    assert len(asked) == 3
    assert sha256_path(__file__, chunk=64, until=lambda: False) == sha256_path(__file__)


def small_inputs(folder: Path, count: int) -> list[Path]:
    """``count`` small JSONL files (each its own domain), some with a bad line."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(count):
        lines = [f'{{"text": "file {k} record {j} " }}' for j in range(1 + k % 3)]
        if k % 4 == 1:
            lines.insert(1, "not json")
        path = folder / f"small-{k:02d}.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def test_small_inputs_gathered_in_one_unit_write_the_bytes_of_a_unit_each(tokenizer, tmp_path):
    files = small_inputs(tmp_path / "in", 12)
    gathered = pack(files, tokenizer, tmp_path / "gathered")
    apart = pack(files, tokenizer, tmp_path / "apart", workers=2, split_bytes=1)
    assert gathered["engine"]["units"] == 1 and apart["engine"]["units"] == 27  # a line each
    assert output_digests(tmp_path / "gathered") == output_digests(tmp_path / "apart")
    assert {k: v for k, v in gathered.items() if k not in ("created_at", "engine")} == {
        k: v for k, v in apart.items() if k not in ("created_at", "engine")
    }
    assert gathered["stats"]["rejected"] == 3 and len(gathered["stats"]["domains"]) == 12
    check_pack_output(tmp_path / "gathered")


def test_a_gathered_unit_is_kept_for_resume_and_reused(tokenizer, tmp_path, monkeypatch):
    files = small_inputs(tmp_path / "in", 6)
    big = tmp_path / "in" / "zbig.jsonl"
    big.write_text("".join(f'{{"text": "big record {j}"}}\n' for j in range(200)), "utf-8")
    inputs = [*files, big]
    whole = pack(inputs, tokenizer, tmp_path / "whole")
    out = tmp_path / "out"
    monkeypatch.setenv("PACKSHARD_FAULTS", "raise:zbig.jsonl bytes 0–:9")
    with pytest.raises(TaskFailed):
        pack(inputs, tokenizer, out, workers=2, split_bytes=2000)
    done = {p.parent.name for p in work_folder(out).glob("*/unit.json")}
    assert "00000-inputs-00005" in done  # the six small files, gathered
    monkeypatch.delenv("PACKSHARD_FAULTS")
    resumed = pack(inputs, tokenizer, out, workers=2, split_bytes=2000, resume=True)
    assert resumed["engine"]["units_reused"] == len(done) >= 2
    assert output_digests(out) == output_digests(tmp_path / "whole")
    assert resumed["dataset_id"] == whole["dataset_id"]


def test_gathered_inputs_number_their_records_as_units_apart_do(tokenizer, tmp_path):
    """Records at line 1 of consecutive gathered files are two records: the ids of the units
    after them, and so the seeded eval draw by record, are those of a unit per input."""
    files = small_inputs(tmp_path / "in", 9)
    big = tmp_path / "in" / "zbig.jsonl"
    big.write_text("".join(f'{{"text": "big record {j}"}}\n' for j in range(120)), "utf-8")
    inputs, options = [*files, big], {"eval_fraction": 0.3, "batch_size": 64}
    gathered = pack(inputs, tokenizer, tmp_path / "gathered", split_bytes=2000, **options)
    apart = pack(inputs, tokenizer, tmp_path / "apart", split_bytes=1, **options)
    assert gathered["engine"]["units"] < apart["engine"]["units"]
    assert output_digests(tmp_path / "gathered") == output_digests(tmp_path / "apart")
