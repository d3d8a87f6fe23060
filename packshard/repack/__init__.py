"""``packshard repack``: one tokenized pack re-planned for another length, seed or strategy.

A pack is planned for one ``max_seq_len``, one seed, one strategy; its shards and examples
index hold every example's tokens and labels and where it came from.  ``repack`` re-plans
from those alone (no tokenizer, template or input file) through ``pack``'s own stages::

    parent/  shards ─► pass 1: tokens as stored ─┐
             examples.parquet (source, line, domain)├─► pass 2: SpillWriter, the new overlong
             rejects.jsonl (carried)             ─┘           policy ─► spill, example-id order
    spill ─► pack_spill: plan_packs ─► shuffle (seed) ─► stats ─► index + shards ─► manifest
                                                                   (+ "parent": id, checksum)

The spill is the one a fresh ``pack`` of the parent's inputs with the new options makes, so
the output is too: the same dataset id (it hashes the configuration and the inputs' hashes,
both the same), byte-identical shards and examples index, the same rejects in (input, line)
order and the same statistics; only ``created_at``, ``engine`` and the ``parent`` entry of
the manifest differ.  Measured on 1,000,000 short chat examples (23.0M tokens, one process
each, a 2-core machine at load 1): 84.9 s and 85.9 CPU-s to pack, 5.0 s and 4.9 CPU-s to
repack, 17.4× less CPU (``scripts/bench_repack.py``, ``docs/pack.md``).

What cannot be re-made is refused before any shard is read
(:func:`~packshard.repack.config.parent_problem`): examples the parent split or truncated
(their tokens past the cut are gone), ``--mix``, preference pairs and ``--turns expand``
packs, an eval split from ``--eval`` inputs; and a record the parent dropped as too long
that the new options would keep.
"""

from packshard.repack.config import RepackConfig
from packshard.repack.run import repack_dataset

__all__ = ["RepackConfig", "repack_dataset"]
