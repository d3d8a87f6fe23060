"""Write: the planned rows into shards, inside the folder :mod:`packshard.format.folder` guards.

``assemble`` gathers a block of rows' columns from the spill; ``shards`` cuts the plan into
shards and writes each (one task per shard).
"""
