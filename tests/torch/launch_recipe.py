"""One rank of the docs' Accelerate recipe, started by torchrun (see test_placement_launch).

Usage: python -m torch.distributed.run --nproc_per_node 2 tests/torch/launch_recipe.py OUT RESULTS

Each rank trains one epoch of OUT through ``Accelerator`` and a ``DataLoader`` over a
``PackedIterableDataset`` (batch size 2, SGD) and writes ``RESULTS/rank<R>.json``: accelerate's
distributed type and process count, the example ids it trained, and the SHA-256 of its
parameters after the epoch.  A refusal is printed as one line, ``refused: <message>``, and
the rank exits 1 without training.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import DataLoader

from packshard.errors import UsageError
from packshard.torch import PackedIterableDataset, collate_varlen
from tests.helpers import tiny_llama


def main(out: str, results: Path) -> int:
    torch.set_num_threads(1)
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False))
    model = tiny_llama(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(PackedIterableDataset(out, seed=0), batch_size=2, collate_fn=collate_varlen)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    trained: list[int] = []
    try:
        for batch in loader:
            loss = model(
                input_ids=batch["input_ids"],
                position_ids=batch["position_ids"],
                labels=batch["labels"],
                use_cache=False,
            ).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            trained += batch["example_ids"].tolist()
    except UsageError as exc:
        print(f"refused: {exc}", flush=True)
        return 1
    flat = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
    record = {
        "distributed_type": str(accelerator.distributed_type),
        "num_processes": accelerator.num_processes,
        "example_ids": trained,
        "params": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
    }
    (results / f"rank{os.environ['RANK']}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
