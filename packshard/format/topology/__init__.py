"""The training topology a pack was made for: context-parallel alignment, rank-balanced steps.

Both are recorded in the manifest's ``config`` (``alignment``, ``topology``) only when asked,
so a pack without them keeps its bytes and its dataset id.  ``pack`` writes them, ``verify``
checks them, the reader and the Megatron export honour them:
:mod:`~packshard.format.topology.aligned` (every segment padded to a multiple,
``cu_seqlens_padded``) and :mod:`~packshard.format.topology.steps` (rows ordered into global
steps whose slowest rank is close to the mean).
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
