"""profile's packed shape: the spread of row fill and trained tokens per step, before packing."""

from __future__ import annotations

import numpy as np

from packshard.profile import report_to_dict
from packshard.profile.report import profile_lengths
from packshard.profile.shape import packed_shape


def test_rows_planned_as_pack_would_with_their_fill_and_trained_tokens():
    # bfd into 8-token rows: [8] [6 2] [5 3] [1]; trained 7 | 5+1 | 4+2 | 0
    lengths, loss = np.array([5, 2, 1, 8, 3, 6]), np.array([4, 1, 0, 7, 2, 5])
    shape = packed_shape(lengths, loss, 8, 1)
    assert shape["row_fill"] == {"min": 0.125, "p10": 0.125, "median": 1.0, "p90": 1.0, "max": 1.0}
    assert shape["step_loss_tokens"] == {
        "rows_per_step": 1, "steps": 4, "min": 0, "p10": 0, "median": 6, "p90": 7, "max": 7,
    }  # fmt: skip
    two = packed_shape(lengths, loss, 8, 2)["step_loss_tokens"]
    assert two["steps"] == 2 and two["min"] + two["max"] == 19  # every trained token, once
    # an overlong example is clipped to 8 tokens, at most 7 of them trained
    overlong = packed_shape(np.array([10]), np.array([9]), 8, 1)
    assert overlong["step_loss_tokens"]["max"] == 7 and overlong["row_fill"]["max"] == 1.0
    assert (
        packed_shape(np.array([], np.int64), np.array([], np.int64), 8, 4)["row_fill"]["max"] == 0.0
    )


def test_profile_json_reports_it_for_its_batch_size():
    lengths, loss = np.array([5, 2, 1, 8, 3, 6]), np.array([4, 1, 0, 7, 2, 5])
    report = profile_lengths(lengths, loss, np.zeros(6), ["chat"], {}, 8, batch_size=1)
    assert report_to_dict(report)["packed_shape"] == packed_shape(lengths, loss, 8, 1)


def test_the_text_report_says_it_in_one_line():
    from packshard.profile.shape import describe_shape

    shape = packed_shape(np.array([5, 2, 1, 8, 3, 6]), np.array([4, 1, 0, 7, 2, 5]), 8, 1)
    assert describe_shape(shape) == (
        "row fill min / p10 / median / p90 / max: 12.5% / 12.5% / 100.0% / 100.0% / 100.0%; "
        "trained tokens per step of 1 rows min / median / max: 0 / 6 / 7 (normalise by "
        "num_items_in_step)"
    )
    assert describe_shape(packed_shape(np.array([], np.int64), np.array([], np.int64), 8, 1)) == ""
