"""The training topology a pack was made for: context-parallel alignment, rank-balanced steps.

Both are recorded in the manifest's ``config`` only when asked, so a pack without them keeps
its bytes: :mod:`~packshard.format.topology.aligned` (segments padded to a multiple) and
:mod:`~packshard.format.topology.steps` (rows ordered into rank-balanced steps).
"""

from packshard.format.topology.aligned import (
    PADDED_COLUMN,
    alignment_multiple,
    pad_segments,
    padded_cu_seqlens,
    padded_lengths,
    padded_row,
    padded_rows_wrong,
)
from packshard.format.topology.steps import (
    ATTENTION_C,
    BALANCE_COSTS,
    Topology,
    row_costs,
    step_balance,
    step_permutation,
)

__all__ = [
    "ATTENTION_C",
    "BALANCE_COSTS",
    "PADDED_COLUMN",
    "Topology",
    "alignment_multiple",
    "pad_segments",
    "padded_cu_seqlens",
    "padded_lengths",
    "padded_row",
    "padded_rows_wrong",
    "row_costs",
    "step_balance",
    "step_permutation",
]
