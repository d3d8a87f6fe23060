"""Seams in every layer: what each layer of a model mixes, a packed path for all, and a locator.

``kinds`` names each token-mixing module; ``segmented`` gives stateful mixers the seams;
``locate`` finds the first leaking layer; ``routers`` compares a MoE balance loss packed and
unpacked; ``tiny`` shrinks any transformers architecture to a few random layers.
"""

from packshard.torch.layers.kinds import STATEFUL, Layer, kind_counts, model_layers
from packshard.torch.layers.locate import LeakSite, first_leak
from packshard.torch.layers.segmented import SegmentedLayers, packed_segments, segment_layers

__all__ = [
    "STATEFUL",
    "Layer",
    "LeakSite",
    "SegmentedLayers",
    "first_leak",
    "kind_counts",
    "model_layers",
    "packed_segments",
    "segment_layers",
]
