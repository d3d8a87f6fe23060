"""Trainers: a pack whose examples can be told apart, a tiny Llama, the fed-loss probe."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np

from packshard.records import IGNORE_INDEX
from tests.helpers.data import write_jsonl

# --- trainers: a pack whose examples can be told apart, a tiny Llama, the fed-loss probe ------

MARKER = 300
"""Every example of :func:`pack_marked_examples` starts with its own token ``w{MARKER + k}``."""


def pack_marked_examples(
    root: Path, tokenizer: Path, examples: int = 58, **options: object
) -> Path:
    """Pack prompt/completion examples (word tokenizer) whose first token names them.

    Example ``k`` is ``w{300 + k}`` and 2-9 prompt words (no loss), then 2-8 completion words
    and EOS (trained).  58 examples pack into 16 rows of at most 48 tokens, 3 shards.
    """
    from packshard.pack import PackConfig, pack_dataset

    rng = np.random.default_rng(0)
    records = []
    for k in range(examples):
        prompt = [f"w{MARKER + k}"] + [
            f"w{w}" for w in rng.integers(2, MARKER, rng.integers(2, 10))
        ]
        answer = [f"w{w}" for w in rng.integers(2, MARKER, rng.integers(2, 9))]
        records.append({"prompt": " ".join(prompt), "completion": " " + " ".join(answer)})
    data = write_jsonl(root / "marked.jsonl", records)
    config = PackConfig.build(
        inputs=(str(data),),
        tokenizer=str(tokenizer),
        out=str(root / "out"),
        max_seq_len=48,
        shard_rows=6,
        **options,
    )  # type: ignore[arg-type]
    pack_dataset(config)
    return root / "out"


def tiny_llama(seed: int = 0) -> Any:
    """A random 2-layer Llama (hidden 32, SDPA, fp32, no KV cache) over the word vocabulary."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return transformers.LlamaForCausalLM(config)


def marked_examples(out: Path) -> dict[int, tuple[Any, Any]]:
    """``marker -> (input_ids, labels)`` of every example of a marked pack, read from its rows."""
    from packshard.torch import PackedDataset

    data, found = PackedDataset(out), {}
    for i in range(len(data)):
        row = data[i]
        cu = row["cu_seqlens"].tolist()
        for lo, hi in itertools.pairwise(cu):
            found[int(row["input_ids"][lo])] = (row["input_ids"][lo:hi], row["labels"][lo:hi])
    return found


class LossProbe:
    """Compares the loss of every batch a trainer feeds with its examples' loss, each alone.

    As a forward hook (``hook=True``) it reads the batch and the loss the model computed; a
    loop of its own calls :meth:`compare` with the batch's real tokens and its loss.  A record
    holds the examples found (by their marker tokens, each checked equal to the packed
    example), ``fed`` (the batch's token-mean loss as the trainer computed it), ``alone``
    (the token mean of the same examples run one by one) and ``naive`` (the same tokens run as
    one sequence: the leak a lost seam causes, the live control).
    """

    def __init__(self, model: Any, examples: dict[int, tuple[Any, Any]], hook: bool = True):
        self.model, self.examples, self.records, self.busy = model, examples, [], False
        if hook:
            model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if self.busy or not module.training:
            return
        ids, labels, mask = kwargs["input_ids"], kwargs["labels"], kwargs.get("attention_mask")
        keep = mask.bool() if mask is not None and mask.dim() == 2 else ids >= 0
        count = int((labels[..., 1:] != IGNORE_INDEX).sum())
        items = kwargs.get("num_items_in_batch")  # the trainer divides the sum by it
        fed = float(output.loss.detach()) * (float(items) / count if items is not None else 1.0)
        self.compare(ids[keep], labels[keep], fed)

    def compare(self, ids: Any, labels: Any, fed: float) -> dict[str, Any]:
        """Record one batch: its real tokens (flat), labels, and the loss the trainer got."""
        import torch

        self.busy = True
        try:
            with torch.no_grad():
                starts = [*(ids >= MARKER).nonzero().flatten().tolist(), len(ids)]
                markers, total, count = [], 0.0, 0
                for lo, hi in itertools.pairwise(starts):
                    marker = int(ids[lo])
                    tokens, targets = self.examples[marker]
                    assert torch.equal(ids[lo:hi].cpu(), tokens), f"example {marker} was altered"
                    s, c = self._loss_sum(tokens, targets)
                    markers, total, count = [*markers, marker], total + s, count + c
                naive_sum, naive_count = self._loss_sum(ids, labels, positions=True)
        finally:
            self.busy = False
        record = {
            "markers": markers,
            "fed": fed,
            "alone": total / count,
            "naive": naive_sum / naive_count,
        }
        self.records.append(record)
        return record

    def _loss_sum(self, ids: Any, labels: Any, positions: bool = False) -> tuple[float, int]:
        import torch
        import torch.nn.functional as F

        extra = {"position_ids": torch.arange(len(ids))[None]} if positions else {}
        logits = self.model(input_ids=ids[None], use_cache=False, **extra).logits[0].float()
        targets = labels[1:]
        loss = F.cross_entropy(logits[:-1], targets, ignore_index=IGNORE_INDEX, reduction="sum")
        return float(loss), int((targets != IGNORE_INDEX).sum())


def epochs_of(records: list[dict[str, Any]], epochs: int) -> list[list[int]]:
    """The example markers of each epoch of a run's records (equal steps per epoch)."""
    steps = len(records) // epochs
    return [
        [m for r in records[e * steps : (e + 1) * steps] for m in r["markers"]]
        for e in range(epochs)
    ]


def run_two_processes(fn: Any, *args: Any) -> None:
    """Run ``fn(rank, *args)`` in two forked processes set up for a gloo process group.

    Forking keeps the imports already made (trainers take seconds to import); each process
    gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and a free ``MASTER_PORT``, as torchrun
    gives them.  A failure in either is raised here with its traceback.
    """
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(_ranked, args=(port, fn, args), nprocs=2, start_method="fork")


def _ranked(rank: int, port: int, fn: Any, args: tuple[Any, ...]) -> None:
    import os
    import sys

    import torch

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    state = sys.modules.get("accelerate.state")
    if state is not None:  # forked: an accelerate state of the parent would be stale here
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()
    fn(rank, *args)
