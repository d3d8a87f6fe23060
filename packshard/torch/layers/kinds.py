"""What each layer of a transformers model does along the sequence, and how a seam breaks it.

A packed row is safe only where every layer that mixes tokens is handed the seams.  Layers
fall into seven kinds; the kind decides how a neighbour can leak in and what fixes it::

    kind               mixes tokens by                 a seam is kept by
    full attention     softmax over earlier tokens     a block-causal mask / restarting positions
    sliding attention  the same, within a window       the same mask, intersected with the window
    attention + sinks  the same, plus learned sinks    the same mask (a sink is per head)
    linear attention   a recurrent state (delta rule)  resetting the state: cu_seqlens, or one
                                                       segment at a time (segment_layers)
    state space        a recurrent SSM state + conv    seq_idx / cu_seqlens, or segment_layers
    convolution        a short causal conv window      the same
    router             nothing (per token), unless     per-segment statistics for the aux loss
                       capacity drops tokens

Kinds are read from the module classes transformers ships (names and parameters, never a
list of model names), so a family released after this module still gets a kind where its
mixer follows the same conventions; an unknown mixer is reported as such, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

FULL = "full attention"
SLIDING = "sliding attention"
SINKS = "attention with sinks"
LINEAR = "linear attention"
STATE_SPACE = "state space"
CONVOLUTION = "convolution"
ROUTER = "router"

STATEFUL = (LINEAR, STATE_SPACE, CONVOLUTION)
"""Kinds whose state runs through the whole row unless each is handed the seams."""

_LINEAR = re.compile(
    r"(DeltaNet|DeltaAttention|LinearAttention|LightningAttention|Rwkv\w*Attention)$"
)
_RECURRENT = re.compile(r"(RecurrentBlock|Rglru)$")
_STATE_SPACE = re.compile(r"(Mamba\w*|Mixer|SSM\w*|MambaLayer)$")
_CONVOLUTION = re.compile(r"ShortConv$")
_ROUTER = re.compile(r"(Router|TopkRouter|TopKRouter|Gate)$")
_ATTENTION = re.compile(r"Attention$")

FIXES = {
    FULL: (
        "feed position_ids that restart at every segment and no 2-D attention_mask "
        "(collate_hf), or a 4-D block-causal mask, or cu_seq_lens for flash attention"
    ),
    SLIDING: (
        "the same as full attention: the window is applied on top of the block-causal mask "
        "(collate_hf, a 4-D block-causal mask, or cu_seq_lens)"
    ),
    SINKS: "the same as full attention (sinks are per head): collate_hf or a 4-D block-causal mask",
    LINEAR: (
        "its recurrent state crosses the seam: wrap the model with "
        "packshard.torch.segment_layers(model) (runs these layers one segment at a time), or "
        "on a GPU pass flash_attn_kwargs(batch) with flash-linear-attention installed"
    ),
    STATE_SPACE: (
        "its SSM state and convolution cross the seam: wrap the model with "
        "packshard.torch.segment_layers(model), or on a GPU pass seq_idx / cu_seq_lens with "
        "the mamba_ssm kernels installed"
    ),
    CONVOLUTION: (
        "its convolution window crosses the seam: wrap the model with "
        "packshard.torch.segment_layers(model)"
    ),
    ROUTER: (
        "routing is per token, so a difference here means a capacity limit drops tokens by "
        "what else is in the row: set the capacity factor off (or to no dropping) for packed rows"
    ),
}


@dataclass(frozen=True, slots=True)
class Layer:
    """One token-mixing module of a model: where it sits and what kind it is."""

    index: int
    """The decoder layer it belongs to (its position in the model's layer list)."""
    path: str
    """The module's dotted name in the model (``model.layers.0.linear_attn``)."""
    cls: str
    """The module's class name (``Qwen3NextGatedDeltaNet``)."""
    kind: str

    def describe(self) -> str:
        """``layer 0 (Qwen3NextGatedDeltaNet, linear attention)``."""
        return f"layer {self.index} ({self.cls}, {self.kind})"


def kind_of(module: Any, prefix: str = "") -> str | None:
    """Return the kind of a token-mixing ``module``, or None for one that mixes no tokens.

    ``prefix`` is the model's own class-name prefix (``KimiLinear`` of
    ``KimiLinearForCausalLM``), removed first so that a family's name is not read as a kind.
    """
    name = type(module).__name__
    if prefix and name.startswith(prefix) and len(name) > len(prefix):
        name = name[len(prefix) :]
    if _LINEAR.search(name) or hasattr(module, "time_decay"):
        return LINEAR
    if _RECURRENT.search(name):
        return STATE_SPACE
    if _CONVOLUTION.search(name) or hasattr(module, "time_shift"):  # a token shift: width 2
        return CONVOLUTION
    if _ATTENTION.search(name) and not _STATE_SPACE.search(name):
        if getattr(module, "sinks", None) is not None:
            return SINKS
        return SLIDING if getattr(module, "sliding_window", None) else FULL
    if _STATE_SPACE.search(name) and (
        hasattr(module, "conv1d") or hasattr(module, "A_log") or hasattr(module, "A")
    ):
        return STATE_SPACE
    if _ROUTER.search(name) and "Experts" not in name:
        return ROUTER
    return None


def model_prefix(model: Any) -> str:
    """``Qwen3Next`` for ``Qwen3NextForCausalLM``: the family's part of its class names."""
    name = type(model).__name__
    for tail in ("ForCausalLM", "ForConditionalGeneration", "Model", "LMHeadModel"):
        if name.endswith(tail):
            return name[: -len(tail)]
    return ""


def decoder_layers(model: Any) -> list[Any]:
    """Return the model's list of decoder layers.

    The first ``ModuleList`` as long as the config's ``num_hidden_layers``, else the longest
    (a MoE block's list of experts may be longer than a tiny model's list of layers).
    """
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    for found in lists:
        if len(found) == layers:
            return found  # type: ignore[return-value]
    return max(lists, key=len, default=[])  # type: ignore[arg-type]


def model_layers(model: Any) -> list[Layer]:
    """Return every token-mixing module of ``model`` in execution order, with its kind.

    Modules nested in one another (an attention inside a mixer) are listed once, by the
    outermost that has a kind.
    """
    layers = decoder_layers(model)
    names = {id(m): n for n, m in model.named_modules()}
    prefix = model_prefix(model)
    found: list[Layer] = []
    for i, layer in enumerate(layers):
        taken: set[int] = set()
        for name, module in layer.named_modules():
            kind = kind_of(module, prefix)
            if kind is None or id(module) in taken:
                continue
            taken.update(id(m) for m in module.modules())
            found.append(Layer(i, names.get(id(module), name), type(module).__name__, kind))
    return found


def kind_counts(layers: list[Layer]) -> dict[str, int]:
    """Return how many modules of each kind ``layers`` hold, in the order first met."""
    counts: dict[str, int] = {}
    for layer in layers:
        counts[layer.kind] = counts.get(layer.kind, 0) + 1
    return counts
