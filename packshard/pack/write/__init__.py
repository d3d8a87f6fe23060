"""Write: the planned rows into shards, inside an output folder that is safe to publish.

``assemble`` gathers a block of rows' columns from the spill; ``shards`` cuts the plan into
shards and writes each (one task per shard); ``outdir`` decides what may be replaced, locks
the folder, names the temporary folders and publishes atomically.
"""
