"""3-D rotary positions equal transformers' ``get_rope_index``; packed rows restart them."""

from __future__ import annotations

import numpy as np
import pytest

from packshard.torch.vision.rope import mrope_positions, packed_positions

PAD = 9


def test_hand_computed() -> None:
    ids = np.array([1, 2, PAD, PAD, PAD, PAD, 3, 4])
    got = mrope_positions(ids, [(1, 4, 4)], PAD)  # 2x2 merged patches
    assert got.tolist() == [
        [0, 1, 2, 2, 2, 2, 4, 5],
        [0, 1, 2, 2, 3, 3, 4, 5],
        [0, 1, 2, 3, 2, 3, 4, 5],
    ]


def test_packed_rows_restart() -> None:
    ids = np.array([1, PAD, 2, 5, 6, PAD, PAD, 7])
    cu = np.array([0, 3, 8])
    got = packed_positions(ids, cu, [[(1, 2, 2)], [(1, 2, 4)]], PAD)
    assert got[0].tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
    assert got[1:, :3].tolist() == mrope_positions(ids[:3], [(1, 2, 2)], PAD).tolist()
    assert got[1:, 3:].tolist() == mrope_positions(ids[3:], [(1, 2, 4)], PAD).tolist()


def test_disagreeing_grids_raise() -> None:
    with pytest.raises(ValueError, match="1 image token runs for 2 grids"):
        mrope_positions(np.array([PAD, 1]), [(1, 2, 2), (1, 2, 2)], PAD)
    with pytest.raises(ValueError, match="run of 1 tokens"):
        mrope_positions(np.array([PAD, 1]), [(1, 4, 4)], PAD)


@pytest.mark.torch
def test_equal_to_transformers_get_rope_index() -> None:
    torch = pytest.importorskip("torch")
    from packshard.torch.vision.tiny import tiny_qwen25_vl

    model = tiny_qwen25_vl(vocab_size=1000)
    pad = 151655
    rng = np.random.default_rng(0)
    for grids in ([(1, 4, 6)], [(1, 8, 4), (1, 2, 2)], [(1, 12, 22), (1, 6, 6), (1, 4, 10)]):
        pieces = []
        for t, h, w in grids:
            pieces += [rng.integers(0, 100, rng.integers(1, 9)), np.full(t * h * w // 4, pad)]
        ids = np.concatenate([*pieces, rng.integers(0, 100, 5)])
        kinds = torch.as_tensor((ids == pad).astype(np.int32))[None]
        theirs, _ = model.model.get_rope_index(
            torch.as_tensor(ids)[None], kinds, torch.as_tensor(grids)
        )
        assert theirs[:, 0].tolist() == mrope_positions(ids, grids, pad).tolist()
