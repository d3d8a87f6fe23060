r"""What preference pairs cost a padded DPO loader, against the same pairs packed.

A DPO batch holds both branches of each pair.  A padded loader computes every branch at the
length of the longest sequence it is padded to; packing (a pair one unit, both branches in one
row: :mod:`packshard.pack.plan.pairs`) computes ``rows × max_seq_len``.  For ``n`` pairs of
branch lengths ``(c_i, r_i)``, all of them useful tokens::

    useful                Σ (c_i + r_i)
    pair padded           Σ 2 · max(c_i, r_i)                 each pair to its longer branch
    batch padded          Σ_b 2 · |b| · max_{i ∈ b} max(c_i, r_i)   batches of --batch-size
                          pairs drawn with --seed, padded to their longest (TRL's collator)
    packed                rows · max_seq_len                  BFD over pair units

The prompt share counts each branch's prompt, as training does.  Pairs longer than
``max_seq_len`` together are left out and counted (``over_max``), as ``pack`` drops them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packshard.ingest import pair_starts
from packshard.pack.plan.pairs import plan_pair_units
from packshard.profile.lengths import measure_batches


def pair_profile(
    lengths: np.ndarray,
    prompts: np.ndarray,
    codes: np.ndarray,
    max_seq_len: int,
    batch_size: int,
    seed: int,
) -> dict[str, Any]:
    """Return the pair figures of the module notes (an empty dict when there are no pairs)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = pair_starts(np.asarray(codes, dtype=np.int8))
    if not starts.size:
        return {}
    chosen, rejected = lengths[starts], lengths[starts + 1]
    fits = chosen + rejected <= max_seq_len
    chosen, rejected, starts = chosen[fits], rejected[fits], starts[fits]
    prompt = int(prompts[starts].sum() + prompts[starts + 1].sum())
    useful = int(chosen.sum() + rejected.sum())
    longer = np.maximum(chosen, rejected)
    shuffled = longer[np.random.default_rng(seed).permutation(len(longer))]
    unit_lengths = np.empty(2 * len(starts), np.int64)
    unit_lengths[0::2], unit_lengths[1::2] = chosen, rejected
    pair_codes = np.tile(np.array([1, 2], np.int8), len(starts))
    rows = plan_pair_units(unit_lengths, pair_codes, max_seq_len, "bfd").num_rows if useful else 0
    computed = {
        "pair_padded": int(2 * longer.sum()),
        "batch_padded": 2 * measure_batches(shuffled, batch_size),
        "packed": rows * max_seq_len,
    }
    return {
        "pairs": int(starts.size),
        "over_max": int(np.count_nonzero(~fits)),
        "tokens": useful,
        "prompt_tokens": prompt,
        "answer_tokens": useful - prompt,
        "prompt_share": round(prompt / useful, 6) if useful else 0.0,
        "rows": rows,
        "lower_bound_rows": -(-useful // max_seq_len),
        "computed_tokens": computed,
        "useful_fraction": {k: round(useful / v, 6) if v else 0.0 for k, v in computed.items()},
    }


def describe_pairs(pairs: dict[str, Any], batch_size: int) -> str:
    """Return the one-paragraph summary ``profile`` prints for pairs."""
    useful = pairs["useful_fraction"]
    waste = {k: 1.0 - v for k, v in useful.items()}
    over = f", {pairs['over_max']:,} over max_seq_len left out" if pairs["over_max"] else ""
    return (
        f"pairs: {pairs['pairs']:,}{over}; prompt {pairs['prompt_share']:.1%} of branch tokens "
        f"(counted in both branches), answers {1 - pairs['prompt_share']:.1%}. Padding wastes "
        f"{waste['batch_padded']:.1%} of a padded DPO batch ({batch_size} pairs padded to their "
        f"longest), {waste['pair_padded']:.1%} with each pair padded to its longer branch; "
        f"packed rows waste {waste['packed']:.1%} ({pairs['rows']:,} rows, lower bound "
        f"{pairs['lower_bound_rows']:,})"
    )
