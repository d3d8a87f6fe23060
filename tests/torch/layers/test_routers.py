"""routers: the MoE load-balancing loss on a packed row against the same examples unpacked."""

from __future__ import annotations

from itertools import pairwise

import pytest

from packshard.torch.layers.routers import balance_loss, segment_balance_loss
from tests.torch.layers.builders import positions, row, tiny

torch = pytest.importorskip("torch")


def test_the_aux_loss_pools_the_row_and_the_per_segment_form_equals_alone(torch_one_thread) -> None:
    model = tiny("qwen3_moe", output_router_logits=True)
    experts, top_k = model.config.num_experts, model.config.num_experts_per_tok
    ids, cu = row()
    with torch.no_grad():
        packed = model(input_ids=ids[None], position_ids=positions(cu), use_cache=False)
        alone = [model(input_ids=ids[None, a:b], use_cache=False) for a, b in pairwise(cu)]
        longest = max(b - a for a, b in pairwise(cu))
        padded_ids = torch.zeros(len(alone), longest, dtype=torch.long)
        mask = torch.zeros(len(alone), longest, dtype=torch.long)
        for i, (a, b) in enumerate(pairwise(cu)):
            padded_ids[i, : b - a], mask[i, : b - a] = ids[a:b], 1
        padded = model(input_ids=padded_ids, attention_mask=mask, use_cache=False)
    # transformers' own figure: the packed row pools its examples as a padded batch does
    assert float(packed.aux_loss) == pytest.approx(float(padded.aux_loss), abs=1e-6)
    assert float(balance_loss(packed.router_logits, experts, top_k)) == pytest.approx(
        float(packed.aux_loss), abs=1e-6
    )
    mean_alone = sum(float(o.aux_loss) for o in alone) / len(alone)
    assert abs(float(packed.aux_loss) - mean_alone) > 1e-3  # a statistic of the pool, not a mean
    per_segment = segment_balance_loss(packed.router_logits, cu, experts, top_k)
    assert float(per_segment) == pytest.approx(mean_alone, abs=1e-6)
