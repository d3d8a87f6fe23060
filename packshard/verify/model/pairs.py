"""Preference pairs through the model check: each pair's log-probabilities packed and alone.

A DPO loss is ``-log σ(β ((c - c_ref) - (r - r_ref)))``: a difference of two sums of
log-probabilities, so one leaked token or one shifted label moves it silently.  On rows of a
preference pack (shards with the per-segment ``branch`` column: 1 chosen, 2 rejected, the
rejected right after its chosen), the forwards the model stage already ran
(:func:`~packshard.verify.model.forward.run_forwards`) give, for every pair::

    row        [ c c c c c c | r r r r r | x x ]          branch 1, 2, 0
    packed     block-causal, stored positions  → c_packed, r_packed   (summed logp of the
    alone      each branch on its own          → c_alone,  r_alone     trained tokens, through
    control    one causal mask over the row    → c_naive,  r_naive     pair_logps' own sums)

    token Δ    max over the pair's trained tokens of |logp_t packed - logp_t alone|  ≤ atol
    sum Δ      max(|c_packed - c_alone|, |r_packed - r_alone|)                        ≤ atol
    loss Δ     |dpo(c_packed, r_packed) - dpo(c_alone, r_alone)|                      ≤ atol
    control Δ  the larger of: max over the pair's trained tokens of |logp_t naive - logp_t
               alone|, and max(|c_naive - c_alone|, |r_naive - r_alone|)  ≥ 1e-2 for ≥ 95%
               of pairs

``atol`` is the model stage's 1e-4 (float32).  The control is judged on each token and each
sum: on a small random model a leak's signed moves can cancel in a sum, while on a long
answer many small moves of one sign add up in it (``docs/verify.md``, "What a leak moves
in a pair").

The DPO loss is taken with ``β = 0.1`` against a zero reference (the reference's sums are
constants of the pair).  Under the naive control every rejected branch sees its chosen one,
so a model that moves fewer than 95% of pairs by 1e-2 cannot see leakage, and the stage
fails.  The sums are the reader's own :func:`packshard.torch.pairs.logps.segment_logps`.  The
crop keeps pairs whole; a torn pair is an issue, and so is a run that checked no pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from packshard.verify.findings import Issue, PairResult

if TYPE_CHECKING:
    import torch

    from packshard.verify.model.forward import Forwards

BETA = 0.1
CONTROL_PAIR_DELTA = 1e-2
CONTROL_PAIR_SHARE = 0.95


def _sums(logits: torch.Tensor, labels: torch.Tensor, cu: torch.Tensor) -> tuple[Any, Any]:
    from packshard.torch.pairs.logps import segment_logps

    sums, counts = segment_logps(logits[None], labels[None], cu)
    return sums.double(), counts


def _token_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    from packshard.torch.collate import token_losses

    return -token_losses(logits[None], labels[None])[0]


def _dpo(chosen: float, rejected: float) -> float:
    return float(np.logaddexp(0.0, -BETA * (chosen - rejected)))  # -log σ(β (c - r))


def compare_pairs(
    out: Forwards,
    cu: np.ndarray,
    labels: np.ndarray,
    branch: np.ndarray,
    example_ids: np.ndarray,
    index: int,
    name: str,
) -> tuple[list[PairResult], list[Issue]]:
    """Compare every whole pair of one row packed, alone and under the control."""
    import torch

    segments = len(cu) - 1
    branch = np.asarray(branch[:segments], dtype=np.int64)
    issues: list[Issue] = []
    for j in np.flatnonzero(branch == 2).tolist():
        if j == 0 or branch[j - 1] != 1:
            issues.append(
                Issue(index, name, j, "a rejected branch does not follow its chosen", "pairs")
            )
    chosen = np.flatnonzero(branch == 1)
    bad = chosen[(chosen + 1 < segments) & (np.append(branch, 0)[chosen + 1] != 2)]
    issues += [
        Issue(index, name, int(j), "a chosen branch is not followed by its rejected", "pairs")
        for j in bad.tolist()
    ]
    whole = [int(j) for j in chosen.tolist() if j + 1 < segments and branch[j + 1] == 2]
    if not whole:
        return [], issues
    cu_t = torch.from_numpy(np.asarray(cu, dtype=np.int64))
    lab = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    packed, counts = _sums(out.packed, lab, cu_t)
    packed_tok = _token_logps(out.packed, lab)
    naive_tok = _token_logps(out.control, lab) if out.control is not None else None
    naive = _sums(out.control, lab, cu_t)[0] if out.control is not None else None
    results: list[PairResult] = []
    for j in whole:
        alone, token_delta, control = [], 0.0, None if naive_tok is None else 0.0
        for k in (j, j + 1):
            a, b = int(cu[k]), int(cu[k + 1])
            alone.append(float(_sums(out.alone[k], lab[a:b], torch.tensor([0, b - a]))[0][0]))
            alone_tok = _token_logps(out.alone[k], lab[a:b])
            token_delta = max(token_delta, float((packed_tok[a:b] - alone_tok).abs().max()))
            if naive_tok is not None and naive is not None and control is not None:
                moved = float((naive_tok[a:b] - alone_tok).abs().max())
                control = max(control, moved, abs(float(naive[k]) - alone[-1]))
        pk = [float(packed[j]), float(packed[j + 1])]
        loss_packed, loss_alone = _dpo(*pk), _dpo(*alone)
        results.append(
            PairResult(
                row=index,
                segment=j,
                chosen_example_id=int(example_ids[j]) if j < len(example_ids) else -1,
                rejected_example_id=int(example_ids[j + 1]) if j + 1 < len(example_ids) else -1,
                chosen_tokens=int(counts[j]),
                rejected_tokens=int(counts[j + 1]),
                logp_delta=max(abs(pk[i] - alone[i]) for i in (0, 1)),
                token_logp_delta=token_delta,
                loss_packed=loss_packed,
                loss_alone=loss_alone,
                loss_delta=abs(loss_packed - loss_alone),
                control_delta=control,
            )
        )
    return results, issues


def pair_issues(
    pairs: Sequence[PairResult], names: Sequence[str], atol: float
) -> tuple[list[Issue], dict[str, Any]]:
    """Judge the pairs of all checked rows: issues past ``atol`` or a blind control; a summary."""
    issues: list[Issue] = []
    for p in pairs:
        for delta, what, limit in (
            (p.token_logp_delta, "a token log-probability of the pair differs", f" > {atol:.0e}"),
            (p.logp_delta, "the pair's summed log-probabilities differ", f" > {atol:.0e}"),
            (p.loss_delta, "the pair's DPO loss differs", ""),
        ):
            if not delta <= atol:
                message = f"{what} packed vs alone by {delta:.1e}{limit}"
                issues.append(Issue(p.row, names[p.row], p.segment, message, "pairs"))
    if not pairs:
        why = "no whole pair was in the rows checked (raise --model-rows)"
        issues.append(Issue(-1, "pairs", None, why, "pairs"))
    controls = [p.control_delta for p in pairs if p.control_delta is not None]
    moved = sum(c >= CONTROL_PAIR_DELTA for c in controls)
    share = moved / len(controls) if controls else None
    if share is None or share < CONTROL_PAIR_SHARE:
        what = "no pair" if share is None else f"only {moved} of {len(controls)} pairs"
        why = (
            f"the naive causal control moved {what} by >= {CONTROL_PAIR_DELTA:.0e} "
            f"(needs {CONTROL_PAIR_SHARE:.0%}), so the pair check cannot see leakage "
            "(use a model that is sensitive to its context)"
        )
        issues.append(Issue(-1, "pairs", None, why, "pairs"))
    summary = {
        "pairs": len(pairs),
        "max_pair_logp_delta": max((p.logp_delta for p in pairs), default=0.0),
        "max_token_logp_delta": max((p.token_logp_delta for p in pairs), default=0.0),
        "max_pair_loss_delta": max((p.loss_delta for p in pairs), default=0.0),
        "control_pairs_moved": moved,
        "control_pairs_share": share,
        "control_min_pair_delta": min(controls) if controls else None,
        "per_pair": [
            {
                "row": names[p.row],
                "chosen_example_id": p.chosen_example_id,
                "rejected_example_id": p.rejected_example_id,
                "logp_delta": p.logp_delta,
                "token_logp_delta": p.token_logp_delta,
                "loss_delta": p.loss_delta,
                "control_delta": p.control_delta,
            }
            for p in pairs
        ],
    }
    return issues, summary
