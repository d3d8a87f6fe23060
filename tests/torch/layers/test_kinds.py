"""kinds: every token-mixing module of a model named with its kind, read from its classes."""

from __future__ import annotations

import pytest

from packshard.torch.layers.kinds import (
    CONVOLUTION,
    FULL,
    LINEAR,
    ROUTER,
    SINKS,
    SLIDING,
    STATE_SPACE,
    kind_counts,
    model_layers,
)
from tests.torch.layers.builders import tiny


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("llama", {FULL: 2}),
        ("qwen3_next", {LINEAR: 3, ROUTER: 4, FULL: 1}),
        ("gemma3_text", {SLIDING: 5, FULL: 1}),
        ("gpt_oss", {SINKS: 2, ROUTER: 2}),
        ("bamba", {STATE_SPACE: 1, FULL: 1}),
        ("lfm2", {CONVOLUTION: 2, FULL: 1}),
        ("mamba2", {STATE_SPACE: 2}),
    ],
)
def test_each_family_is_read_as_its_layer_kinds(family, expected) -> None:
    assert kind_counts(model_layers(tiny(family))) == expected


def test_a_family_name_is_not_read_as_a_kind() -> None:
    # KimiLinearAttention is Kimi's softmax attention: "Linear" is the family's name
    layers = model_layers(tiny("kimi_linear"))
    by_class = {layer.cls: layer.kind for layer in layers}
    assert by_class["KimiLinearAttention"] == FULL
    assert by_class["KimiLinearDeltaAttention"] == LINEAR


def test_a_token_shift_is_a_convolution() -> None:
    by_class = {layer.cls: layer.kind for layer in model_layers(tiny("rwkv"))}
    assert by_class == {"RwkvSelfAttention": LINEAR, "RwkvFeedForward": CONVOLUTION}


def test_layers_come_in_execution_order_with_their_decoder_index() -> None:
    layers = model_layers(tiny("qwen3_next"))
    mixers = [(layer.index, layer.kind) for layer in layers if layer.kind != ROUTER]
    assert mixers == [(0, LINEAR), (1, LINEAR), (2, LINEAR), (3, FULL)]
    assert layers[0].path == "model.layers.0.linear_attn"
    assert layers[0].describe() == "layer 0 (Qwen3NextGatedDeltaNet, linear attention)"
