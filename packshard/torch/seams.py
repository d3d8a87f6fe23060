"""Does the user's own model keep a packed row's segments apart?  Two forwards tell.

A batch can be right and training still leak: an all-ones 2-D ``attention_mask`` switches
off transformers' packed-sequence detection, a wrapper may build its own mask, some models
ignore ``position_ids``.  :func:`check_model` runs the batch's first row as the loop feeds it
and each of its segments alone, then compares the logits::

    row fed        [a a a | b b | c c c c]   one forward, the loop's own keyword arguments
    alone          [a a a] [b b] [c c c c]   one forward each, positions 0, 1, …, no mask
    compare        max |logits_row[seg] - logits_alone|  ≤  tol(dtype) × max(1, max |logits|)

``tol`` is 1e-4 for fp32/fp64, 1e-2 for fp16, 5e-2 for bf16 (a leak moves the two-layer test
model's logits by 0.41).  On a difference it names the cause from what the loop passed (a
mask, no ``position_ids``, a KV cache), else the attention implementation.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from packshard.errors import UsageError
from packshard.torch.layers.kinds import FIXES, FULL, SINKS, SLIDING
from packshard.torch.layers.locate import SeamLeakError, first_leak

BOOKKEEPING = (
    "labels",
    "cu_seqlens",
    "max_seqlen",
    "seq_idx",
    "num_loss_tokens_per_segment",
    "num_loss_tokens",
    "num_tokens",
    "example_ids",
    "num_items_in_step",
    "branch",
    "kto_label",
    "reference_logps",
)
"""Batch keys the collators add for the loop, never model inputs; dropped before the forward."""

TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def row_segments(batch: Mapping[str, Any]) -> list[tuple[int, int]]:
    """Return the ``(start, end)`` of each segment of the batch's first row."""
    ids = torch.as_tensor(batch["input_ids"])
    length = int(ids.shape[-1])
    cu = batch.get("cu_seqlens", batch.get("cu_seq_lens_q"))
    if cu is not None:
        cu = torch.as_tensor(cu).to(torch.int64)
        bounds = (cu[0] if cu.dim() == 2 else cu).tolist()
        length = min(length, max(bounds))  # a padded row: its padding belongs to no segment
    elif batch.get("position_ids") is not None:
        positions = torch.as_tensor(batch["position_ids"]).reshape(-1, length)[0]
        bounds = (positions == 0).nonzero().flatten().tolist()  # 0 and length are added below
    else:
        raise UsageError(
            "check_model needs the batch's segments: pass a batch with cu_seqlens or "
            "position_ids (collate_varlen, collate_padded or collate_hf make them)"
        )
    bounds = sorted({b for b in bounds if 0 <= b <= length} | {0, length})
    return [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


def _first_row(value: Any, rows: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == rows > 1:
        return value[:1]
    return value


def _cause(model: Any, inputs: Mapping[str, Any]) -> str:
    mask, config = inputs.get("attention_mask"), getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        return (
            "mask: a 2-D attention_mask switches off transformers' packed-sequence detection, "
            "so each row is one sequence (drop attention_mask and keep position_ids, as "
            "collate_hf does, or pass a 4-D block-causal mask)"
        )
    if isinstance(mask, torch.Tensor) and mask.dim() == 4:
        return (
            f"mask: attn_implementation {impl!r} does not apply this 4-D {mask.dtype} mask as "
            "block-causal (eager adds a mask to the scores: pass 0 where attention is allowed "
            "and the dtype's minimum elsewhere, or use sdpa)"
        )
    if inputs.get("position_ids") is None:
        return (
            "positions: the batch has no position_ids, so the model numbers each row as one "
            "sequence (pass the batch's position_ids)"
        )
    cache = inputs.get("use_cache")
    if cache or (cache is None and getattr(config, "use_cache", False)):  # None: the config's
        return "positions: a KV cache is built, which turns off segment detection (use_cache=False)"
    return (
        f"attention implementation: {type(model).__name__} (attn_implementation {impl!r}) "
        "does not separate segments where position_ids restart, although the batch carries "
        "no attention mask (the model or a wrapper builds its own mask, or the architecture "
        "ignores position_ids: packshard.torch.segment_layers(model) passes it block-causal "
        "masks, or pass a 4-D block-causal mask or cu_seq_lens for flash attention)"
    )


@contextmanager
def evaluating(model: Any) -> Iterator[None]:
    """Run the block with ``model`` in eval mode, without gradients; its mode is restored."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(training)


def packed_logits(model: Any, batch: Mapping[str, Any]) -> torch.Tensor:
    """Run a varlen batch through ``model`` with its segments kept apart; return the logits."""
    device = next(model.parameters()).device
    return model(
        input_ids=batch["input_ids"].to(device),
        position_ids=batch["position_ids"].to(device),
        use_cache=False,
    ).logits


def check_model(model: Any, batch: Mapping[str, Any]) -> float:
    """Raise :class:`SeamLeakError` unless ``model`` keeps the batch's segments apart.

    ``batch`` is what the loop passes to ``model(**batch)`` (collator bookkeeping such as
    ``labels``, ``cu_seqlens`` or ``num_items_in_step`` is dropped).  The first row is run as
    given and each of its segments alone, in eval mode, without gradients; the model's mode
    is restored.  Returns the largest logit difference found (within the dtype's tolerance).

    A batch that does not say ``use_cache`` is run with ``use_cache=False``, as the loops in the
    docs pass it: a config's default (True for a stock ``LlamaForCausalLM``) builds a KV cache
    in train mode too, which turns packed-sequence detection off; a batch with
    ``use_cache=True`` is refused with that cause.
    """
    rows = int(torch.as_tensor(batch["input_ids"]).shape[0])
    inputs = {k: _first_row(v, rows) for k, v in batch.items() if k not in BOOKKEEPING}
    inputs.setdefault("use_cache", False)  # as the loop passes it beside the batch
    segments = row_segments(batch)
    device = next(model.parameters()).device
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    ids = inputs["input_ids"].reshape(-1)
    with evaluating(model):
        packed = model(**inputs).logits[0]
        worst, scale = 0.0, 1.0
        for lo, hi in segments:
            alone = model(input_ids=ids[lo:hi][None], use_cache=False).logits[0]
            worst = max(worst, float((packed[lo:hi] - alone).abs().max()))
            scale = max(scale, float(alone.abs().max()))
    tolerance = TOLERANCE.get(packed.dtype, 5e-2) * scale
    if worst > tolerance:
        raise SeamLeakError(
            f"the model mixes the segments of a packed row: logits differ from each segment "
            f"run alone by {worst:.3g} (tolerance {tolerance:.3g} for {packed.dtype}); "
            f"{_where(model, inputs, segments, TOLERANCE.get(packed.dtype, 5e-2))}"
        )
    return worst


def _where(
    model: Any, inputs: Mapping[str, Any], segments: list[tuple[int, int]], tolerance: float
) -> str:
    """Name the first layer that lets a segment see its neighbour, and its fix."""
    with evaluating(model):
        site = first_leak(model, inputs, segments, tolerance)
    if site is None or site.layer is None or site.layer.kind in (FULL, SLIDING, SINKS):
        where = f"first at {site.describe()}: " if site is not None else ""
        return where + _cause(model, inputs)
    moved = f"its output moved by {site.delta:.2g} of its largest value"
    return f"first at {site.describe()}, {moved}: {FIXES[site.layer.kind]}"
