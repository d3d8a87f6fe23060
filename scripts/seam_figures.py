"""Print what check_model finds for the reader's recipes and the known leaks (tiny Llama, CPU).

python scripts/seam_figures.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, ".")
import torch
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from packshard.torch import PackedDataset, collate_hf, collate_padded, padded_block_causal_mask
from packshard.torch.seams import SeamLeakError, check_model
from tests.helpers import WORD_VOCAB, pack_marked_examples
from tests.torch.test_seams import SelfMaskingLlama, _llama

root = Path(tempfile.mkdtemp())
tokdir = root / "tok"
tokdir.mkdir()
tok = Tokenizer(models.WordLevel(vocab=WORD_VOCAB, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.add_special_tokens([AddedToken("<eos>", special=True, normalized=False)])
tok.save(str(tokdir / "tokenizer.json"))
(tokdir / "tokenizer_config.json").write_text(
    json.dumps({"eos_token": "<eos>", "add_bos_token": False})
)
out = pack_marked_examples(root, tokdir)
data = PackedDataset(out)
rows = [data[i] for i in range(3)]
b = collate_hf(rows)


def go(name, model, batch):
    try:
        print(f"{name}: pass, max logit diff {check_model(model, batch):.2e}")
    except SeamLeakError as e:
        print(f"{name}: REFUSED {str(e)[:160]}")


p = collate_padded(rows[::-1], max_seq_len=64)
m = padded_block_causal_mask(p["cu_seqlens"], 64)
feed = {k: p[k] for k in ("input_ids", "position_ids")}
add = torch.zeros(m.shape).masked_fill(~m, torch.finfo(torch.float32).min)
for impl in ("sdpa", "eager"):
    go(f"{impl} collate_hf", _llama(impl), b)
    go(
        f"{impl} collate_hf + 2-D ones mask",
        _llama(impl),
        {**b, "attention_mask": torch.ones_like(b["input_ids"])},
    )
    go(
        f"{impl} padded + 4-D bool mask",
        _llama(impl),
        {**feed, "cu_seqlens": p["cu_seqlens"], "attention_mask": m},
    )
    go(
        f"{impl} padded + 4-D additive mask",
        _llama(impl),
        {**feed, "cu_seqlens": p["cu_seqlens"], "attention_mask": add},
    )
go("sdpa self-masking model, collate_hf", _llama(cls=SelfMaskingLlama), b)
