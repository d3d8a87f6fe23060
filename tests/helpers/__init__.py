"""Helpers shared by test modules, by subject (no fixtures: those live in ``conftest.py``).

Each module holds one subject; every public name is exported here too, so a test imports
``from tests.helpers import …`` whatever module holds it:

* ``paths``: :data:`REPO`, :data:`SHARED_DATA` (the real third-party data beside the
  repository, skipped when absent);
* ``data``: in-memory values (:func:`make_spill`, :func:`write_jsonl`, :func:`conversation`,
  :func:`span_texts`, :func:`small_profile`);
* ``packs``: a finished pack read back and checked (:class:`PackOutput`,
  :func:`check_pack_output`, :func:`pack_demo_into`);
* ``tokenizers``, ``templates``, ``records``: hermetic tokenizers (:func:`build_tokenizer`,
  the model-family imitations of ``tests/ingest/test_families.py``), their templates and
  records (:data:`FAMILIES`);
* ``engines``: work-unit inputs, output digests and engine tasks;
* ``trainers``: a pack whose examples can be told apart, a tiny Llama, :class:`LossProbe`;
* ``folders``: hand-made output folders for the reader (:func:`write_out`);
* ``exports``: the (context -> target) pairs a trainer trains on;
* ``contract``: the pinned fixture packs (:data:`FIXTURE_PACKS`, ``tests/test_contract.py``,
  re-pinned by ``scripts/repin_fixtures.py``);
* ``reasoning``: a template shaped like Qwen3's (:data:`THINK`) and records for it;
* ``oracle``: where each message's content sits, independent of the labelling tiers;
* ``hostile``: capped runs, untouched trees, canaries (:func:`run_capped`, :class:`Canary`);
* ``pairs``: rows as a preference pack holds them (:func:`preference_rows`).
"""

from __future__ import annotations

from tests.helpers.contract import (
    FIXTURE_FILES,
    FIXTURE_INPUTS,
    FIXTURE_OPTIONS,
    FIXTURE_PACKS,
    FIXTURES,
    PINS,
    REPIN,
    ROW_COLUMNS,
    SEGMENT_COLUMNS,
    compare_decoded,
    compare_files,
    decoded_pins,
    example_places,
    format_pins,
    moved_versions,
    pack_fixture,
    pin_failure,
    pins_environment,
    segment_digest,
)
from tests.helpers.data import (
    CHAT_REF,
    conversation,
    make_spill,
    small_profile,
    span_texts,
    write_jsonl,
)
from tests.helpers.engines import (
    StartingEngine,
    cores_task,
    flaky_task,
    output_digests,
    scale_inputs,
    slow_square,
)
from tests.helpers.exports import (
    trained_pairs,
)
from tests.helpers.folders import (
    TOKENIZER_BYTES,
    TOKENIZER_SHA,
    fixture_rows,
    make_row,
    write_out,
)
from tests.helpers.hostile import (
    CAPPED_MEMORY,
    CLI,
    Canary,
    changed,
    run_capped,
    tree_state,
)
from tests.helpers.oracle import (
    content_places,
)
from tests.helpers.packs import (
    PackOutput,
    check_pack_output,
    pack_demo_into,
    pack_rows,
)
from tests.helpers.pairs import (
    add_branch_column,
    pack_from,
    pair_branches,
    preference_rows,
    rehash,
    reject_lines,
)
from tests.helpers.paths import (
    REPO,
    SHARED_DATA,
    SHARED_SKIP,
)
from tests.helpers.reasoning import (
    REASONING_CHAT,
    THINK,
    TOOL,
    answer,
    call,
    chat,
    rendered_spans,
    user,
)
from tests.helpers.records import (
    ALTERNATION,
    BAD_ALTERNATION,
    BY_NAME,
    CHAT,
    FAMILIES,
    TOOL_CHAT,
    WEATHER_TOOL,
    Family,
    msg,
)
from tests.helpers.templates import (
    ECHO,
    GEMMA,
    LLAMA2,
    LLAMA3,
    MISTRAL,
    QWEN,
)
from tests.helpers.tokenizers import (
    DIGIT_SPLIT,
    FAMILY_CORPUS,
    HIGH_IDS,
    TINY_CORPUS,
    TINY_SPECIALS,
    WORD_SPLIT,
    WORD_VOCAB,
    bos_processor,
    build_echo,
    build_gemma,
    build_llama3,
    build_qwen,
    build_sentencepiece,
    build_tokenizer,
    byte_level_bpe,
    save_tokenizer,
    sentencepiece_bpe,
)
from tests.helpers.trainers import (
    MARKER,
    LossProbe,
    epochs_of,
    marked_examples,
    pack_marked_examples,
    run_two_processes,
    tiny_llama,
)

__all__ = [
    "ALTERNATION",
    "BAD_ALTERNATION",
    "BY_NAME",
    "CAPPED_MEMORY",
    "CHAT",
    "CHAT_REF",
    "CLI",
    "DIGIT_SPLIT",
    "ECHO",
    "FAMILIES",
    "FAMILY_CORPUS",
    "FIXTURES",
    "FIXTURE_FILES",
    "FIXTURE_INPUTS",
    "FIXTURE_OPTIONS",
    "FIXTURE_PACKS",
    "GEMMA",
    "HIGH_IDS",
    "LLAMA2",
    "LLAMA3",
    "MARKER",
    "MISTRAL",
    "PINS",
    "QWEN",
    "REASONING_CHAT",
    "REPIN",
    "REPO",
    "ROW_COLUMNS",
    "SEGMENT_COLUMNS",
    "SHARED_DATA",
    "SHARED_SKIP",
    "THINK",
    "TINY_CORPUS",
    "TINY_SPECIALS",
    "TOKENIZER_BYTES",
    "TOKENIZER_SHA",
    "TOOL",
    "TOOL_CHAT",
    "WEATHER_TOOL",
    "WORD_SPLIT",
    "WORD_VOCAB",
    "Canary",
    "Family",
    "LossProbe",
    "PackOutput",
    "StartingEngine",
    "add_branch_column",
    "answer",
    "bos_processor",
    "build_echo",
    "build_gemma",
    "build_llama3",
    "build_qwen",
    "build_sentencepiece",
    "build_tokenizer",
    "byte_level_bpe",
    "call",
    "changed",
    "chat",
    "check_pack_output",
    "compare_decoded",
    "compare_files",
    "content_places",
    "conversation",
    "cores_task",
    "decoded_pins",
    "epochs_of",
    "example_places",
    "fixture_rows",
    "flaky_task",
    "format_pins",
    "make_row",
    "make_spill",
    "marked_examples",
    "moved_versions",
    "msg",
    "output_digests",
    "pack_demo_into",
    "pack_fixture",
    "pack_from",
    "pack_marked_examples",
    "pack_rows",
    "pair_branches",
    "pin_failure",
    "pins_environment",
    "preference_rows",
    "rehash",
    "reject_lines",
    "rendered_spans",
    "run_capped",
    "run_two_processes",
    "save_tokenizer",
    "scale_inputs",
    "segment_digest",
    "sentencepiece_bpe",
    "slow_square",
    "small_profile",
    "span_texts",
    "tiny_llama",
    "trained_pairs",
    "tree_state",
    "user",
    "write_jsonl",
    "write_out",
]
