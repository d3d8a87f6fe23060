"""Which layer first lets a segment see its neighbour: forward hooks, packed vs alone.

When a packed row's logits differ from its segments run alone, the logits say *that* the
model leaks, not *where*.  Hooks on every decoder layer and on every token-mixing module
inside it (:func:`~packshard.torch.layers.kinds.model_layers`) record their outputs for the
row and for each segment alone; walking the layers in order, the first decoder layer whose
output differs is where the leak enters (its input still agreed), and inside it the first
mixer, in the order they ran, whose output differs is the culprit::

    decoder layer      0        1          2        3
    Δ output (seg 2)   2e-7     2e-7       0.091    0.12      ← enters at layer 2
    inside layer 2     input_layernorm 0,  linear_attn 0.088   ← Qwen3NextGatedDeltaNet

A difference in a decoder layer but in none of its mixers is reported against the layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from packshard.errors import UsageError
from packshard.torch.layers.kinds import Layer, decoder_layers, model_layers


class SeamLeakError(UsageError):
    """The model mixes a packed row's segments: its logits differ from each segment's alone."""


@dataclass(frozen=True, slots=True)
class LeakSite:
    """Where a leak enters: the decoder layer, the module in it (if one), and by how much."""

    decoder: int
    layer: Layer | None
    delta: float

    def describe(self) -> str:
        """``layer 2 (Qwen3NextGatedDeltaNet, linear attention)`` or the bare decoder layer."""
        if self.layer is not None:
            return self.layer.describe()
        return f"layer {self.decoder} (outside its attention and mixers)"


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item
    return getattr(output, "last_hidden_state", None)


def _rows(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """Return the first batch row as ``[T, …]`` (from ``[B, T, H]``, or flat ``[B·T, E]``)."""
    if tensor.dim() >= 3 and tensor.shape[1] == length:
        return tensor[0]
    if tensor.dim() >= 2 and tensor.shape[0] >= length:
        return tensor[:length]
    return tensor


class _Recorder:
    def __init__(self, model: Any) -> None:
        self.decoders = decoder_layers(model)
        self.layers = model_layers(model)
        modules = dict(model.named_modules())
        self.outputs: dict[str, torch.Tensor] = {}
        self.order: list[str] = []
        self.handles = []
        for i, module in enumerate(self.decoders):
            self.handles.append(module.register_forward_hook(self._hook(f"#{i}")))
        for layer in self.layers:
            self.handles.append(modules[layer.path].register_forward_hook(self._hook(layer.path)))

    def _hook(self, key: str) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            tensor = _first_tensor(output)
            if tensor is not None and key not in self.outputs:
                self.outputs[key] = tensor.detach().float()
                self.order.append(key)

        return hook

    def take(self) -> dict[str, torch.Tensor]:
        outputs, self.outputs, self.order = self.outputs, {}, self.order
        return outputs

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def first_leak(
    model: Any,
    inputs: Mapping[str, Any],
    segments: Sequence[tuple[int, int]],
    tolerance: float,
) -> LeakSite | None:
    """Run ``inputs`` (one packed row) and each segment alone; return where they first part.

    ``tolerance`` is relative to the largest output of the module compared (a quiet mixer
    whose outputs are small still shows its leak).
    Runs without gradients; the caller sets eval mode.  None when every layer agrees.
    """
    recorder = _Recorder(model)
    ids = inputs["input_ids"].reshape(-1)
    length = int(ids.shape[0])
    try:
        with torch.no_grad():
            model(**inputs)
            packed, order = recorder.take(), list(recorder.order)
            recorder.order = []
            alone = []
            for lo, hi in segments:
                model(input_ids=ids[lo:hi][None], use_cache=False)
                alone.append(recorder.take())
                recorder.order = []
    finally:
        recorder.close()

    def delta(key: str) -> float:
        worst = 0.0
        for (lo, hi), outs in zip(segments, alone, strict=True):
            if key not in packed or key not in outs:
                return 0.0
            a = _rows(outs[key], hi - lo)
            p = _rows(packed[key], length)[lo:hi]
            if p.shape != a.shape:
                return 0.0
            scale = (float(a.abs().max()) if a.numel() else 0.0) or 1.0
            worst = max(worst, float((p - a).abs().max()) / scale if a.numel() else 0.0)
        return worst

    by_path = {layer.path: layer for layer in recorder.layers}
    for i in range(len(recorder.decoders)):
        d = delta(f"#{i}")
        if d <= tolerance:
            continue
        inside = [k for k in order if k in by_path and by_path[k].index == i]
        for key in inside:
            if delta(key) > tolerance:
                return LeakSite(i, by_path[key], delta(key))
        return LeakSite(i, None, d)
    return None
