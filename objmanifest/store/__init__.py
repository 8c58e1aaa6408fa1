"""The storage seam and everything behind it; ``connect`` opens a store from its URL.

Owns: the ``ObjectStore`` protocol and what every backend must normalise (``base.py``),
the keys under a prefix and their addresses every backend shares (``PrefixedStore``), the
backends (``S3Store`` over boto3, ``MemoryBackend`` in one process), ``FaultyStore``, which
plans a network's faults around any of them (``MemoryStore`` is it around a
``MemoryBackend``), the probe of what a store enforces, least-privilege IAM policies, and
the store outcomes (``errors.py``: ``NoSuchObject``, ``PreconditionFailed`` ...).

Must never: know what a manifest, task, entry or shard is; let a backend's client library,
quirk or exception out (each is normalised to the seam's outcomes, or a ``StoreError``
naming the object); raise a public error that decides for the caller what a missing object
means (that is ``NoSuchObject``, and each caller says it in its own words).
"""

from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from ..core.runtime import Runtime
from ..errors import InvalidInput
from .base import (
    CREATE,
    OVERWRITE,
    Blob,
    ByteStream,
    Head,
    Listed,
    ObjectStore,
    PartBody,
    PartsListed,
    PartStream,
    PrefixedStore,
    PutMode,
    StoreClock,
    list_keys,
)
from .faulty import Fault, Faults, FaultyStore
from .memory import MemoryBackend, MemoryStore
from .probe import PROBE_PREFIX, probe_conditional_writes
from .s3 import S3Store
from .s3_client import make_client, without_credentials

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

SCHEMES = ("s3", "memory")

_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
"""What any S3 store could call a bucket (AWS today: 3-63 lowercase letters, digits, '.'
and '-'; older buckets and other stores allow capitals and '_' too)."""

__all__ = [
    "CREATE",
    "OVERWRITE",
    "PROBE_PREFIX",
    "SCHEMES",
    "Blob",
    "ByteStream",
    "Fault",
    "Faults",
    "FaultyStore",
    "Head",
    "Listed",
    "MemoryBackend",
    "MemoryStore",
    "ObjectStore",
    "PartBody",
    "PartStream",
    "PartsListed",
    "PrefixedStore",
    "PutMode",
    "S3Store",
    "StoreClock",
    "connect",
    "list_keys",
    "make_client",
    "parse_url",
    "probe_conditional_writes",
]


def parse_url(url: str) -> tuple[str, str, str]:
    """``s3://bucket/prefix`` or ``memory://bucket/prefix`` -> (scheme, bucket, prefix)."""
    if isinstance(url, str) and "@" in url.partition("://")[2].partition("/")[0]:
        raise InvalidInput(
            f"invalid bucket name in {without_credentials(url)!r}: a store URL names no "
            "credentials, and this one has user info (before '@'); use s3://BUCKET[/PREFIX], "
            "with the credentials in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or an AWS "
            "profile: AWS_PROFILE)"
        )
    if isinstance(url, str) and any(unicodedata.category(c) == "Cc" for c in url):
        raise InvalidInput(f"a store URL has no control characters (a newline, a tab ...): {url!r}")
    try:
        parsed = urlparse(url) if isinstance(url, str) else None
    except ValueError:  # "Invalid IPv6 URL": a '[' in the bucket
        parsed = None
    if parsed is None or parsed.scheme not in SCHEMES or not parsed.netloc:
        raise InvalidInput(
            f"not a store URL: {url!r}; use s3://BUCKET[/PREFIX] (or memory://NAME[/PREFIX] "
            "for an in-process store)"
        )
    if parsed.query or parsed.fragment or parsed.params:
        raise InvalidInput(f"a store URL has no query or fragment: {without_credentials(url)!r}")
    if not _BUCKET.fullmatch(parsed.netloc):
        raise InvalidInput(
            f"invalid bucket name {parsed.netloc!r} in {url!r}: a bucket name has letters, "
            "digits, '.', '-' and '_' only (on AWS: 3-63 lowercase letters, digits, '.' and "
            "'-'), such as s3://my-bucket/jobs"
        )
    prefix = parsed.path.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise InvalidInput(
            f"the prefix of {url!r} has an empty, '.' or '..' segment; use a plain path "
            "such as s3://BUCKET/jobs/nightly"
        )
    return parsed.scheme, parsed.netloc, prefix


def connect(
    url: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    client: S3Client | None = None,
    runtime: Runtime | None = None,
) -> ObjectStore:
    """Open ``s3://bucket/prefix`` (or ``memory://bucket/prefix``).

    The endpoint comes from ``endpoint_url`` or the standard ``AWS_ENDPOINT_URL_S3`` /
    ``AWS_ENDPOINT_URL``; pass ``client`` to use a boto3 client configured your own way.
    ``memory://`` is an in-process store: every ``connect`` to the same bucket name in one
    process sees the same objects, and nothing outlives the process.
    """
    scheme, bucket, prefix = parse_url(url)
    if scheme == "memory":
        return MemoryStore(bucket, prefix, runtime=runtime)
    return S3Store(client or make_client(endpoint_url, region), bucket, prefix, runtime=runtime)
