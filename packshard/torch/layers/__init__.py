"""Seams in every layer: what each layer of a model mixes, a packed path for all, and a locator.

``kinds`` names each token-mixing module (full, sliding or sink attention, linear attention,
state space, convolution, router); ``segmented`` gives recurrent and convolutional mixers the
seams (one segment at a time, exact by construction) and attention block-causal masks where
the model ignores restarting positions; ``locate`` finds the first layer whose output for a
packed row differs from its segments alone; ``routers`` compares a MoE load-balancing loss
packed and unpacked; ``tiny`` shrinks any transformers architecture to a few random layers.
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
