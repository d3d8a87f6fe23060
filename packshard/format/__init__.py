"""The output folder's contract (format version 1): each file written and read in one module.

``shards`` (``shard-NNNNN.parquet``), ``examples`` (``examples.parquet``), ``rejects``
(``rejects.jsonl``), ``manifest`` (``manifest.json``), and ``version`` (the format version and
the key-value metadata every Parquet file carries).
"""
