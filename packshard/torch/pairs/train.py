"""DPO on packed rows: one loss function for any loop, a ``Trainer`` subclass, a first-batch check.

One step on a batch of preference rows (``collate_varlen``: every row end to end, both branches
of every pair adjacent in one row)::

    policy     model(input_ids, position_ids, use_cache=False)   segments kept apart by the
               restarting positions (transformers' packed-sequence detection: sdpa, flash)
    pairs      pair_logps(logits, batch)        chosen / rejected sums, P pairs
    reference  a frozen model on the same batch (no grad), the sidecar's sums
               (:class:`~packshard.torch.pairs.reference.ReferenceLogps`), or none (SimPO)
    loss       dpo_loss(pairs, reference, beta, loss_type)   mean over the batch's pairs

:func:`dpo_step_loss` is that step for a plain loop; :class:`PackedDPOTrainer` is the same as
``transformers.Trainer.compute_loss``.  A batch without a pair contributes a zero loss that
keeps the graph (every rank still joins the gradient all-reduce).

:func:`check_pair_loss` is the recipe's own proof, run on the first batch before training: each
pair branch's summed log-probability from the packed forward against the same branch run
unpadded on its own (positions 0…n-1, no mask), for the policy and for a reference model; a
difference above ``tolerance`` (1e-4 nats, float32) raises
:class:`~packshard.torch.seams.SeamLeakError`.  It compares the sums, never the loss: at step
0 the policy equals the reference and the loss is ln 2 whatever the model sees.  A full causal
leak moves a tiny Llama's branch sums by 0.004 to 0.57 nats; a right setup agrees to 1e-6.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from transformers import Trainer

from packshard.errors import UsageError
from packshard.records import IGNORE_INDEX
from packshard.torch.collate import collate_varlen
from packshard.torch.pairs.logps import PairLogps, dpo_loss, pair_logps
from packshard.torch.pairs.reference import ReferenceLogps
from packshard.torch.seams import SeamLeakError, evaluating, packed_logits


def reference_sums(
    reference: Any, batch: Mapping[str, Any], pairs: PairLogps
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Return the reference's ``(chosen, rejected)`` sums: a model run on the batch, a sidecar."""
    if reference is None:
        return None
    if isinstance(reference, ReferenceLogps):
        return reference.for_pairs(pairs)
    with torch.no_grad():
        ref = pair_logps(packed_logits(reference, batch), batch)
    return ref.chosen, ref.rejected


def dpo_step_loss(
    model: Any,
    batch: Mapping[str, Any],
    reference: Any = None,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
) -> torch.Tensor:
    """Return the DPO loss of one collated batch of preference rows (differentiable).

    ``reference``: a frozen model, a :class:`ReferenceLogps` sidecar, or None (``simpo``).
    """
    logits = packed_logits(model, batch)
    pairs = pair_logps(logits, batch)
    if len(pairs) == 0:
        return logits.sum() * 0.0
    ref = reference_sums(reference, batch, pairs)
    return dpo_loss(pairs, ref, beta=beta, loss_type=loss_type)


def _alone_sum(model: Any, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Return one segment's summed label log-probability, the segment run alone, unpadded."""
    device = next(model.parameters()).device
    logits = model(input_ids=ids[None].to(device), use_cache=False).logits[0].float()
    target = labels[1:].to(device)
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, target.clamp(min=0)[:, None])[:, 0]
    return (logp.double() * (target != IGNORE_INDEX)).sum()


def _one_by_one(model: Any, batch: Mapping[str, Any], pairs: PairLogps) -> PairLogps:
    """Each pair branch of ``batch`` run alone: the sums ``pair_logps`` should have found."""
    ids, labels = batch["input_ids"].reshape(-1), batch["labels"].reshape(-1)
    cu = batch["cu_seqlens"].to(torch.int64).tolist()
    owners = batch["example_ids"].tolist()
    start = {int(e): (cu[j], cu[j + 1]) for j, e in enumerate(owners) if e >= 0}
    sums = []
    for group in (pairs.chosen_example_ids, pairs.rejected_example_ids):
        spans = [start[int(e)] for e in group.tolist()]
        sums.append(
            torch.stack([_alone_sum(model, ids[a:b], labels[a:b]) for a, b in spans])
            if spans
            else torch.zeros(0, dtype=torch.float64)
        )
    return dataclasses.replace(pairs, chosen=sums[0], rejected=sums[1])


def _worst_branch(model: Any, batch: Mapping[str, Any]) -> tuple[float, str]:
    """Return the largest |packed - alone| branch sum of ``model`` on ``batch``, and its branch."""
    with evaluating(model):
        packed = pair_logps(packed_logits(model, batch), batch)
        if len(packed) == 0:
            raise UsageError("check_pair_loss got a batch without a pair: give it another")
        alone = _one_by_one(model, batch, packed)
    moved = torch.stack(
        [(packed.chosen - alone.chosen).abs(), (packed.rejected - alone.rejected).abs()]
    )
    worst = int(moved.argmax())
    side, pair = divmod(worst, moved.shape[1])
    owners = packed.rejected_example_ids if side else packed.chosen_example_ids
    name = f"{'rejected' if side else 'chosen'} branch of example {int(owners[pair])}"
    return float(moved.flatten()[worst]), name


def check_pair_loss(
    model: Any,
    batch: Mapping[str, Any],
    reference: Any = None,
    *,
    tolerance: float = 1e-4,
) -> float:
    """Raise :class:`SeamLeakError` unless every pair branch's packed log-probability is its own.

    ``batch`` is a :func:`~packshard.torch.collate.collate_varlen` batch of preference rows
    (it needs ``example_ids``).  Each branch's summed log-probability from the packed forward
    is compared with the branch run alone, for ``model`` and for ``reference`` when it is a
    model.  Runs in eval mode without gradients (modes are restored) and returns the largest
    ``|packed - alone|`` in nats; ``tolerance`` suits float32.
    """
    if "example_ids" not in batch or "branch" not in batch:
        raise UsageError("check_pair_loss needs a collate_varlen batch of preference rows")
    models = [("policy", model)]
    if reference is not None and not isinstance(reference, ReferenceLogps):
        models.append(("reference", reference))
    found = 0.0
    for role, net in models:
        delta, where = _worst_branch(net, batch)
        if not delta <= tolerance:
            raise SeamLeakError(
                f"the {role} model's summed log-probability of the {where} differs packed "
                f"from the branch run alone by {delta:.2e} > {tolerance:.0e}: it sees across "
                "the seams of a packed row (feed it position_ids with use_cache=False and no "
                "2-D attention_mask, or a 4-D block-causal mask)"
            )
        found = max(found, delta)
    return found


class PackedDPOTrainer(Trainer):
    """``transformers.Trainer`` that trains DPO on packed preference rows.

    Pass a :class:`~packshard.torch.PackedDataset` of a preference pack as ``train_dataset``
    and ``TrainingArguments(remove_unused_columns=False)`` (the loss reads ``branch`` and
    ``example_ids``); rows are batched by :func:`~packshard.torch.collate.collate_varlen`.
    ``reference``: a frozen model, a :class:`ReferenceLogps` sidecar, or None for ``simpo``.
    The first batch is checked with :func:`check_pair_loss` (``check=False`` skips it).
    """

    def __init__(
        self,
        *args: Any,
        reference: Any = None,
        beta: float = 0.1,
        loss_type: str = "sigmoid",
        check: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("data_collator", collate_varlen)
        super().__init__(*args, **kwargs)
        if self.args.remove_unused_columns:
            raise UsageError(
                "PackedDPOTrainer needs TrainingArguments(remove_unused_columns=False): the "
                "trainer would drop the batch's branch and example_ids, which the loss reads"
            )
        self.reference, self.beta, self.loss_type = reference, beta, loss_type
        self.check = check
        self.pair_check_delta: float | None = None
        if reference is not None and not isinstance(reference, ReferenceLogps):
            reference.eval().requires_grad_(False)

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        """Return the DPO loss of the batch's pairs (:func:`dpo_step_loss`)."""
        if self.check and self.pair_check_delta is None:
            self.pair_check_delta = check_pair_loss(model, inputs, self.reference)
        loss = dpo_step_loss(
            model, inputs, self.reference, beta=self.beta, loss_type=self.loss_type
        )
        return (loss, None) if return_outputs else loss
