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

import importlib
from typing import TYPE_CHECKING, Any, Protocol, cast

from ..core.runtime import Runtime
from ..errors import InvalidInput
from . import urls
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
    Version,
    Versioned,
    completed_from,
    get_if_any,
    list_keys,
    versions_of,
)
from .faulty import Fault, Faults, FaultyStore
from .memory import MemoryBackend, MemoryStore
from .probe import PROBE_PREFIX, probe_conditional_writes
from .s3 import S3Store
from .s3_client import make_client
from .urls import SCHEMES, StoreURL, without_credentials

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

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
    "StoreURL",
    "Version",
    "Versioned",
    "access_needed",
    "access_policy",
    "completed_from",
    "connect",
    "get_if_any",
    "list_keys",
    "make_client",
    "parse_url",
    "probe_conditional_writes",
    "versions_of",
    "without_credentials",
]


def parse_url(url: str) -> tuple[str, str, str]:
    """A store URL -> (scheme, bucket or container, prefix); for ``file:///DIR`` the bucket
    is the directory and the prefix empty. One line naming the fix for a URL that breaks
    its scheme's rules (``urls.parse``)."""
    parsed = urls.parse(url)
    return parsed.scheme, parsed.bucket, parsed.prefix


BACKENDS = {"file": "file", "az": "azure", "gs": "gcs"}
"""The schemes whose backend lives in a module of its own, opened by its ``open_store``
when a URL names it: the cloud SDKs are optional extras, and a process that never opens
such a URL never pays for importing them."""


def connect(
    url: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    client: S3Client | None = None,
    runtime: Runtime | None = None,
) -> ObjectStore:
    """Open a store from its URL: ``s3://BUCKET/PREFIX``, ``az://CONTAINER/PREFIX``,
    ``gs://BUCKET/PREFIX``, ``file:///DIR`` or ``memory://NAME/PREFIX``.

    ``endpoint_url`` is an S3 endpoint (default ``AWS_ENDPOINT_URL_S3`` /
    ``AWS_ENDPOINT_URL``), an Azure account URL (default ``AZURE_STORAGE_ACCOUNT_URL``) or a
    GCS endpoint (default ``STORAGE_EMULATOR_HOST``); a directory has none. ``client`` is a
    boto3 client configured your own way, and ``region`` its region, for ``s3://`` only.
    ``memory://`` is an in-process store: every ``connect`` to the same name in one process
    sees the same objects, and nothing outlives the process.
    """
    parsed = urls.parse(url)
    if parsed.scheme == "memory":
        return MemoryStore(parsed.bucket, parsed.prefix, runtime=runtime)
    if parsed.scheme == "s3":
        made = client or make_client(endpoint_url, region)
        return S3Store(made, parsed.bucket, parsed.prefix, runtime=runtime)
    if client is not None or region is not None:
        raise InvalidInput(
            f"client= and region= are a boto3 client's, for s3:// URLs only, not {parsed}"
        )
    if parsed.scheme == "file" and endpoint_url:
        raise InvalidInput(
            f"a directory has no endpoint: drop endpoint_url (--endpoint-url) for {parsed}"
        )
    return _backend(parsed.scheme).open_store(parsed, endpoint_url=endpoint_url, runtime=runtime)


POLICIES = {"s3": "permissions", "az": "azure_roles", "gs": "gcs_permissions"}
"""The schemes with a least-privilege access policy (``access_policy``), and the module of
this package that writes it (a function ``policy(bucket, prefix, role)``, and ``needed(op,
address)``: what a refused call lacked, in words)."""


def access_policy(url: str, role: str) -> dict[str, Any]:
    """The least-privilege access policy of ``role`` (``agent`` or ``admin``) for the store
    ``url`` names, in its cloud's own form: an AWS IAM policy, an Azure custom role, a GCS
    custom role with an IAM condition. It sends no request."""
    parsed = urls.parse(url)
    if parsed.scheme not in POLICIES:
        raise InvalidInput(
            f"there is no cloud access policy for {parsed}: "
            + (
                importlib.import_module(".file_root", __name__).permissions_needed(parsed.bucket)
                if parsed.scheme == "file"
                else f"use {urls.FORMS}"
            )
        )
    module = importlib.import_module(f".{POLICIES[parsed.scheme]}", __name__)
    document: dict[str, Any] = module.policy(parsed.bucket, parsed.prefix, role)
    return document


def access_needed(op: str, address: str) -> str | None:
    """What a call of ``op`` on ``address`` (a full address, ``scheme://bucket/key``) needs
    in its cloud's terms, as ``doctor`` reports a refused call; None for a scheme without an
    access policy."""
    module = POLICIES.get(address.partition("://")[0])
    if module is None:
        return None
    said: str = importlib.import_module(f".{module}", __name__).needed(op, address)
    return said


class _Backend(Protocol):
    """What a backend module gives ``connect``."""

    def open_store(
        self, url: StoreURL, *, endpoint_url: str | None, runtime: Runtime | None
    ) -> ObjectStore: ...


def _backend(scheme: str) -> _Backend:
    """The module of a scheme's backend (``BACKENDS``); a missing SDK is named with the
    extra that installs it."""
    try:
        return cast(_Backend, importlib.import_module(f".{BACKENDS[scheme]}", __name__))
    except ImportError as e:
        extra = urls.EXTRAS.get(scheme)
        if extra is None:
            raise
        raise InvalidInput(
            f"{scheme}:// stores need the {extra} extra, and {e.name or 'its SDK'} is not "
            f"installed: pip install 'objmanifest[{extra}]'"
        ) from e
