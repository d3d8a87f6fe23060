"""Read: input specs to files, files to raw records, and files cut into work units.

``inputs`` expands specs (files, folders, globs) and opens regular files only; ``sources``
streams JSONL and JSON records; ``parquet`` reads Parquet rows; ``streams`` decompresses with
bounds and buffers JSON text; ``jsonparse`` parses one value (duplicate keys refused);
``units`` cuts the inputs into work units (JSONL byte ranges, Parquet row groups).
"""
