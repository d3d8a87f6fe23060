"""segment_layers: a packed row through every layer kind equals its segments alone."""

from __future__ import annotations

from itertools import pairwise

import pytest

from packshard.errors import UsageError
from packshard.torch import SeamLeakError, collate_hf, packed_segments, segment_layers
from packshard.torch.layers.segmented import withheld
from tests.torch.layers.builders import positions, row, tiny

torch = pytest.importorskip("torch")


def _delta(model, ids, cu, **feed) -> float:
    with torch.no_grad():
        packed = model(input_ids=ids[None], use_cache=False, **feed).logits[0]
        return max(
            float((packed[a:b] - model(input_ids=ids[None, a:b], use_cache=False).logits[0])
                  .abs().max())
            for a, b in pairwise(cu)
        )  # fmt: skip


@pytest.mark.parametrize(
    ("family", "wrapped"),
    [
        ("qwen3_next", "Qwen3NextGatedDeltaNet"),
        ("bamba", "BambaMixer"),
        ("lfm2", "Lfm2ShortConv"),
        ("nemotron_h", "NemotronHMamba2Mixer"),
    ],
)
def test_a_hybrid_leaks_as_built_and_is_exact_segmented(family, wrapped, torch_one_thread) -> None:
    model = tiny(family)
    ids, cu = row()
    plain = _delta(model, ids, cu, position_ids=positions(cu))
    done = segment_layers(model)
    assert {layer.cls for layer in done.layers} == {wrapped}
    assert plain > 5e-4  # the state crossed the seams
    assert _delta(model, ids, cu, position_ids=positions(cu)) <= 1e-5
    with withheld(model):  # the control: the same forward without the seams
        assert _delta(model, ids, cu, position_ids=positions(cu)) == pytest.approx(plain)


def test_attention_that_ignores_restarts_gets_block_masks_with_its_window(torch_one_thread) -> None:
    model = tiny("gpt_oss")  # builds its masks without position_ids; sliding window 64
    ids, cu = row((70, 90, 12))  # segments longer than the window
    assert _delta(model, ids, cu, position_ids=positions(cu)) > 1e-2
    done = segment_layers(model)
    assert done.masks and done.layers == () and done.probe is not None and done.probe < 1e-5
    assert _delta(model, ids, cu, position_ids=positions(cu)) <= 1e-5


def test_a_model_without_position_ids_takes_the_reader_batch(torch_one_thread) -> None:
    model = tiny("mamba2")
    ids, cu = row()
    segment_layers(model)
    batch = collate_hf([{"input_ids": ids, "labels": ids, "cu_seqlens": torch.tensor(cu)}])
    assert _delta(model, ids, cu, position_ids=batch["position_ids"]) <= 1e-5
    with torch.no_grad():
        alone = [model(input_ids=ids[None, a:b]).logits[0] for a, b in pairwise(cu)]
        with packed_segments(model, cu):  # or the seams given directly
            packed = model(input_ids=ids[None]).logits[0]
            with pytest.raises(UsageError, match="row has 9 tokens but its seams end at 68"):
                model(input_ids=ids[None, :9])  # seams that do not describe the forward
        plain = model(input_ids=ids[None]).logits[0]  # outside the block: one sequence
    assert float((packed - torch.cat(alone)).abs().max()) <= 1e-5
    assert float((plain - torch.cat(alone)).abs().max()) > 1e-2


def _packed_grads(model, ids, cu) -> dict:
    labels = ids.clone()
    labels[cu[:-1]] = -100  # no target crosses a seam
    model.zero_grad()
    logits = model(input_ids=ids[None], position_ids=positions(cu), use_cache=False).logits
    torch.nn.functional.cross_entropy(logits[0, :-1], labels[1:], reduction="sum").backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gradients_of_a_packed_row_equal_the_sum_over_its_segments(torch_one_thread) -> None:
    model = tiny("qwen3_next")
    segment_layers(model)
    model.train()
    enable = getattr(model, "activation_checkpointing_enable", None)
    (enable or model.gradient_checkpointing_enable)()  # the recompute must see the seams again
    ids, cu = row((12, 20, 9))
    packed = _packed_grads(model, ids, cu)
    with withheld(model):
        leaked = _packed_grads(model, ids, cu)  # the control: the same step without the seams
    model.zero_grad()
    for a, b in pairwise(cu):
        logits = model(input_ids=ids[None, a:b], use_cache=False).logits[0, :-1]
        torch.nn.functional.cross_entropy(logits, ids[a + 1 : b], reduction="sum").backward()

    def worst(grads: dict) -> float:  # relative to the largest gradient of each tensor
        return max(float((grads[n] - p.grad).abs().max()) / max(float(p.grad.abs().max()), 1.0)
                   for n, p in model.named_parameters() if n in grads)  # fmt: skip

    assert worst(packed) <= 1e-5
    assert worst(leaked) > 1e-3


def test_a_cache_during_a_packed_forward_is_refused() -> None:
    model = tiny("lfm2")
    segment_layers(model)
    ids, cu = row()
    with pytest.raises(UsageError, match=r"Lfm2ShortConv.*cache.*use_cache=False"):
        model(input_ids=ids[None], position_ids=positions(cu), use_cache=True)


def test_segmenting_twice_changes_nothing() -> None:
    model = tiny("bamba")
    first = segment_layers(model)
    again = segment_layers(model)
    assert again.layers == first.layers and again.masks == first.masks


def test_packed_segments_needs_segment_layers_first() -> None:
    with pytest.raises(UsageError, match="segment_layers"), packed_segments(tiny("llama"), [0, 3]):
        pass


def test_a_deep_copy_runs_its_own_weights(torch_one_thread) -> None:
    import copy

    model = tiny("bamba")
    segment_layers(model)
    reference = copy.deepcopy(model)  # as DPO trainers make their reference model
    ids, cu = row()
    with torch.no_grad():
        before = reference(input_ids=ids[None], position_ids=positions(cu)).logits
        for p in model.parameters():  # the policy trains on
            p.add_(0.5)
        after = reference(input_ids=ids[None], position_ids=positions(cu)).logits
    assert torch.equal(before, after)  # the copy's mixers run the copy's weights
    assert _delta(reference, ids, cu, position_ids=positions(cu)) <= 1e-5  # and keep the seams


def test_a_leak_the_masks_do_not_close_is_refused_naming_the_layer(
    monkeypatch, torch_one_thread
) -> None:
    """The guard's control: gpt-oss with the block masks taken away still leaks, and says so."""
    from packshard.torch.layers import segmented

    def no_masks(model, cuts, dtype):
        return {"full_attention": None, "sliding_attention": None}

    monkeypatch.setattr(segmented, "_block_masks", no_masks)
    model = tiny("gpt_oss")
    with pytest.raises(SeamLeakError, match=r"could not keep .* first at layer 0 \(GptOss"):
        segment_layers(model)
