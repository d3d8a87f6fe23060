"""The vision encoder's patch grid of an image, from its width and height alone.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL resize every image so that both sides are multiples of
``patch_size * merge_size`` (14 * 2 = 28 pixels for Qwen2/2.5-VL) and the area lies within
``[min_pixels, max_pixels]`` (56*56 and 28*28*1280 by default), keeping the aspect ratio as
closely as rounding allows (``smart_resize``).  The grid is then ``(t, h, w)`` patches, with
``t = 1`` for a still image, and the language model sees one placeholder token per
``merge_size * merge_size`` patches::

    300 x 168 pixels ─ round to 28 ─► 308 x 168 ─► grid (1, 12, 22) ─► 12*22/4 = 66 tokens
    1411 x 1411      ─ over max ────► 980 x 980 ─► grid (1, 70, 70) ─► 1225 tokens

Integer arithmetic as transformers' ``smart_resize`` does it, so the counts equal
``image_grid_thw`` without decoding a pixel.
"""

from __future__ import annotations

import math

from packshard.errors import RecordError
from packshard.options import VisionRule

MAX_ASPECT = 200
"""The longest side over the shortest above which the processor refuses an image."""


def smart_resize(height: int, width: int, rule: VisionRule) -> tuple[int, int]:
    """Return the ``(height, width)`` the processor resizes an image of this size to.

    Raises:
        RecordError: ``bad_media`` when the aspect ratio is over :data:`MAX_ASPECT` or a
            side is not positive (the processor refuses such images).

    """
    if height < 1 or width < 1:
        raise RecordError("bad_media", f"image is {width}x{height} pixels (empty)")
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise RecordError(
            "bad_media",
            f"image is {width}x{height}: aspect ratio over {MAX_ASPECT}, which the processor "
            "refuses",
        )
    factor = rule.patch_size * rule.merge_size
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > rule.max_pixels:
        beta = math.sqrt((height * width) / rule.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < rule.min_pixels:
        beta = math.sqrt(rule.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_grid(width: int, height: int, rule: VisionRule) -> tuple[int, int, int]:
    """Return an image's ``(t, h, w)`` patch grid (``image_grid_thw``), ``t = 1``."""
    h, w = smart_resize(height, width, rule)
    return 1, h // rule.patch_size, w // rule.patch_size


def vision_tokens(grid: tuple[int, int, int], rule: VisionRule) -> int:
    """Return the placeholder tokens the language model sees for one image of ``grid``."""
    t, h, w = grid
    return t * h * w // (rule.merge_size * rule.merge_size)
