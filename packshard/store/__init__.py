"""Object stores in and out: ``s3://`` (``gs://``, ``az://`` for reading) beside local paths.

The whole interface other stages use: reads through pyarrow's filesystems, the writes of
publishing through boto3 (each chosen by measurement: ``docs/object-stores.md``)::

    parse_url(spec)                   "s3://bucket/key" → StoreUrl, or one line saying why not
    read_range(url, start, stop)      one ranged GET, on whatever node runs it   (objects)
    hash_object(url)                  SHA-256 in ranged GETs, on whatever node runs it
    open_object(url)                  a random-access file of ranged GETs: Parquet footers, shards
    fetch_input(url) / fetched_out()  a local copy for stages that read local files   (stage)
    upload_file(path, url)            a finished file where OUT lives, whole or absent  (writes)
    claim_store(OUT) / publish_store  lock, stage, upload, manifest last, unlock      (publish)

Credentials, region and endpoint come from the environment and the store's usual
configuration, never from the URL (:mod:`packshard.store.urls`).  Each process (a forked
worker, a Ray task on another node) opens its own client on first use.
"""

from packshard.store.objects import (
    glob_objects,
    glob_sized,
    hash_object,
    list_objects,
    object_size,
    open_object,
    read_object,
    read_range,
)
from packshard.store.publish import StoreOut, claim_store, publish_store
from packshard.store.stage import LOCK_NAME, fetch_input, fetched_out
from packshard.store.urls import SCHEMES, StoreUrl, is_url, parse_url
from packshard.store.writes import upload_file

__all__ = [
    "LOCK_NAME",
    "SCHEMES",
    "StoreOut",
    "StoreUrl",
    "claim_store",
    "fetch_input",
    "fetched_out",
    "glob_objects",
    "glob_sized",
    "hash_object",
    "is_url",
    "list_objects",
    "object_size",
    "open_object",
    "parse_url",
    "publish_store",
    "read_object",
    "read_range",
    "upload_file",
]
