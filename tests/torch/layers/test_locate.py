"""locate: the first layer whose output for a packed row differs from its segments alone."""

from __future__ import annotations

from itertools import pairwise

import pytest

from packshard.torch import SeamLeakError, check_model, collate_hf, segment_layers
from packshard.torch.layers.locate import first_leak
from tests.torch.layers.builders import positions, row, tiny

torch = pytest.importorskip("torch")


def _segments(cu):
    return list(pairwise(cu))


def test_a_gated_delta_net_is_named_where_it_leaks() -> None:
    model = tiny("qwen3_next")
    ids, cu = row()
    inputs = {"input_ids": ids[None], "position_ids": positions(cu), "use_cache": False}
    site = first_leak(model, inputs, _segments(cu), 1e-4)
    assert site is not None and site.decoder == 0
    assert site.layer is not None and site.layer.cls == "Qwen3NextGatedDeltaNet"
    segment_layers(model)
    assert first_leak(model, inputs, _segments(cu), 1e-4) is None


def test_an_attention_fed_a_2d_mask_is_named_as_attention() -> None:
    model = tiny("llama")
    ids, cu = row()
    mask = torch.ones(1, cu[-1], dtype=torch.long)  # switches the packed detection off
    inputs = {"input_ids": ids[None], "position_ids": positions(cu), "attention_mask": mask}
    site = first_leak(model, {**inputs, "use_cache": False}, _segments(cu), 1e-4)
    assert site is not None and (site.decoder, site.layer.kind) == (0, "full attention")


@pytest.mark.parametrize(
    ("family", "named"),
    [
        ("qwen3_next", "Qwen3NextGatedDeltaNet, linear attention"),
        ("bamba", "BambaMixer, state space"),
    ],
)
def test_check_model_names_the_layer_and_the_fix(family, named) -> None:
    model = tiny(family)
    ids, cu = row()
    batch = collate_hf([{"input_ids": ids, "labels": ids, "cu_seqlens": torch.tensor(cu)}])
    with pytest.raises(SeamLeakError) as caught:
        check_model(model, batch)
    message = str(caught.value)
    assert f"first at layer 0 ({named})" in message
    assert "segment_layers(model)" in message and "attention implementation" not in message
    segment_layers(model)
    assert check_model(model, batch) <= 1e-4
