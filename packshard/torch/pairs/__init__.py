"""Preference pairs on packed rows: per-pair log-probabilities, DPO losses, reference sidecars.

The step after reading: a pack of preference pairs holds both branches of every pair as
adjacent segments of one row, chosen first, tagged by the per-segment ``branch`` column
(0 not a pair branch, 1 chosen, 2 rejected).  The reader keeps rows whole, so a batch never
holds one branch without the other.  :mod:`~packshard.torch.pairs.logps` turns a packed
forward's logits into each pair's summed log-probabilities and the DPO family of losses;
:mod:`~packshard.torch.pairs.reference` precomputes the reference model's log-probabilities
once into a sidecar of the output folder and joins them back into batches;
:mod:`~packshard.torch.pairs.train` trains DPO on packed rows (a plain-loop step and a
``transformers.Trainer`` subclass) after checking its first batch against the pairs run
unpadded one by one.
"""

from packshard.torch.pairs.logps import (
    PairLogps,
    dpo_loss,
    pair_logps,
    segment_logps,
)

__all__ = ["PairLogps", "dpo_loss", "pair_logps", "segment_logps"]
