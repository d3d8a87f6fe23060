"""Preference pairs on packed rows: per-pair log-probabilities, DPO losses, reference sidecars.

A preference pack holds both branches of every pair as adjacent segments of one row, chosen
first (``branch`` 1, 2).  :mod:`~packshard.torch.pairs.logps`: summed log-probabilities and
the DPO losses; :mod:`~packshard.torch.pairs.reference`: the reference model's, once, as a
sidecar; :mod:`~packshard.torch.pairs.train`: DPO on packed rows, first batch checked.
"""

from packshard.torch.pairs.logps import (
    PairLogps,
    dpo_loss,
    pair_logps,
    segment_logps,
)

__all__ = ["PairLogps", "dpo_loss", "pair_logps", "segment_logps"]
