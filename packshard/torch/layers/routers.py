"""MoE load balancing on packed rows: what the auxiliary loss sees, and a per-segment form.

transformers' Switch-style auxiliary loss (``output_router_logits=True``) is computed over
every token the forward sees, summed over the MoE layers::

    f_e = share of top-k assignments that go to expert e        (over all tokens, all layers)
    P_e = mean router probability of expert e                     (the same tokens)
    aux = E · Σ_e f_e · P_e

Routing is per token, so a packed row's router logits equal each example's alone; what
changes is the *population*.  A packed row's loss equals that of the same examples in a
padded batch (both pool the same tokens), not the mean of each example's loss alone (a
product of means is no mean of products; docs/families.md).  :func:`segment_balance_loss`
computes the loss per segment from the packed router logits and averages the segments, which
equals the mean over the examples run alone (a sequence-level balance loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import torch


def balance_loss(
    router_logits: Sequence[torch.Tensor], num_experts: int, top_k: int
) -> torch.Tensor:
    """Return the Switch auxiliary loss over all rows of ``router_logits`` (``[N, E]`` a layer)."""
    counts = torch.zeros(num_experts, dtype=torch.float32)
    probs = torch.zeros(num_experts, dtype=torch.float32)
    rows = 0
    for logits in router_logits:
        weights = torch.softmax(logits.detach().float().cpu(), dim=-1)
        chosen = torch.topk(weights, top_k, dim=-1).indices.reshape(-1)
        counts += torch.bincount(chosen, minlength=num_experts).float()
        probs += weights.sum(dim=0)
        rows += int(weights.shape[0])
    return num_experts * torch.sum((counts / rows) * (probs / rows))


def segment_balance_loss(
    router_logits: Sequence[torch.Tensor], cu_seqlens: Any, num_experts: int, top_k: int
) -> torch.Tensor:
    """Return the mean over segments of :func:`balance_loss` on each segment's tokens of one row."""
    cu = [int(v) for v in torch.as_tensor(cu_seqlens).reshape(-1).tolist()]
    per = [
        balance_loss([logits[a:b] for logits in router_logits], num_experts, top_k)
        for a, b in pairwise(cu)
    ]
    return torch.stack(per).mean()
