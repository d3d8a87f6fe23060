"""Each pair's summed log-probabilities from one packed forward, and the DPO family of losses.

A preference row holds pairs as adjacent segments, chosen (branch 1) then rejected
(branch 2), possibly beside plain segments (branch 0)::

    row        [ p p p c c c | p p p r r | x x x ]      cu_seqlens = [0, 6, 11, 14]
    branch        1 (chosen)   2 (rejected)  0
    labels     - - - - c c c   - - - - r r   ...        unshifted, first of a segment -100
    logp_t     log softmax(logits[t - 1])[labels[t]]    0 where labels[t] = -100

:func:`segment_logps` sums ``logp_t`` over every segment (one ``index_add`` over the batch, the
segment of token ``t`` found by a ``searchsorted`` of ``cu_seqlens``) and counts its trained
tokens; the first label of a segment is -100, so no prediction across a seam counts.
:func:`pair_logps` takes every branch-1 segment and the branch-2 segment right after it in
the same row; anything else (a chosen without its rejected, a pair across rows) is refused:
the batch was cut or reordered.

Both batch shapes work: varlen (``logits [1, T, V]``, ``cu_seqlens [S + 1]``, ``branch [S]``)
and padded (``logits [B, L, V]``, ``cu_seqlens [B, S + 1]``, ``branch [B, S]``; padding sits
after ``cu_seqlens[b, -1]`` and counts for no segment).

:func:`dpo_loss` is the per-pair loss of three objectives (``β`` = beta)::

    sigmoid   -log σ(β ((c - c_ref) - (r - r_ref)))                      DPO
    ipo       ((c - c_ref)/n_c - (r - r_ref)/n_r - 1/(2β))²               IPO (length-averaged)
    simpo     -log σ(β (c/n_c - r/n_r) - γ)                               SimPO (no reference)

with ``c``, ``r`` the summed log-probabilities of the chosen and rejected answers and ``n``
their trained-token counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from packshard.errors import UsageError
from packshard.records import IGNORE_INDEX
from packshard.torch.collate import token_losses

CHOSEN, REJECTED = 1, 2
LOSS_TYPES = ("sigmoid", "ipo", "simpo")


@dataclass(frozen=True)
class PairLogps:
    """The pairs of one batch, in batch order: summed log-probabilities and token counts.

    ``chosen``/``rejected`` are float64 ``[P]`` (differentiable), ``chosen_tokens``/
    ``rejected_tokens`` int64 ``[P]``; ``chosen_example_ids``/``rejected_example_ids`` int64
    ``[P]`` (-1 where the batch carries no ``example_ids``) join reference log-probabilities.
    """

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor
    chosen_example_ids: torch.Tensor
    rejected_example_ids: torch.Tensor

    def __len__(self) -> int:
        return int(self.chosen.shape[0])


def segment_logps(
    logits: torch.Tensor, labels: torch.Tensor, cu_seqlens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return each segment's summed log-probability of its labels and its trained tokens.

    ``logits [R, L, V]``, ``labels [R, L]``, ``cu_seqlens [S + 1]`` (varlen, ``R`` = 1) or
    ``[R, S + 1]`` (padded).  Returns float64 ``[R·S]`` sums and int64 ``[R·S]`` counts, in
    row-major segment order, accumulated in float64 (float32's spacing at -4000 is 5e-4).
    """
    cu = cu_seqlens.to(torch.int64).reshape(-1, cu_seqlens.shape[-1]).to(logits.device)
    rows, segments = cu.shape[0], cu.shape[1] - 1
    length = labels.shape[-1]
    labels = labels.reshape(rows, length)
    logps = -token_losses(logits.reshape(rows, length, -1), labels)  # 0 where no label
    trained = (labels != IGNORE_INDEX).to(torch.int64)
    trained[:, 0] = 0  # position 0 has no prediction (token_losses gives it none)
    positions = torch.arange(length, device=cu.device).expand(rows, length).contiguous()
    segment = torch.searchsorted(cu[:, 1:].contiguous(), positions, right=True)  # S past the end
    flat = (segment + torch.arange(rows, device=cu.device)[:, None] * (segments + 1)).reshape(-1)
    size = rows * (segments + 1)
    wide = torch.zeros(size, dtype=torch.float64, device=logps.device)
    sums = wide.index_add(0, flat, logps.reshape(-1).double())
    counts = trained.new_zeros(size).index_add(0, flat, trained.reshape(-1))
    keep = (torch.arange(size, device=cu.device) % (segments + 1)) < segments
    return sums[keep], counts[keep]


def _pairs(branch: torch.Tensor, segments: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the flat indices of every chosen segment and of its rejected partner."""
    flat = branch.reshape(-1).to(torch.int64)
    chosen = (flat == CHOSEN).nonzero().flatten()
    rejected = chosen + 1
    partner = F.pad(flat, (0, 1))[rejected]  # 0 past the last segment
    ok = bool(((partner == REJECTED) & (chosen // segments == rejected // segments)).all())
    if not ok or int((flat == REJECTED).sum()) != chosen.numel():
        raise UsageError(
            "the batch's branch column does not pair every chosen segment with the rejected "
            "segment right after it in the same row (rows were cut, reordered or rebuilt: "
            "batch whole packshard rows with collate_varlen or collate_padded)"
        )
    return chosen, rejected


def pair_logps(logits: torch.Tensor, batch: Mapping[str, Any]) -> PairLogps:
    """Return the summed log-probabilities of every pair's chosen and rejected answers.

    ``batch`` is a collator's output for preference rows (with ``branch``); ``logits`` the
    model's, run block-causal.  Only the trained tokens count.
    """
    if "branch" not in batch:
        raise UsageError(
            "pair_logps needs the batch's per-segment branch column: read a pack with "
            "preference pairs and collate it with collate_varlen or collate_padded"
        )
    cu = torch.as_tensor(batch["cu_seqlens"])
    sums, counts = segment_logps(logits, torch.as_tensor(batch["labels"]), cu)
    branch = torch.as_tensor(batch["branch"]).to(sums.device)
    if branch.numel() != sums.numel():
        raise UsageError(
            f"the batch has {branch.numel()} branch entries for {sums.numel()} segments "
            "(collate the rows with collate_varlen or collate_padded)"
        )
    chosen, rejected = _pairs(branch, cu.shape[-1] - 1)
    given = batch.get("example_ids")
    if isinstance(given, torch.Tensor) and given.numel() == sums.numel():
        ids = given.reshape(-1).to(torch.int64).to(sums.device)
    else:
        ids = torch.full((sums.numel(),), -1, dtype=torch.int64, device=sums.device)
    return PairLogps(
        chosen=sums[chosen],
        rejected=sums[rejected],
        chosen_tokens=counts[chosen],
        rejected_tokens=counts[rejected],
        chosen_example_ids=ids[chosen],
        rejected_example_ids=ids[rejected],
    )


def dpo_loss(
    policy: PairLogps,
    reference: PairLogps | tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    gamma: float = 0.5,
    reduction: str = "mean",
) -> torch.Tensor:
    """Return the preference loss of the policy's pairs (see the module's table).

    ``reference`` is the reference model's :class:`PairLogps` on the same batch, or its
    ``(chosen, rejected)`` sums (e.g. precomputed once); ``simpo`` takes none.  ``reduction``:
    ``mean`` (over pairs), ``sum`` or ``none`` (``[P]``).
    """
    if loss_type not in LOSS_TYPES:
        raise UsageError(f"loss_type {loss_type!r} is not one of {', '.join(LOSS_TYPES)}")
    if reduction not in ("mean", "sum", "none"):
        raise UsageError(f"reduction {reduction!r} is not one of mean, sum, none")
    chosen, rejected = policy.chosen, policy.rejected
    n_c = policy.chosen_tokens.clamp(min=1).to(chosen.dtype)
    n_r = policy.rejected_tokens.clamp(min=1).to(chosen.dtype)
    if loss_type == "simpo":
        losses = -F.logsigmoid(beta * (chosen / n_c - rejected / n_r) - gamma)
    else:
        if reference is None:
            raise UsageError(
                f"loss_type {loss_type!r} needs the reference model's log-probabilities "
                "(pass reference=, or use loss_type='simpo')"
            )
        if isinstance(reference, PairLogps):
            reference = (reference.chosen, reference.rejected)
        ref_c, ref_r = (r.to(chosen.device, chosen.dtype).detach() for r in reference)
        if ref_c.shape != chosen.shape or ref_r.shape != rejected.shape:
            raise UsageError(
                f"{chosen.shape[0]} pairs but {ref_c.shape[0]} reference log-probabilities "
                "(compute the reference on the same batch)"
            )
        if loss_type == "sigmoid":
            losses = -F.logsigmoid(beta * ((chosen - ref_c) - (rejected - ref_r)))
        else:
            margin = (chosen - ref_c) / n_c - (rejected - ref_r) / n_r
            losses = (margin - 1 / (2 * beta)) ** 2
    if reduction == "mean":
        return losses.mean() if losses.numel() else losses.sum()
    return losses.sum() if reduction == "sum" else losses
