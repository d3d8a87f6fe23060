"""Packed-vs-unpacked model equivalence, with a leaking control that must be caught.

A packed row is only safe if a causal model computes, for every segment, exactly what it
would compute on that example alone.  This module runs a small causal language model three
ways on each sampled row and compares per-token logits and per-segment loss::

    row      [a0 a1 a2 | b0 b1 | c0 c1 c2 c3]        cu_seqlens = [0, 3, 5, 9]
    packed   positions 0 1 2  0 1  0 1 2 3 (as stored), block-causal mask:
                 a0 a1 a2 b0 b1 c0 ..
             a2 [ 1  1  1  .  .  .      ]     a token sees only earlier tokens of
             b1 [ .  .  .  1  1  .      ]     its own segment
    alone    [a0 a1 a2], [b0 b1], [c0 c1 c2 c3], each with positions 0..n-1, plain causal
    control  the same row as naive concatenation: one causal mask over all 9 tokens and
             positions 0..8, so b and c see everything before them

Checks, for each row (all in float32 unless the caller passes another model):

1. packed vs alone: max |logit delta| over every token and vocabulary entry of a segment,
   and |loss delta| (mean cross entropy of the segment's labels, shifted by one, ``-100``
   ignored; the segment's first label is ``-100`` by contract, so no label crosses a seam).
2. mutation: two more packed forwards, one keeping the even segments and replacing every
   token of the odd ones with a different random token, one the other way round; a kept
   segment's logits must not move (both neighbours of every segment are mutated).
3. control: segments after the first must differ from alone by more than
   ``max(100 * atol, 1e-3)`` under the naive mask.  If they do not, the model cannot see
   leakage, and a passing check 1 would prove nothing; that is a finding too.  A row with
   one segment cannot leak and its control is "not applicable".

Tolerance: ``atol = 1e-4`` on logits and loss.  The forwards run the same float32 kernels
on the same tokens; they differ only in matrix shapes and masked-out terms, whose softmax
weight is exactly 0.  On 8 rows of ~2,000 tokens (5-13 segments) the tiny model measured
packed-vs-alone logit deltas of 2e-7 to 4e-7, loss deltas below 1e-6, mutation deltas of
exactly 0, and a naive-control leak of 0.63 to 0.86: 1e-4 sits about 2.5 decades above the
noise and 3.8 below the leak.  A random model's loss stays near ln(vocab) either way (8.3321
true vs 8.3317 naive there), so the logit leak, not the loss gap, is the control's signal.

The tiny model is a random ``LlamaForCausalLM`` (rotary positions).  Rotary attention
depends only on position differences, so a segment whose stored positions are shifted by a
constant gives the same logits; position resets are therefore also checked directly
(stored positions of each segment must be ``0..n-1``).  Token ids at or above the model's
vocabulary are folded modulo its size: the tiny model keeps 4,096 entries, so that a
2,048-token forward costs ~35 ms on two CPU cores instead of ~280 ms at a 32k vocabulary.
The "alone" forwards run one segment at a time: for 50 segments in 2,048 tokens that costs
~60 ms, against ~20 ms for one right-padded batch, but a padded batch of skewed lengths
holds segments x longest x vocab logits (1 GB for 50 x 1,500 x 4,096), so memory wins.
A demo-size check (8 rows x 2,048 tokens, 5-13 segments each) takes ~1.5 s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from packshard.errors import UsageError
from packshard.records import IGNORE_INDEX, PackedRow

if TYPE_CHECKING:
    import torch

DEFAULT_ATOL = 1e-4
TINY_VOCAB = 4096
CONTROL_FLOOR = 1e-3


@dataclass(frozen=True, slots=True)
class SegmentResult:
    """One segment's comparison; deltas are max absolute differences (None: not measured)."""

    segment: int
    example_id: int
    num_tokens: int
    logit_delta: float
    loss_packed: float | None
    loss_alone: float | None
    loss_delta: float
    mutation_delta: float | None
    control_delta: float | None


@dataclass(frozen=True, slots=True)
class RowResult:
    """One row's comparison; ``control`` is ``detected``, ``not detected`` or ``not applicable``."""

    row: int
    name: str
    num_tokens: int
    segments: tuple[SegmentResult, ...]
    max_logit_delta: float
    max_loss_delta: float
    mutation_delta: float | None
    control_delta: float | None
    control: str
    loss_true: float | None
    loss_naive: float | None
    loss_tokens: int


@dataclass(frozen=True, slots=True)
class EquivalenceReport:
    """Everything :func:`check_rows` measured; ``ok`` is true when ``findings`` is empty."""

    rows: tuple[RowResult, ...]
    max_logit_delta: float
    max_loss_delta: float
    max_mutation_delta: float | None
    control_min_delta: float | None
    control_max_delta: float | None
    control_threshold: float
    control_detected: bool
    loss_true: float | None
    loss_naive: float | None
    ok: bool
    atol: float
    vocab_folded: bool
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as plain JSON-ready values."""
        return asdict(self)


def build_tiny_model(vocab_size: int, seed: int = 0, max_seq_len: int = 8192) -> Any:
    """Return a small random float32 ``LlamaForCausalLM`` in eval mode on the CPU.

    The weights depend only on ``seed`` (the global torch generator is left untouched).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    settings: dict[str, Any] = dict(
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
    config = LlamaConfig(**settings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = LlamaForCausalLM(config)
    return model.float().eval()


def load_model(spec: str, vocab_size: int, seed: int = 0) -> Any:
    """Return the model named by ``spec``: ``tiny``, or a local Hugging Face model folder.

    ``tiny`` keeps at most :data:`TINY_VOCAB` vocabulary entries (larger ids are folded).
    A folder is loaded offline, without remote code, in float32.
    """
    if spec == "tiny":
        return build_tiny_model(min(vocab_size, TINY_VOCAB), seed=seed)
    folder = Path(spec)
    if not (folder / "config.json").is_file():
        raise UsageError(
            f"{spec}: not a model folder (no config.json) (use --model tiny or a local folder)"
        )
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder,
        local_files_only=True,
        trust_remote_code=False,
        torch_dtype=torch.float32,
        attn_implementation="sdpa",
    )
    return model.eval()


def build_block_mask(cu_seqlens: np.ndarray, causal_only: bool = False) -> torch.Tensor:
    """Return the additive float32 mask ``[1, 1, T, T]``: 0 where a token may attend, else -inf.

    With ``causal_only`` the segments are ignored (the naive-concatenation control).
    """
    import torch

    cu = np.asarray(cu_seqlens, dtype=np.int64)
    num_tokens = int(cu[-1])
    allowed = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
    if not causal_only:
        seg = torch.from_numpy(np.repeat(np.arange(cu.size - 1), np.diff(cu)))
        allowed &= seg[:, None] == seg[None, :]
    mask = torch.zeros(num_tokens, num_tokens, dtype=torch.float32)
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return mask[None, None]


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


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def _mean(total: float, count: int) -> float | None:
    return total / count if count else None


def _row_problem(row: PackedRow) -> str | None:
    cu = np.asarray(row.cu_seqlens, dtype=np.int64)
    n = row.num_tokens
    if cu.size < 2 or cu[0] != 0 or cu[-1] != n or np.any(np.diff(cu) <= 0):
        return f"cu_seqlens {cu.tolist()[:8]} is not [0, …, {n}] strictly increasing"
    if row.labels.shape[0] != n or row.position_ids.shape[0] != n:
        return f"labels/position_ids lengths differ from input_ids ({n} tokens)"
    if n and int(np.min(row.input_ids)) < 0:
        return "negative token id"
    return None


def check_row(
    model: Any, row: PackedRow, index: int, name: str, atol: float, mutate: bool, seed: int
) -> tuple[RowResult | None, list[str]]:
    """Compare one row packed, alone, mutated and under the naive control; return findings."""
    import torch

    problem = _row_problem(row)
    if problem is not None:
        return None, [f"{name}: {problem}; row not checked"]
    vocab = int(model.config.vocab_size)
    cu = np.asarray(row.cu_seqlens, dtype=np.int64)
    ids = np.asarray(row.input_ids, dtype=np.int64) % vocab
    labels = np.asarray(row.labels, dtype=np.int64)
    labels = np.where(labels == IGNORE_INDEX, IGNORE_INDEX, labels % vocab)
    positions = np.asarray(row.position_ids, dtype=np.int64)
    nseg = cu.size - 1
    findings: list[str] = []
    threshold = max(100 * atol, CONTROL_FLOOR)

    with torch.inference_mode():
        block = build_block_mask(cu)
        packed = forward_logits(model, ids, positions, block)
        alone = [forward_logits(model, ids[a:b], None, None) for a, b in pairwise(cu)]
        mutated: list[torch.Tensor] = []
        control = None
        if nseg > 1:
            naive_mask = build_block_mask(cu, causal_only=True)
            control = forward_logits(model, ids, np.arange(ids.size), naive_mask)
            if mutate:
                rng = np.random.default_rng(seed + index)
                for keep in (0, 1):
                    mut = mutate_tokens(ids, cu, keep, vocab, rng)
                    mutated.append(forward_logits(model, mut, positions, block))

    segments: list[SegmentResult] = []
    sums = {"packed": 0.0, "alone": 0.0, "naive": 0.0}
    count_total = 0
    for j, (a, b) in enumerate(pairwise(cu.tolist())):
        where = f"{name} segment {j}"
        if not np.array_equal(positions[a:b], np.arange(b - a)):
            findings.append(
                f"{where}: position_ids start at {positions[a]} and are not 0..{b - a - 1}"
                " as the example has alone (rotary models cannot see a constant shift)"
            )
        seg_labels = labels[a:b]
        p_sum, count = score_loss(packed[a:b], seg_labels)
        a_sum, _ = score_loss(alone[j], seg_labels)
        logit_delta = _max_abs(packed[a:b], alone[j])
        loss_delta = abs(p_sum - a_sum) / count if count else 0.0
        mutation_delta = None
        if mutated:
            mutation_delta = _max_abs(mutated[j % 2][a:b], packed[a:b])
        control_delta = None
        if control is not None:
            sums["naive"] += score_loss(control[a:b], seg_labels)[0]
            if j > 0:
                control_delta = _max_abs(control[a:b], alone[j])
        sums["packed"] += p_sum
        sums["alone"] += a_sum
        count_total += count
        if not logit_delta <= atol:
            findings.append(
                f"{where}: packed logits differ from alone by {logit_delta:.1e} > {atol:.0e}"
            )
        if not loss_delta <= atol:
            findings.append(f"{where}: packed loss differs from alone by {loss_delta:.1e}")
        if mutation_delta is not None and not mutation_delta <= atol:
            findings.append(
                f"{where}: logits move by {mutation_delta:.1e} when the neighbouring"
                " segments' tokens are replaced (attention crosses the seam)"
            )
        segments.append(
            SegmentResult(
                segment=j,
                example_id=int(row.example_ids[j]) if j < len(row.example_ids) else -1,
                num_tokens=b - a,
                logit_delta=logit_delta,
                loss_packed=_mean(p_sum, count),
                loss_alone=_mean(a_sum, count),
                loss_delta=loss_delta,
                mutation_delta=mutation_delta,
                control_delta=control_delta,
            )
        )

    leaks = [s.control_delta for s in segments if s.control_delta is not None]
    row_leak = max(leaks) if leaks else None
    if row_leak is None:
        verdict = "not applicable"
    elif row_leak > threshold:
        verdict = "detected"
    else:
        verdict = "not detected"
        findings.append(
            f"{name}: the naive causal control differs from alone by only {row_leak:.1e}"
            f" <= {threshold:.0e}, so this check cannot see leakage here"
            " (use a model that is sensitive to its context)"
        )
    mutations = [s.mutation_delta for s in segments if s.mutation_delta is not None]
    result = RowResult(
        row=index,
        name=name,
        num_tokens=row.num_tokens,
        segments=tuple(segments),
        max_logit_delta=max(s.logit_delta for s in segments),
        max_loss_delta=max(s.loss_delta for s in segments),
        mutation_delta=max(mutations) if mutations else None,
        control_delta=row_leak,
        control=verdict,
        loss_true=_mean(sums["alone"], count_total),
        loss_naive=_mean(sums["naive"] if control is not None else sums["alone"], count_total),
        loss_tokens=count_total,
    )
    return result, findings


def check_rows(
    model: Any,
    rows: Sequence[PackedRow],
    atol: float = DEFAULT_ATOL,
    mutate: bool = True,
    names: Sequence[str] | None = None,
    seed: int = 0,
) -> EquivalenceReport:
    """Check attention isolation on ``rows`` (design invariant 5) and return the report.

    ``names`` label the rows in findings (default ``row <i>``, ``i`` the index in ``rows``).
    """
    if names is not None and len(names) != len(rows):
        raise UsageError(f"check_rows: {len(names)} names for {len(rows)} rows")
    results: list[RowResult] = []
    findings: list[str] = []
    notes: list[str] = []
    vocab = int(model.config.vocab_size)
    folded = any(r.num_tokens and int(np.max(r.input_ids)) >= vocab for r in rows)
    for i, row in enumerate(rows):
        name = names[i] if names is not None else f"row {i}"
        result, row_findings = check_row(model, row, i, name, atol, mutate, seed)
        findings.extend(row_findings)
        if result is not None:
            results.append(result)
    leaks = [r.control_delta for r in results if r.control_delta is not None]
    if not results:
        findings.append("no row could be checked")
    elif not leaks:
        notes.append(
            "no checked row has two or more segments: nothing is packed together, so there"
            " is no seam to leak across and the naive control is not applicable"
        )
    if folded:
        notes.append(f"token ids >= {vocab} were folded modulo the model's vocabulary")
    mutations = [r.mutation_delta for r in results if r.mutation_delta is not None]
    counted = [r for r in results if r.loss_tokens]
    tokens = sum(r.loss_tokens for r in counted)
    return EquivalenceReport(
        rows=tuple(results),
        max_logit_delta=max((r.max_logit_delta for r in results), default=0.0),
        max_loss_delta=max((r.max_loss_delta for r in results), default=0.0),
        max_mutation_delta=max(mutations) if mutations else None,
        control_min_delta=min(leaks) if leaks else None,
        control_max_delta=max(leaks) if leaks else None,
        control_threshold=max(100 * atol, CONTROL_FLOOR),
        control_detected=bool(leaks) and all(r.control != "not detected" for r in results),
        loss_true=sum((r.loss_true or 0.0) * r.loss_tokens for r in counted) / tokens
        if tokens
        else None,
        loss_naive=sum((r.loss_naive or 0.0) * r.loss_tokens for r in counted) / tokens
        if tokens
        else None,
        ok=not findings,
        atol=atol,
        vocab_folded=folded,
        findings=findings,
        notes=notes,
    )
