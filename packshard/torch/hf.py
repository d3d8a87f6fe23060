"""Hugging Face trainers on packed rows: a collator that keeps seams, a check that they hold.

:func:`collate_hf` is what ``Trainer(data_collator=…)`` takes: rows laid end to end as one
``[1, T]`` sequence with ``position_ids`` restarting in every segment and no attention mask, so
transformers separates the segments itself; boundaries dropped by ``remove_unused_columns``
are read back from ``position_ids``.

:func:`check_trainer` answers, before training, "will the model see the rows' segments?".  It
collates the first rows the way the trainer would (its column removal, its collator) and
compares the segments the model will separate with the rows' own::

    rows' segments      5 7 4 | 6 3          (cu_seqlens, or seq_lengths, of each row)
    model separates     16    | 9            DataCollatorWithFlattening: one sequence a row
                        5 7 4 | 6 3          TRL padding-free on seq_lengths, collate_hf

The model separates where ``position_ids`` do not count up by one, unless an attention mask
is passed (a 2-D mask turns that detection off: each row is one sequence; a 4-D mask is used as
given) or a KV cache is built.  Any difference raises with the fix for the trainer at hand;
so do TRL's ``packing=True`` (it re-packs rows as single sequences and drops ``seq_lengths``) and
a model config that builds a cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice
from typing import Any

import torch

from packshard.errors import UsageError
from packshard.torch.collate import collate_varlen, flash_attn_kwargs, packed_row
from packshard.torch.seams import check_model
from packshard.torch.steps import STEP_KEY

TRL_RECIPE = "SFTConfig(padding_free=True, packing=False, max_length=None) and no data_collator"


def collate_hf(rows: list[Mapping[str, Any]], flash: bool = False) -> dict[str, torch.Tensor | int]:
    """Build a varlen batch with only the keys a Hugging Face model's ``forward`` accepts.

    For ``Trainer(data_collator=collate_hf)``: ``input_ids``, ``labels`` and ``position_ids``
    as ``[1, T]``, plus the flash-attention boundaries when ``flash`` is true.  Segments are
    told apart by the position restarts (in your own loop pass ``use_cache=False``).
    """
    batch = collate_varlen(rows)
    out = {k: batch[k] for k in ("input_ids", "labels", "position_ids")}
    if flash:
        out.update(flash_attn_kwargs(batch))
    if STEP_KEY in batch:  # the trained tokens of the whole optimizer step (grad_accum=)
        out[STEP_KEY] = batch[STEP_KEY]
    return out


def fed_segments(batch: Mapping[str, Any], use_cache: bool = False) -> list[int]:
    """Return the lengths of the sequences a transformers model separates in ``batch``.

    In batch order over real tokens (padding under a 2-D attention mask excluded).
    """
    ids = torch.as_tensor(batch["input_ids"])
    ids = ids.reshape(1, -1) if ids.dim() == 1 else ids
    mask, positions = batch.get("attention_mask"), batch.get("position_ids")
    keep = torch.ones_like(ids, dtype=torch.bool)
    starts = torch.zeros_like(keep)
    starts[:, 0] = True
    if mask is not None and torch.as_tensor(mask).dim() == 4:
        allowed = torch.as_tensor(mask)[:, 0]
        allowed = allowed if allowed.dtype == torch.bool else allowed == 0  # additive: 0 = keep
        first = allowed.to(torch.int8).argmax(dim=-1)  # earliest key each query may see
        starts = first == torch.arange(ids.shape[1])
    elif mask is not None:
        keep = torch.as_tensor(mask).bool().reshape(ids.shape)  # detection off: a row each
        starts = keep & ~torch.nn.functional.pad(keep[:, :-1], (1, 0), value=False)
    elif positions is not None and not use_cache:
        pos = torch.as_tensor(positions).reshape(ids.shape)
        starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    flat_starts = starts[keep].nonzero().flatten()
    total = int(keep.sum())
    return torch.diff(flat_starts, append=torch.tensor([total])).tolist()


def row_segments(feature: Mapping[str, Any]) -> list[int]:
    """Return a packed row's segment lengths (what the model must keep apart)."""
    return packed_row(feature)["cu_seqlens"].diff().tolist()


def seams_problem(expected: list[int], seen: list[int]) -> str | None:
    """Compare segment lengths over the same tokens; say what differs, or None."""
    total = sum(expected)
    want = set(torch.tensor(expected).cumsum(0).tolist()[:-1])
    got = {b for b in torch.tensor(seen).cumsum(0).tolist() if b < total}
    if want == got:
        return None
    lost, extra = len(want - got), len(got - want)
    shown = f"segments fed {seen[:8]}{'…' if len(seen) > 8 else ''}, in the rows {expected[:8]}"
    return f"{lost} of {len(want)} seams lost, {extra} invented ({shown})"


def _probe(trainer: Any, rows: int) -> list[dict[str, Any]]:
    dataset = trainer.train_dataset
    if getattr(dataset, "data", None) is not None and hasattr(dataset, "rank_rows"):
        dataset = dataset.data  # PackedIterableDataset: read without consuming
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        return [dataset[i] for i in range(min(rows, len(dataset)))]
    return list(islice(iter(dataset), rows))


def _fix(trainer: Any) -> str:
    collator, args = trainer.data_collator, trainer.args
    name = type(collator).__name__
    if type(trainer).__name__ == "SFTTrainer":
        if not getattr(args, "padding_free", False):
            return f"TRL pads rows and masks only the padding: use {TRL_RECIPE}"
        columns = getattr(trainer.train_dataset, "column_names", None) or []
        if "seq_lengths" not in columns:
            return (
                "TRL's padding-free collator finds segments only in a seq_lengths column, and "
                "these rows have none (packed by an older packshard: add it with "
                "ds.map(lambda r: {'seq_lengths': np.diff(r['cu_seqlens'])}))"
            )
        return f"use {TRL_RECIPE}"
    if name == "DataCollatorWithFlattening":
        return (
            "DataCollatorWithFlattening treats each packed row as one sequence: use "
            "data_collator=packshard.torch.collate_hf"
        )
    return "use data_collator=packshard.torch.collate_hf (no attention_mask)"


def check_trainer(trainer: Any, rows: int = 4) -> None:
    """Raise :class:`UsageError` unless ``trainer`` will keep every segment of the rows apart.

    ``trainer`` is a built ``transformers.Trainer`` or ``trl.SFTTrainer`` over packshard rows.
    Its first ``rows`` rows are collated as it would, the sequences the model separates
    compared with the rows' segments, then :func:`~packshard.torch.seams.check_model` run on the
    first row.  Call it once, before ``trainer.train()``.
    """
    args = trainer.args
    is_trl = type(trainer).__name__ == "SFTTrainer"
    if is_trl and getattr(args, "packing", False):
        raise UsageError(
            "TRL's packing=True packs the packed rows again: each becomes one sequence and "
            f"examples attend to each other (use {TRL_RECIPE})"
        )
    if getattr(trainer.model.config, "use_cache", False) and not is_trl:
        raise UsageError(
            "the model's config has use_cache=True: with a KV cache transformers does not "
            "separate packed segments (set model.config.use_cache = False, or "
            "TrainingArguments(use_cache=False))"
        )
    features = _probe(trainer, rows)
    expected = [n for f in features for n in row_segments(f)]
    if args.remove_unused_columns:
        trainer._set_signature_columns_if_needed()
        keep = set(trainer._signature_columns)
        features = [{k: v for k, v in f.items() if k in keep} for f in features]
    batch = trainer.data_collator(features)
    problem = seams_problem(expected, fed_segments(batch))
    if problem is None and "cu_seq_lens_q" in batch:  # flash attention reads these instead
        cu = torch.as_tensor(batch["cu_seq_lens_q"]).to(torch.int64)
        problem = seams_problem(expected, cu.diff().tolist())
    if problem is not None:
        name = type(trainer).__name__
        raise UsageError(f"{name}'s batches would mix examples: {problem} ({_fix(trainer)})")
    check_model(trainer.model, batch)  # the model itself: its attention path, mask, positions
