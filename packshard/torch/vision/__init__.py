"""Vision-language rows: images loaded lazily and checked, 3-D positions, the tiny-model proof.

``rows`` serves a pack with images (``PackedVisionDataset``): each row's images are read,
checked against the index's size and SHA-256 and preprocessed in the loader's worker, with
the four-row positions the model needs; ``tiny`` builds a small random Qwen2.5-VL and
compares packed rows with their examples alone.
"""

from packshard.torch.vision.rows import PackedVisionDataset, collate_vision

__all__ = ["PackedVisionDataset", "collate_vision"]
