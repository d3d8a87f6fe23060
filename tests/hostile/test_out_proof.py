"""What lets a command replace or lock a folder: proof, not a guess.

A folder is packshard's only when its manifest validates and the files carry its dataset id
(three keys in a ``manifest.json`` make no user folder replaceable); the lock beside OUT is
opened without following a link planted there.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import changed, tree_state
from tests.hostile.test_output_folder import NOT_OURS, RECORD, pack, refused


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text(RECORD * 3)
    return tmp_path


def test_a_fake_three_key_manifest_does_not_make_a_folder_replaceable(root, word_tokenizer):
    (root / "mine").mkdir()
    (root / "mine" / "thesis.docx").write_text("years of work")
    fake = {"dataset_id": "ab", "files": {"t": {"path": "thesis.docx"}}, "shards": []}
    (root / "mine" / "manifest.json").write_text(json.dumps(fake))
    before = tree_state(root)
    refused(
        pack(root, word_tokenizer, "data", "-o", "mine", "--overwrite"),
        f"mine: output folder holds 'manifest.json', 'thesis.docx' but no packshard manifest"
        f"{NOT_OURS}",
    )
    assert changed(before, tree_state(root)) == []


def test_a_valid_manifest_over_files_of_another_dataset_is_not_proof(root, word_tokenizer):
    assert pack(root, word_tokenizer, "data", "-o", "a").exit_code == 0
    (root / "data" / "b.jsonl").write_text(json.dumps({"text": "w5 w6"}) + "\n")
    assert pack(root, word_tokenizer, "data", "-o", "b").exit_code == 0
    shutil.copy(root / "a" / "manifest.json", root / "b" / "manifest.json")  # ids now differ
    before = tree_state(root)
    result = pack(root, word_tokenizer, "data", "-o", "b", "--overwrite")
    assert result.exit_code == 2
    assert "but no packshard manifest" in result.stderr
    assert changed(before, tree_state(root)) == []


def test_the_lock_never_follows_a_planted_link(root, word_tokenizer):
    victim = root / "victim.txt"
    victim.write_text("precious\n")
    (root / ".o.lock").symlink_to(victim)
    refused(
        pack(root, word_tokenizer, "data", "-o", "o"),
        "o: .o.lock beside the output folder is a link (remove it, or choose another -o)",
    )
    assert victim.read_text() == "precious\n"
    assert not (root / "o").exists()
    (root / ".o.lock").unlink()
    assert pack(root, word_tokenizer, "data", "-o", "o").exit_code == 0


def test_a_lock_that_is_a_fifo_does_not_block(root, word_tokenizer):
    import os

    os.mkfifo(root / ".o.lock")
    refused(
        pack(root, word_tokenizer, "data", "-o", "o"),
        "o: .o.lock beside the output folder is not a regular file (remove it, or choose "
        "another -o)",
    )
