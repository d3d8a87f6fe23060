"""Object-store URLs: which schemes packshard reads and writes, and what a URL may not carry.

A store URL is ``SCHEME://BUCKET/KEY``::

    s3://bucket/in/chat.jsonl      Amazon S3 or any S3-compatible store (endpoint: environment)
    gs://bucket/in/chat.jsonl      Google Cloud Storage
    az://container/in/chat.jsonl   Azure Blob Storage (account from AZURE_STORAGE_ACCOUNT_NAME)

Anything else with ``://`` is refused by name; a path without a scheme is local.  A URL may
carry neither credentials nor options (``s3://KEY:SECRET@bucket``, ``?endpoint_override=…``):
they would end up in the manifest and in logs, so credentials, region and endpoint come from
the environment and the store's usual configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

from packshard.errors import UsageError

SCHEMES = {
    "s3": "Amazon S3 or an S3-compatible store",
    "gs": "Google Cloud Storage",
    "az": "Azure Blob Storage",
}
"""The schemes a URL may have, and what each stands for."""


@dataclass(frozen=True, slots=True)
class StoreUrl:
    """One parsed URL: ``scheme``, ``bucket`` and ``key`` (no leading or trailing ``/``)."""

    scheme: str
    bucket: str
    key: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}" if self.key else self.root

    @property
    def root(self) -> str:
        """The bucket's own URL, ``SCHEME://BUCKET``."""
        return f"{self.scheme}://{self.bucket}"

    @property
    def path(self) -> str:
        """The path a pyarrow filesystem of this scheme takes: ``BUCKET/KEY``."""
        return f"{self.bucket}/{self.key}" if self.key else self.bucket

    def child(self, name: str) -> StoreUrl:
        """Return the URL of ``name`` (a relative ``/``-separated path) below this one."""
        key = "/".join(p for p in (self.key, name.strip("/")) if p)
        return StoreUrl(self.scheme, self.bucket, key)


def is_url(spec: str | object) -> bool:
    """Whether ``spec`` is written as a URL (``SCHEME://…``), supported or not."""
    return isinstance(spec, str) and "://" in spec and spec.split("://", 1)[0].isalnum()


def parse_url(spec: str) -> StoreUrl:
    """Parse ``spec`` into a :class:`StoreUrl`, refusing what packshard cannot or must not use.

    Raises:
        UsageError: an unsupported scheme, no bucket, credentials, options or a fragment.

    """
    scheme, _, rest = spec.partition("://")
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise UsageError(
            f"{spec}: unsupported scheme {scheme}:// (packshard reads and writes {known} and "
            "local paths; copy the data to one of them)"
        )
    bucket, _, key = rest.partition("/")
    if "?" in spec or "#" in spec:
        raise UsageError(
            f"{scheme}://{bucket}/…: options in a URL are refused (they would be recorded in the "
            "manifest); set the endpoint and region in the environment (AWS_ENDPOINT_URL, "
            "AWS_REGION) or the store's usual configuration file"
        )
    if "@" in bucket or ":" in bucket:
        raise UsageError(
            f"{scheme}://…@…: credentials or accounts in a URL are refused (they would be "
            "recorded in the manifest and the shell's history); give them in the environment "
            "or the store's usual configuration (AWS_ACCESS_KEY_ID, ~/.aws/credentials, "
            "GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_ACCOUNT_NAME …)"
        )
    if not bucket:
        raise UsageError(f"{spec}: no bucket named (write {scheme}://BUCKET/PATH)")
    return StoreUrl(scheme, bucket, key.strip("/"))
