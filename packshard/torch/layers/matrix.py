"""The family matrix: every architecture family, packed vs alone, through its packed path.

For each family a tiny random model is built from transformers' own default config
(:func:`~packshard.torch.layers.tiny.tiny_model`; where the default has no hybrid pattern, the
family's released one is given), then one packed row is run three ways and compared with its
segments alone, max |Δlogit| in float32 on the CPU::

    plain     collate_hf's batch (restarting position_ids, no mask), the model as built
    packed    the same batch after segment_layers(model)         → must be ≤ 1e-4
    control   packed, with the seams withheld from the recurrent,  → must leak, and
              state-space and convolutional layers                  name that layer's class

A family passes when ``packed`` holds and, for a hybrid, the control leaks at a stateful
layer; otherwise the refusal of :func:`~packshard.torch.seams.check_model` is its verdict
(docs/families.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch

from packshard.torch.layers.kinds import STATEFUL, kind_counts, model_layers
from packshard.torch.layers.segmented import segment_layers, withheld
from packshard.torch.layers.tiny import tiny_model

TOLERANCE = 1e-4

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen3": {},
    "qwen3_moe": {},
    "gemma3_text": {},
    "gpt_oss": {},
    "olmo3": {},
    "qwen3_next": {},
    "qwen3_5_text": {},
    "qwen3_5_moe_text": {},
    "qwen4_exp_text": {  # its default config has no indexer; a released one sets it
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 32,
        "indexer_compress_ratio": 8,
    },
    "bamba": {"attn_layer_indices": [1, 3]},
    "falcon_h1": {},
    "jamba": {},
    "nemotron_h": {},
    "granitemoehybrid": {"layer_types": ["mamba", "attention", "mamba", "attention"]},
    "zamba": {},
    "zamba2": {},
    "lfm2": {"layer_types": ["conv", "conv", "full_attention"] * 2, "full_attn_idxs": None},
    "lfm2_moe": {"layer_types": ["conv", "conv", "full_attention"] * 2},
    "lfm3": {},
    "minimax": {},
    "kimi_linear": {},
    "bailing_hybrid": {},
    "lara_mini": {},
    "olmo_hybrid": {},
    "recurrent_gemma": {},
    "mamba": {},
    "mamba2": {},
    "falcon_mamba": {},
    "rwkv": {},
}
"""Model types and the config fields set beyond transformers' defaults (a hybrid pattern)."""


def family_config(family: str) -> dict[str, Any]:
    """Return the ``config.json`` mapping the matrix builds ``family`` from (defaults + pattern)."""
    from transformers import AutoConfig

    config = {**AutoConfig.for_model(family).to_dict(), **FAMILIES.get(family, {})}
    if isinstance(FAMILIES.get(family, {}).get("layer_types"), list):
        config["num_hidden_layers"] = len(config["layer_types"])
    return config


@dataclass(frozen=True, slots=True)
class FamilyResult:
    """One row of the matrix."""

    family: str
    kinds: dict[str, int]
    segmented: tuple[str, ...]
    masks: bool
    plain: float | None
    packed: float | None
    control: float | None
    control_layer: str | None
    error: str | None

    @property
    def verdict(self) -> str:
        """``passes``, ``refused: …`` or ``not built: …``."""
        if self.error is not None:
            return self.error
        assert self.packed is not None
        if self.packed > TOLERANCE:
            return f"refused: packed differs by {self.packed:.2g}"
        if self.segmented and not control_caught(self.control, self.packed, self.control_layer):
            return "refused: the control does not leak"
        return "passes"


def control_caught(control: float | None, packed: float, layer: str | None) -> bool:
    """Say whether a withheld-seams control is caught: a stateful layer is named and logits move.

    The logits must move ten times more than the packed path's own noise (a short
    convolution leaks into two tokens a segment, ~1e-3 on a random model; a Mamba layer ~0.5).
    """
    stateful = layer is not None and any(kind in layer for kind in STATEFUL)
    return stateful and control is not None and control > 10 * max(packed, 1e-6)


def _first_row(logits: Any) -> torch.Tensor:
    return logits[0].float()


def max_delta(model: Any, batch: Mapping[str, Any], segments: Sequence[tuple[int, int]]) -> float:
    """Max |Δlogit| of the batch's row vs each segment alone (the model in eval mode)."""
    ids = batch["input_ids"].reshape(-1)
    with torch.no_grad():
        row = _first_row(model(**batch, use_cache=False).logits)
        return max(
            float(
                (row[a:b] - _first_row(model(input_ids=ids[a:b][None], use_cache=False).logits))
                .abs()
                .max()
            )
            for a, b in segments
        )


def check_family(
    family: str, ids: torch.Tensor, cu_seqlens: Sequence[int], seed: int = 0
) -> FamilyResult:
    """Build ``family`` tiny and run one packed row (``ids``, ``cu_seqlens``) three ways."""
    from packshard.errors import UsageError
    from packshard.torch.layers.locate import first_leak

    config = family_config(family)
    vocab = int(ids.max()) + 1
    try:
        model = tiny_model(config, max(vocab, 256), seed=seed)
    except UsageError as exc:
        return FamilyResult(family, {}, (), False, None, None, None, None, f"not built: {exc}")
    segments = list(pairwise(int(c) for c in cu_seqlens))
    positions = torch.cat([torch.arange(b - a) for a, b in segments])
    batch = {"input_ids": ids[None], "position_ids": positions[None]}
    kinds = kind_counts(model_layers(model))
    try:
        plain: float | None = max_delta(model, batch, segments)
    except (TypeError, ValueError, RuntimeError):  # no position_ids taken, or a shape refused
        plain = None
    try:
        done = segment_layers(model)
        packed = max_delta(model, batch, segments)
        control, where = None, None
        if done.layers:
            with withheld(model):
                control = max_delta(model, batch, segments)
                site = first_leak(model, {**batch, "use_cache": False}, segments, TOLERANCE)
                where = site.describe() if site is not None else None
    except (RuntimeError, ValueError, TypeError, UsageError) as exc:
        message = str(exc).splitlines()[0][:160]
        return FamilyResult(
            family, kinds, (), False, plain, None, None, None, f"refused: {message}"
        )
    names = tuple(sorted({layer.cls for layer in done.layers if layer.kind in STATEFUL}))
    error = None
    if packed > TOLERANCE:
        site = first_leak(model, {**batch, "use_cache": False}, segments, TOLERANCE)
        error = f"refused: packed differs by {packed:.2g}, first at " + (
            site.describe() if site is not None else "no single layer"
        )
    return FamilyResult(family, kinds, names, done.masks, plain, packed, control, where, error)


@dataclass(frozen=True, slots=True)
class BalanceFigures:
    """A MoE family's load-balancing loss on one packed row, four ways."""

    packed: float
    """transformers' ``aux_loss`` of the packed row."""
    padded: float
    """The same examples as a padded batch, padding masked: the same pool of tokens."""
    mean_alone: float
    """The mean of each example's ``aux_loss`` run alone."""
    per_segment: float
    """:func:`~packshard.torch.layers.routers.segment_balance_loss` of the packed row."""


def balance_figures(
    family: str, ids: torch.Tensor, cu_seqlens: Sequence[int], seed: int = 0
) -> BalanceFigures:
    """Compare a MoE family's auxiliary loss packed, padded, alone and per segment."""
    from packshard.torch.layers.routers import segment_balance_loss

    model = tiny_model(
        {**family_config(family), "output_router_logits": True}, int(ids.max()) + 1, seed=seed
    )
    segments = list(pairwise(int(c) for c in cu_seqlens))
    positions = torch.cat([torch.arange(b - a) for a, b in segments])
    longest = max(b - a for a, b in segments)
    padded_ids = torch.zeros(len(segments), longest, dtype=torch.long)
    mask = torch.zeros(len(segments), longest, dtype=torch.long)
    for i, (a, b) in enumerate(segments):
        padded_ids[i, : b - a], mask[i, : b - a] = ids[a:b], 1
    with torch.no_grad():
        packed = model(input_ids=ids[None], position_ids=positions[None], use_cache=False)
        padded = model(input_ids=padded_ids, attention_mask=mask, use_cache=False)
        alone = [
            float(model(input_ids=ids[None, a:b], use_cache=False).aux_loss) for a, b in segments
        ]
    experts = int(getattr(model.config, "num_experts", 0) or model.config.num_local_experts)
    per = segment_balance_loss(
        packed.router_logits, cu_seqlens, experts, int(model.config.num_experts_per_tok)
    )
    return BalanceFigures(
        float(packed.aux_loss), float(padded.aux_loss), sum(alone) / len(alone), float(per)
    )
