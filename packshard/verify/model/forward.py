"""The model stage of ``verify``: pick rows, crop them, build the model, run the proof.

Rows are sampled with the seed, preferring rows with a seam.  A row longer than
``model_max_tokens`` is cut after its last whole segment that fits (a causal prefix's logits do
not depend on what follows).  The default model is a random ``LlamaForCausalLM`` (float32)
with at most :data:`TINY_VOCAB` ids, larger ones folded modulo its size.  torch and
transformers are imported only inside these functions: without them the stage is reported as
not run, in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from packshard.errors import UsageError
from packshard.records import IGNORE_INDEX, PackedRow
from packshard.verify.model.quiet import quiet_libraries

if TYPE_CHECKING:
    import torch

TINY_VOCAB = 4096


def crop_row(row: PackedRow, max_tokens: int, branch: np.ndarray | None = None) -> PackedRow:
    """Keep the leading whole segments of ``row`` that fit in ``max_tokens`` (at least one).

    With ``branch`` (a preference row's per-segment column) no pair is cut in two: when the
    last segment kept is a chosen branch, its rejected branch is kept too.
    """
    cu = row.cu_seqlens
    keep = max(int(np.searchsorted(cu, max_tokens, side="right")) - 1, 1)
    if branch is not None and keep < len(branch) and branch[keep - 1] == 1:
        keep += 1
    end = int(cu[keep])
    if end >= row.num_tokens:
        return row
    return PackedRow(
        input_ids=row.input_ids[:end],
        labels=row.labels[:end],
        position_ids=row.position_ids[:end],
        cu_seqlens=cu[: keep + 1],
        example_ids=row.example_ids[:keep],
    )


def pick_rows(
    tables: dict[int, pa.Table],
    count: int,
    seed: int,
    exclude: dict[int, np.ndarray] | None = None,
) -> list[tuple[int, int]]:
    """Choose up to ``count`` (shard, row) pairs, multi-segment rows first, seeded.

    Rows in ``exclude`` (per shard: rows the structural audit found broken) are never chosen.
    """
    multi: list[tuple[int, int]] = []
    single: list[tuple[int, int]] = []
    for shard, table in sorted(tables.items()):
        lengths = np.diff(np.asarray(table["cu_seqlens"].combine_chunks().offsets)) - 1
        if exclude is not None and shard in exclude:
            lengths[exclude[shard]] = -1  # broken: neither multi nor single
        multi += [(shard, int(r)) for r in np.flatnonzero(lengths >= 2)]
        single += [(shard, int(r)) for r in np.flatnonzero((lengths >= 0) & (lengths < 2))]
    rng = np.random.default_rng(seed)
    chosen = [multi[i] for i in rng.permutation(len(multi))[:count]]
    if len(chosen) < count:
        chosen += [single[i] for i in rng.permutation(len(single))[: count - len(chosen)]]
    return sorted(chosen)


def build_tiny_model(vocab_size: int, seed: int = 0, max_seq_len: int = 8192) -> Any:
    """Return a small random float32 ``LlamaForCausalLM`` in eval mode on the CPU.

    The weights depend only on ``seed`` (the global torch generator is left untouched).
    """
    import torch

    with quiet_libraries():
        from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_seq_len,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]), quiet_libraries():
        torch.manual_seed(seed)
        model: Any = LlamaForCausalLM(config)
    return model.float().eval()


def load_model(spec: str, vocab_size: int, seed: int = 0, config: str | None = None) -> Any:
    """Return the model named by ``spec``: ``tiny``, or a local Hugging Face model folder.

    A folder is loaded offline, without remote code, in float32.  With ``config`` the model
    is that architecture shrunk (:func:`packshard.torch.layers.tiny.tiny_model`) with
    :func:`packshard.torch.segment_layers` applied, fed as a trainer feeds it.
    """
    if config is not None:
        with quiet_libraries():
            from packshard.torch.layers.segmented import segment_layers
            from packshard.torch.layers.tiny import tiny_model

            model = tiny_model(config, min(vocab_size, TINY_VOCAB), seed=seed)
            segment_layers(model)
        return model
    if spec == "tiny":
        return build_tiny_model(min(vocab_size, TINY_VOCAB), seed=seed)
    folder = Path(spec)
    if not (folder / "config.json").is_file():
        raise UsageError(
            f"{spec}: not a model folder (no config.json) (use --model tiny or a local folder)"
        )
    with quiet_libraries():
        from transformers import AutoModelForCausalLM  # noqa: F401 - its import warnings hushed

    from packshard.torch.layers.tiny import local_causal_lm

    return local_causal_lm(folder)


def forward_logits(
    model: Any, input_ids: np.ndarray, positions: np.ndarray | None, mask: torch.Tensor | None
) -> torch.Tensor:
    """Run one sequence (batch 1) and return float32 logits ``[T, V]``."""
    import torch

    ids = torch.from_numpy(np.asarray(input_ids, dtype=np.int64))[None]
    pos = None if positions is None else torch.from_numpy(np.asarray(positions, np.int64))[None]
    out = model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False)
    return out.logits[0].float()


def score_loss(logits: torch.Tensor, labels: np.ndarray) -> tuple[float, int]:
    """Return (summed shifted cross entropy, number of loss tokens) of one segment."""
    import torch
    import torch.nn.functional as F

    target = torch.from_numpy(np.asarray(labels[1:], dtype=np.int64))
    count = int((target != IGNORE_INDEX).sum())
    if count == 0:
        return 0.0, 0
    total = F.cross_entropy(logits[:-1], target, ignore_index=IGNORE_INDEX, reduction="sum")
    return float(total), count


def mutate_tokens(
    input_ids: np.ndarray, cu_seqlens: np.ndarray, keep: int, vocab: int, rng: np.random.Generator
) -> np.ndarray:
    """Return a copy where every segment of parity ``1 - keep`` gets different random tokens."""
    lengths = np.diff(cu_seqlens)
    mutated = np.repeat(np.arange(lengths.size) % 2 != keep, lengths)
    shift = rng.integers(1, vocab, size=input_ids.size)
    return np.where(mutated, (input_ids.astype(np.int64) + shift) % vocab, input_ids)


def build_block_mask(cu_seqlens: np.ndarray, causal_only: bool = False) -> torch.Tensor:
    """Return the additive float32 mask ``[1, 1, T, T]``: 0 where a token may attend, else -inf.

    The allowed pairs are :func:`packshard.torch.masks.block_causal_mask`'s; with
    ``causal_only`` the segments are ignored (the naive-concatenation control).
    """
    import torch

    from packshard.torch.masks import block_causal_mask

    cu = torch.from_numpy(np.asarray(cu_seqlens, dtype=np.int64))
    total = int(cu[-1])
    if causal_only:
        allowed = torch.ones(total, total, dtype=torch.bool).tril()
    else:
        allowed = block_causal_mask(cu, total)
    mask = torch.zeros(total, total, dtype=torch.float32)
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return mask[None, None]


@dataclass(frozen=True)
class Forwards:
    """The logits of one row: packed, each segment alone, mutated twice, and the control."""

    packed: torch.Tensor
    alone: list[torch.Tensor]
    mutated: list[torch.Tensor]
    control: torch.Tensor | None


def run_forwards(
    model: Any,
    ids: np.ndarray,
    positions: np.ndarray,
    cu: np.ndarray,
    mutate: bool,
    rng: np.random.Generator,
) -> Forwards:
    """Run one row packed, each segment alone, mutated twice (``mutate``) and as the control."""
    import torch

    from packshard.torch.layers.segmented import is_segmented

    vocab = int(model.config.vocab_size)
    fed = is_segmented(model)  # fed as a trainer feeds it: positions restart, no mask
    with torch.inference_mode():
        block = None if fed else build_block_mask(cu)
        packed = forward_logits(model, ids, positions, block)
        alone = [forward_logits(model, ids[a:b], None, None) for a, b in pairwise(cu)]
        mutated, control = [], None
        if cu.size > 2:
            naive = None if fed else build_block_mask(cu, True)
            control = forward_logits(model, ids, np.arange(ids.size), naive)
            if mutate:
                for keep in (0, 1):
                    mut = mutate_tokens(ids, cu, keep, vocab, rng)
                    mutated.append(forward_logits(model, mut, positions, block))
    return Forwards(packed, alone, mutated, control)


def boundary_control(model: Any, row: PackedRow) -> tuple[float, str | None]:
    """Run ``row`` with the seams withheld from the segmented mixers; return the leak and where.

    The control of a hybrid model: its recurrent, state-space and convolutional layers see
    the whole row as one sequence (attention still gets the seams).  Returns the max
    |Δlogit| against each segment alone and the first layer that differs (None: no leak).
    """
    import torch

    from packshard.torch.layers.locate import first_leak
    from packshard.torch.layers.segmented import withheld

    vocab = int(model.config.vocab_size)
    cu = np.asarray(row.cu_seqlens, dtype=np.int64)
    ids = np.asarray(row.input_ids, dtype=np.int64) % vocab
    positions = np.asarray(row.position_ids, dtype=np.int64)
    with torch.inference_mode(), withheld(model):
        packed = forward_logits(model, ids, positions, None)
        worst = max(
            float((packed[a:b] - forward_logits(model, ids[a:b], None, None)).abs().max())
            for a, b in pairwise(cu.tolist())
        )
        inputs = {
            "input_ids": torch.from_numpy(ids)[None],
            "position_ids": torch.from_numpy(positions)[None],
            "use_cache": False,
        }
        segments = [(int(a), int(b)) for a, b in pairwise(cu.tolist())]
        site = first_leak(model, inputs, segments, 1e-4)
    return worst, site.describe() if site is not None else None
