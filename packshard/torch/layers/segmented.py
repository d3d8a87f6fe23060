"""An exact packed path for layers whose state runs along the row: one segment at a time.

Attention keeps a packed row's segments apart through its mask; the recurrent and
convolutional mixers of hybrid models (gated delta nets, Mamba-2, short convolutions) never
see that mask.  Their state is carried from token to token, so in a packed row the state at
the end of one example is the start of the next::

    row           [a0 a1 a2 | b0 b1 | c0 c1 c2]
    plain mixer   state ─────────────────────────►   b0 starts from a2's state: a leak
    segmented     [a0 a1 a2]  [b0 b1]  [c0 c1 c2]     each from a zero state, as alone

:func:`segment_layers` wraps every such mixer of a model (the kinds of
:mod:`packshard.torch.layers.kinds` in :data:`~packshard.torch.layers.kinds.STATEFUL`) so that
its forward runs on each segment's slice of the hidden states and concatenates the results.
Each slice is computed exactly as the example alone would be (same kernels, zero initial
state), at one kernel call per segment in those layers.

Where the seams come from, first match wins:

1. :func:`packed_segments` (a context manager taking ``cu_seqlens``), for loops that feed no
   positions (pure state-space models take no ``position_ids``);
2. the decoder layer's own ``position_ids`` (a restart, ``p[t] != p[t-1] + 1``, opens a
   segment: transformers' packed-sequence rule), read again when gradient checkpointing
   re-runs the layer;
3. the model call's ``cu_seq_lens_q``, ``seq_idx`` or ``position_ids``.

A model whose ``forward`` takes no ``position_ids`` has them removed after they are read, so
``collate_hf``'s batch works unchanged.  A KV cache during a packed forward is refused: the
segments would be appended to one cache.
"""

from __future__ import annotations

import inspect
import types
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import torch

from packshard.errors import UsageError
from packshard.torch.layers.kinds import STATEFUL, Layer, decoder_layers, model_layers
from packshard.torch.layers.locate import SeamLeakError, first_leak

_CACHE_KEYS = ("cache", "cache_params", "past_key_values", "past_key_value")
_BOUNDARY_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")


@dataclass
class _Seams:
    """The segment starts of each row of the current forward (None: not packed)."""

    explicit: list[list[int]] | None = None
    model: list[list[int]] | None = None
    layer: list[list[int]] | None = None
    layers: list[Layer] = field(default_factory=list)
    masks: bool = False
    withheld: bool = False
    read_from: Any = None
    """The ``position_ids`` tensor ``layer`` was read from (one host copy a forward, not one a
    layer: on a GPU each read waits for the device)."""

    def current(self) -> list[list[int]] | None:
        if self.withheld:
            return None
        return self.explicit or self.layer or self.model


_INSTALLED: weakref.WeakKeyDictionary[Any, _Seams] = weakref.WeakKeyDictionary()


def _cuts(values: torch.Tensor, step: int) -> list[list[int]]:
    """Each row's bounds ``[0, s1, …, T]``: a segment starts where ``v[t] != v[t-1] + step``."""
    rows = values.detach().to("cpu", torch.int64).reshape(-1, values.shape[-1])
    starts = torch.ones_like(rows, dtype=torch.bool)
    starts[:, 1:] = rows[:, 1:] != rows[:, :-1] + step
    length = int(rows.shape[1])
    return [[*row.nonzero().flatten().tolist(), length] for row in starts]


def cuts_from_positions(positions: torch.Tensor) -> list[list[int]]:
    """Return each row's segment bounds ``[0, s1, …, T]`` from restarting ``positions``."""
    return _cuts(positions, 1)


def cuts_from_cu(cu_seqlens: Any, length: int) -> list[list[int]]:
    """Return the one row's bounds from ``cu_seqlens`` (padding past its end is a segment)."""
    cu = [int(v) for v in torch.as_tensor(cu_seqlens).reshape(-1).tolist()]
    bounds = sorted({b for b in cu if 0 <= b <= length} | {0, length})
    return [bounds]


def _text_positions(positions: torch.Tensor) -> torch.Tensor:
    """Multimodal rotary positions ``[3 or 4, B, T]`` hold the text row first when 4."""
    return positions[0] if positions.dim() == 3 else positions


def _cuts_from_kwargs(kwargs: dict[str, Any]) -> list[list[int]] | None:
    ids = kwargs.get("input_ids")
    length = int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else None
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None and length is not None:
        return cuts_from_cu(cu, length)
    seq_idx = kwargs.get("seq_idx")
    if isinstance(seq_idx, torch.Tensor):
        return _cuts(seq_idx, 0)  # one index a segment
    positions = kwargs.get("position_ids")
    if isinstance(positions, torch.Tensor):
        return cuts_from_positions(_text_positions(positions))
    return None


def _slice(value: Any, row: int, a: int, b: int, rows: int, length: int) -> Any:
    """Cut a keyword argument to one segment where its shape follows the hidden states."""
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return value
    if value.shape[0] == rows and value.shape[1] == length:
        return value[row : row + 1, a:b]
    if value.dim() == 4 and value.shape[-1] == length and value.shape[-2] == length:
        return value[row : row + 1, :, a:b, a:b]
    return value


def _join(parts: Sequence[Any], dim: int) -> Any:
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(list(parts), dim=dim)
    if isinstance(first, tuple):
        return tuple(_join([p[i] for p in parts], dim) for i in range(len(first)))
    return first  # None or a value that does not follow the sequence


_PRIOR = "segment_layers_prior_forward"
"""Where a module's own instance-level ``forward`` (an accelerate hook's) is kept, if it had one."""


def _wrap(module: Any, seams: _Seams, layer: Layer) -> None:
    """Replace ``module.forward`` by a per-segment forward bound to the module.

    Bound, not a closure over the original: a deep copy (a DPO reference model made from the
    policy) then runs the copy's own weights, not the policy's.
    """
    if "forward" in module.__dict__:
        module.__dict__[_PRIOR] = module.__dict__["forward"]

    def forward(self: Any, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        original = self.__dict__.get(_PRIOR) or type(self).forward.__get__(self)
        cuts = seams.current()
        rows, length = int(hidden_states.shape[0]), int(hidden_states.shape[1])
        if cuts is None or len(cuts) != rows or all(len(c) <= 2 for c in cuts):
            return original(hidden_states, *args, **kwargs)
        if any(c[-1] != length for c in cuts):
            raise UsageError(
                f"{layer.describe()}: the row has {length} tokens but its seams end at "
                f"{cuts[0][-1]} (pass position_ids, cu_seq_lens_q or packed_segments() that "
                "describe this forward's rows)"
            )
        if any(kwargs.get(k) is not None for k in _CACHE_KEYS):
            raise UsageError(
                f"{layer.describe()}: a cache is built during a packed forward, so the "
                "segments would share its state (pass use_cache=False)"
            )
        kwargs = {k: v for k, v in kwargs.items() if k not in _BOUNDARY_KEYS}
        out_rows = []
        for r, bounds in enumerate(cuts):
            parts = [
                original(
                    hidden_states[r : r + 1, a:b],
                    *args,
                    **{k: _slice(v, r, a, b, rows, length) for k, v in kwargs.items()},
                )
                for a, b in pairwise(bounds)
            ]
            out_rows.append(_join(parts, dim=1))
        return _join(out_rows, dim=0)

    module.forward = types.MethodType(forward, module)


def _accepts(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


@dataclass(frozen=True, slots=True)
class SegmentedLayers:
    """What :func:`segment_layers` did to a model."""

    layers: tuple[Layer, ...]
    """The recurrent, state-space and convolutional mixers now run one segment at a time."""
    masks: bool
    """Whether block-causal masks are passed to attention (the model ignores restarts)."""
    probe: float | None
    """Max |Δlogit| of a two-segment probe row vs its segments alone (None: not run)."""


def _block_masks(model: Any, cuts: list[list[int]], dtype: torch.dtype) -> dict[str, Any]:
    """Additive ``[B, 1, T, T]`` masks per attention layer type: block-causal (∩ window)."""
    config = model.config
    types = {str(t) for t in getattr(config, "layer_types", None) or ()} | {"full_attention"}
    length = cuts[0][-1]
    seg = torch.stack(
        [torch.repeat_interleave(torch.arange(len(c) - 1), torch.tensor(c).diff()) for c in cuts]
    )
    q = torch.arange(length)[:, None]
    k = torch.arange(length)[None, :]
    allowed = (seg[:, :, None] == seg[:, None, :]) & (k <= q)
    device = next(model.parameters()).device
    masks: dict[str, Any] = {}
    for kind in types:
        if "attention" not in kind or "linear" in kind:
            masks[kind] = None  # a recurrent layer's own padding mask: none in a packed row
            continue
        keep = allowed
        window = getattr(config, "sliding_window", None)
        if kind == "sliding_attention" and window:
            keep = keep & (q - k < int(window))
        mask = torch.zeros(keep.shape, dtype=dtype)
        mask.masked_fill_(~keep, torch.finfo(dtype).min)
        masks[kind] = mask[:, None].to(device)
    return masks


def _probe_row(model: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Return the probe's 12 ids and restarting positions (two segments of 6), or None."""
    try:
        device = next(model.parameters()).device
        vocab = int(model.config.vocab_size)
    except (StopIteration, AttributeError):
        return None
    if device.type == "meta":
        return None
    ids = (torch.arange(12, device=device) * 7 + 3) % max(vocab, 2)
    return ids, torch.arange(12, device=device) % 6


def _probe(model: Any) -> float | None:
    """Max |Δlogit| of a ``[6 | 6]`` row fed with restarting positions vs each half alone."""
    probe = _probe_row(model)
    if probe is None:
        return None
    ids, positions = probe
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            row = model(input_ids=ids[None], position_ids=positions[None], use_cache=False).logits
            halves = [model(input_ids=ids[None, a : a + 6], use_cache=False).logits for a in (0, 6)]
    finally:
        model.train(training)
    return float((row[0].float() - torch.cat(halves, dim=1)[0].float()).abs().max())


def segment_layers(model: Any) -> SegmentedLayers:
    """Make ``model`` keep a packed row's seams in every layer; return what was done.

    Every stateful mixer is wrapped to run one segment at a time.  Then a two-segment probe
    row is run: where attention does not separate segments from restarting ``position_ids``
    (gpt-oss), block-causal masks per layer type are passed to it from then on.  Call it
    once, before wrapping the model for distributed training; the weights are unchanged.
    """
    if model in _INSTALLED:
        seams = _INSTALLED[model]
        return SegmentedLayers(tuple(seams.layers), seams.masks, None)
    seams = _Seams()
    stateful = [layer for layer in model_layers(model) if layer.kind in STATEFUL]
    modules = dict(model.named_modules())
    for layer in stateful:
        _wrap(modules[layer.path], seams, layer)
    seams.layers = stateful
    takes_positions = _accepts(model.forward, "position_ids")

    def model_hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args and "input_ids" not in kwargs and isinstance(args[0], torch.Tensor):
            kwargs = {**kwargs, "input_ids": args[0]}
            args = args[1:]
        seams.model = _cuts_from_kwargs(kwargs)
        seams.layer, seams.read_from = None, None
        cuts = seams.explicit or seams.model
        if seams.masks and kwargs.get("attention_mask") is None and cuts is not None:
            if any(len(c) > 2 for c in cuts):
                dtype = next(model.parameters()).dtype
                kwargs = {**kwargs, "attention_mask": _block_masks(model, cuts, dtype)}
        if not takes_positions and "position_ids" in kwargs:
            kwargs = {k: v for k, v in kwargs.items() if k != "position_ids"}
        return args, kwargs

    def layer_hook(_module: Any, _args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        positions = kwargs.get("position_ids")
        if isinstance(positions, torch.Tensor) and positions.dim() in (2, 3):
            if positions is not seams.read_from:  # every layer gets the one tensor: read once
                seams.layer = cuts_from_positions(_text_positions(positions))
                seams.read_from = positions

    model.register_forward_pre_hook(model_hook, with_kwargs=True)
    hosts = {layer.index for layer in stateful}
    for i, host in enumerate(decoder_layers(model)):
        if i in hosts:
            host.register_forward_pre_hook(layer_hook, with_kwargs=True)
    _INSTALLED[model] = seams
    probe = _probe(model)
    tolerance = 1e-3 if next(model.parameters()).dtype == torch.float32 else 5e-2
    impl = getattr(model.config, "_attn_implementation", None)
    if probe is not None and probe > tolerance and impl in ("eager", "sdpa", None):
        seams.masks = True
        probe = _probe(model)
    if probe is not None and probe > tolerance:
        raise _still_leaks(model, probe, tolerance, impl)
    return SegmentedLayers(tuple(stateful), seams.masks, probe)


def _still_leaks(model: Any, probe: float, tolerance: float, impl: Any) -> SeamLeakError:
    """Build the error for a model whose probe row still mixes its segments, naming the layer."""
    row = _probe_row(model)
    site = None
    if row is not None:
        ids, positions = row
        training = model.training
        model.eval()
        try:
            inputs = {"input_ids": ids[None], "position_ids": positions[None], "use_cache": False}
            site = first_leak(model, inputs, [(0, 6), (6, 12)], tolerance)
        finally:
            model.train(training)
    where = f", first at {site.describe()}" if site is not None else ""
    fix = (
        "load the model with attn_implementation='sdpa' or 'eager' and call segment_layers again"
        if impl not in ("eager", "sdpa", None)
        else "this architecture is not one segment_layers covers: train it on one example a row "
        "(packshard export OUT --to unpacked)"
    )
    return SeamLeakError(
        f"segment_layers could not keep a packed row's segments apart: a two-segment probe row "
        f"differs from its halves alone by max |Δlogit| {probe:.3g} (tolerance {tolerance:g})"
        f"{where} (attention implementation {impl!r}); {fix}"
    )


@contextmanager
def packed_segments(model: Any, cu_seqlens: Any) -> Iterator[None]:
    """Run the block's forwards of ``model`` with the seams of one ``[1, T]`` row given.

    For models that take no ``position_ids``; :func:`segment_layers` must have been called.
    """
    seams = _INSTALLED.get(model)
    if seams is None:
        raise UsageError("packed_segments: call packshard.torch.segment_layers(model) first")
    cu = torch.as_tensor(cu_seqlens).reshape(-1)
    seams.explicit = cuts_from_cu(cu, int(cu[-1]))
    try:
        yield
    finally:
        seams.explicit = None


def is_segmented(model: Any) -> bool:
    """Whether :func:`segment_layers` has been applied to ``model``."""
    return model in _INSTALLED


@contextmanager
def withheld(model: Any) -> Iterator[None]:
    """Run the block with the seams withheld from the wrapped mixers (a control that leaks)."""
    seams = _INSTALLED.get(model)
    if seams is None:
        yield
        return
    seams.withheld = True
    try:
        yield
    finally:
        seams.withheld = False
