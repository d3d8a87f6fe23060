"""The embedded demo: a small chat dataset shipped in the package and an offline tokenizer.

``make demo`` must run with no network and no files from outside the repository, so the demo
tokenizer is trained on the spot: a byte-level BPE (vocabulary 1,024) learned from the demo
dataset's own message texts, with the ChatML special tokens ``<|im_start|>``, ``<|im_end|>``
and ``<|endoftext|>``.  Training is deterministic for the same text, so two demo runs produce
the same tokenizer hash.  Run ``python -m packshard.demo DIR`` to write ``DIR/tokenizer.json``
and ``DIR/tokenizer_config.json``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

DEMO_DATA = "data/demo_chat.jsonl"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 1024
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "add_bos_token": False,
    "model_max_length": 4096,
}
"""The demo tokenizer's ``tokenizer_config.json`` (ChatML end and padding tokens, no BOS)."""


def demo_data_path() -> Path:
    """Path of the demo chat JSONL inside the installed package."""
    return Path(str(resources.files("packshard").joinpath(DEMO_DATA)))


def _texts(path: Path) -> Iterator[str]:
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        for message in record.get("messages", []):
            yield str(message.get("content", ""))
        for turn in record.get("conversations", []):
            yield str(turn.get("value", ""))
        for key in ("instruction", "input", "output", "prompt", "completion", "text", "system"):
            if isinstance(record.get(key), str):
                yield record[key]


def build_demo_tokenizer(folder: str | Path) -> Path:
    """Train the demo byte-level BPE and write it with a tokenizer config into ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(_texts(demo_data_path())), trainer=trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m packshard.demo DIR``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m packshard.demo DIR", file=sys.stderr)
        return 2
    print(f"demo tokenizer written to {build_demo_tokenizer(args[0])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
