"""Tiny models of the families the layer tests use, and packed rows of random tokens."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

LENGTHS = (9, 23, 6, 30)
"""A packed row of four segments, 68 tokens: long enough to cross a 32-token SSM chunk."""


def tiny(family: str, **overrides: Any) -> Any:
    """The family's tiny random model (its transformers default config, shrunk)."""
    from packshard.torch.layers.matrix import family_config
    from packshard.torch.layers.tiny import tiny_model

    config = {**family_config(family), **overrides}
    return tiny_model(config, 512, seed=0)


def row(lengths: tuple[int, ...] = LENGTHS, seed: int = 0) -> tuple[Any, list[int]]:
    """Random token ids of a packed row and its ``cu_seqlens``."""
    gen = torch.Generator().manual_seed(seed)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.randint(1, 500, (cu[-1],), generator=gen), cu


def positions(cu: list[int]) -> Any:
    """``position_ids`` ``[1, T]`` restarting at every segment."""
    return torch.cat([torch.arange(b - a) for a, b in pairwise(cu)])[None]
