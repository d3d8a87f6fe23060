"""Build the committed fixture tokenizer of tests/fixtures/contract/tokenizer/ (run once).

The fixture packs that pin the shard contract need a tokenizer that never changes: the
tokenizer.json is committed and the tests load it as it is.  Training is not repeated per run,
because BPE training itself may change between tokenizers releases; this script only records
how the committed file was made.  Running it again overwrites the fixture (and then the pins
must be made again: `make repin`).

What it builds: a byte-level BPE trained on the message texts of packshard/data/demo_chat.jsonl
(vocabulary 1,024), with its ids moved so that a small file still holds ids above 65,535:

    ids 0 … 255          the 256 byte symbols
    ids 65,536 …         every learned merge (768 tokens)
    ids 100,000 … 100,002 the ChatML special tokens <|endoftext|> <|im_start|> <|im_end|>

The vocabulary is sparse (1,027 entries, largest id 100,002), so every packed row holds ids that
do not fit in 16 bits.  tokenizer_config.json names the special tokens and carries a ChatML
template without generation blocks (labels then come from character spans), which renders
tools and tool calls with `tojson`.

    python scripts/build_fixture_tokenizer.py [FOLDER]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from packshard.demo import TOKENIZER_CONFIG, demo_data_path
from packshard.demo import _texts as demo_texts  # the demo tokenizer's training texts

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "tests" / "fixtures" / "contract" / "tokenizer"
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES_FROM = 65_536
SPECIALS_FROM = 100_000

TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- 'Tools you may call:' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
    {%- elif message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant\n' }}
        {%- for call in message.tool_calls %}
            {{- '<tool_call>' + (call.function | tojson) + '</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content | trim + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def build(folder: Path) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(demo_texts(demo_data_path())), trainer=trainer)
    spec = json.loads(tok.to_str())
    learned = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    low = [t for t, _ in learned if t in alphabet]
    merged = [t for t, _ in learned if t not in alphabet]
    vocab = {t: i for i, t in enumerate(low)}
    vocab.update({t: MERGES_FROM + i for i, t in enumerate(merged)})
    vocab.update({t: SPECIALS_FROM + i for i, t in enumerate(SPECIALS)})
    spec["model"]["vocab"] = vocab
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {**TOKENIZER_CONFIG, "chat_template": TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else FOLDER
    print(f"fixture tokenizer written to {build(target)}")
