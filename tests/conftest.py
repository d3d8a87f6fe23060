"""Shared fixtures (helpers that are not fixtures live in :mod:`tests.helpers`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

# One intra-op torch thread in every test process and in the CLI runs the tests start: the suite
# runs two workers on two cores, and with both cores busy each worker's spinning second thread
# made the model tests up to twice as slow (test_evaluate, verify/test_run, test_seams and
# test_collate under -n 2: 81 s -> 38 s wall, 88 -> 44 CPU-s; on an idle machine about equal).
# torch takes its default from MKL_NUM_THREADS when set; Arrow's pool does not read it
# (OMP_NUM_THREADS would also shrink that).  Set before anything imports torch; a value given
# outside wins.
os.environ.setdefault("MKL_NUM_THREADS", "1")

from tests.helpers import (
    SHARED_DATA,
    SHARED_SKIP,
    WORD_VOCAB,
    PackOutput,
    check_pack_output,
    pack_demo_into,
    pack_marked_examples,
    write_jsonl,
)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of real tokenizers and chat datasets; skip when this checkout has none."""
    if not (SHARED_DATA / "tokenizers").is_dir():
        pytest.skip(f"{SHARED_SKIP} {SHARED_DATA} (kept outside the repository)")
    return SHARED_DATA


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line at the end: how many tests skipped for want of the real data, and the fix."""
    if line := shared_skip_line(terminalreporter.stats.get("skipped", [])):
        terminalreporter.write_line(line, yellow=True, bold=True)


def shared_skip_line(skipped: list[Any]) -> str | None:
    """The summary line for the skipped reports that lacked :data:`SHARED_DATA` (None: none)."""
    count = sum(SHARED_SKIP in str(getattr(r, "longrepr", "")) for r in skipped)
    if not count:
        return None
    return (
        f"{count} test(s) skipped: the real tokenizers and datasets are not at {SHARED_DATA} "
        "(the transformers parity on real tokenizers among them); to run them, put that folder "
        "there or set PACKSHARD_SHARED_DATA=/path/to/data. Parity on the committed fixture "
        "tokenizer ran without it (tests/ingest/test_parity_fixture.py)."
    )


# --- pack: hermetic tokenizers and a checked runner -------------------------------------------


@pytest.fixture(scope="session")
def demo_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The offline demo BPE (ChatML special tokens), trained once per session."""
    from packshard.demo import build_demo_tokenizer

    return build_demo_tokenizer(tmp_path_factory.mktemp("demo_tokenizer"))


@pytest.fixture(scope="session")
def word_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer whose token ``wN`` has id N and ``<eos>`` id 0.

    A ``text`` record ``"w5 w6 w7"`` encodes to ``[5, 6, 7, 0]`` (text + EOS, every token a
    target), so packs can be computed by hand.
    """
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    folder = tmp_path_factory.mktemp("word_tokenizer")
    tok = Tokenizer(models.WordLevel(vocab=WORD_VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken("<eos>", special=True, normalized=False)])
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<eos>", "add_bos_token": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.fixture
def run_pack(tmp_path: Path) -> Any:
    """Pack with :func:`packshard.pack.pack_dataset` and check the output (see helpers)."""
    from packshard.pack import PackConfig, pack_dataset

    def run(inputs: list[Path | str], tokenizer: Path | str, out: Path | None = None,
            **options: Any) -> PackOutput:  # fmt: skip
        out = out if out is not None else tmp_path / "out"
        config = PackConfig.build(
            inputs=tuple(str(p) for p in inputs), tokenizer=str(tokenizer), out=str(out), **options
        )
        result = pack_dataset(config)
        assert result.out == out
        packed = check_pack_output(out)
        assert packed.manifest == result.manifest
        return packed

    return run


@pytest.fixture
def make_jsonl() -> Any:
    """The :func:`tests.helpers.write_jsonl` helper, as a fixture."""
    return write_jsonl


# --- packed demo folders for the verify / inspect / CLI tests ---------------------------------


@pytest.fixture(scope="session")
def packed_demo_tokenizer(tmp_path_factory) -> Path:
    """The offline demo BPE (vocabulary 1,024), trained once per session."""
    from packshard.demo import build_demo_tokenizer

    return build_demo_tokenizer(tmp_path_factory.mktemp("packed_demo_tok"))


@pytest.fixture(scope="session")
def packed_demo(tmp_path_factory, packed_demo_tokenizer) -> Path:
    """A good ``pack`` output of the demo chats: 256-token rows, 4 rows per shard (4 shards).

    Never modify it: tests that corrupt a folder take ``packed_demo_copy``.
    """
    return pack_demo_into(tmp_path_factory.mktemp("packed_demo"), packed_demo_tokenizer)


@pytest.fixture
def packed_demo_copy(packed_demo, tmp_path) -> Path:
    """A private copy of ``packed_demo`` for a test to corrupt."""
    return Path(shutil.copytree(packed_demo, tmp_path / "out"))


@pytest.fixture
def check_pack() -> Any:
    """The :func:`tests.helpers.check_pack_output` helper, as a fixture."""
    return check_pack_output


@pytest.fixture(scope="module")
def torch_one_thread() -> Any:
    """One intra-op torch thread: on two shared cores, two spinning threads ran 8x slower."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


# --- one local Ray cluster for the whole test run -----------------------------------------------


@pytest.fixture(scope="session")
def ray_cluster() -> Any:
    """A 2-CPU local Ray cluster, started once per test process (tests marked ``ray``)."""
    import os

    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        object_store_memory=128 * 1024 * 1024,
        _temp_dir="/tmp/packshard-ray-tests",
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def marked_pack(tmp_path_factory, word_tokenizer) -> Path:
    """58 examples, each starting with its own marker token, in 16 rows over 3 shards.

    The trainer tests find every fed example by its marker (:class:`tests.helpers.LossProbe`).
    """
    return pack_marked_examples(tmp_path_factory.mktemp("marked"), word_tokenizer)
