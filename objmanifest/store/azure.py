"""``AzureStore``: the storage seam over Azure Blob Storage (``az://CONTAINER/PREFIX``),
through Microsoft's ``azure-storage-blob``.

No layer above it sees the SDK. Azure's answers are normalised here to the seam's:

* create-only is ``If-None-Match: *`` (a second create: 409 ``BlobAlreadyExists``), an
  update ``If-Match`` on the blob's ETag, its version token (a stale or missing one: 412
  ``ConditionNotMet``): both ``PreconditionFailed``; a conditional read answered 304 is
  None; ``BlobNotFound`` on a read is ``NoSuchObject``, a missing container a ``StoreError``;
* every whole object and every block carries its ``Content-MD5``, which Azure checks: a
  body damaged on its way is refused (400 ``Md5Mismatch``; one cut short breaks the Shared
  Key signature, 403, told apart from a refusal of the credentials by asking again) and
  sent again (``send_whole``);
* a PUT whose answer was lost is ``OutcomeUnknown`` (never retried: ``AzureRetry``); 503
  ``ServerBusy``, 500 ``OperationTimedOut`` and other refusals that changed nothing are
  retried with backoff, by that one policy;
* the store's clock is the ``Date`` of every response, errors included
  (``raw_response_hook``);
* metadata names are C# identifiers on Azure: a name that is not lowercase letters and
  digits goes as ``_`` and the hex of its UTF-8 (``xxh3-128`` is ``_787868332d313238``);
* listings are put in code-point order (UTF-8 byte order, as S3 sorts) whatever order the
  pages came in, and leave the store's own namespace (``UPLOADS``) out.

Multipart uploads map to staged blocks and a create-only block-list commit, with upload
ids and markers of our own: ``azure_blocks`` says how.

Where the account keeps blob versions (versioning is an account setting, off by default),
``versions`` lists them and ``get_version`` reads one. Azure has no delete markers: a
deleted blob has no current version, and its earlier ones stay. Azurite (3.37) does not
implement versioning: it writes no versions and lists none, so it keeps none here.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, HttpResponseError, ServiceResponseError
from azure.storage.blob import (
    BlobClient,
    BlobPrefix,
    BlobServiceClient,
    ContentSettings,
)

from ..core.runtime import DEFAULT, Runtime
from ..errors import InvalidInput, StoreError
from .azure_answers import (
    BLOCK_LIST_CODES,
    COMPLETED_UPLOAD,
    DAMAGED_CODES,
    ENFORCES,
    RACE_CODES,
    SIGNATURE_CODES,
    AzureStream,
    answer,
    conditions,
    failure,
    metadata_in,
    metadata_out,
    quoted,
    read_all,
    said,
    shown,
    stream,
    unreadable,
)
from .azure_blocks import BlockUploads
from .azure_client import (
    CONNECTIONS,
    Credentials,
    check_container,
    make_service,
    redact,
)
from .azure_uploads import (
    UPLOADS,
    hidden,
)
from .base import (
    Blob,
    HandsOnUploads,
    Head,
    Listed,
    PrefixedStore,
    Put,
    StoreClock,
    Version,
    send_whole,
)
from .errors import BodyDamaged, NoSuchObject, OutcomeUnknown, PartsRejected, PreconditionFailed
from .urls import StoreURL

log = logging.getLogger(__name__)

READS = ("read", "inspect")
"""The actions (``get``/``open``, ``head``) whose missing blob is ``NoSuchObject``."""

_BLOB_CLIENTS = 1024
"""Blob clients kept for reuse (one per key: the shards a process commits to, mostly)."""


@functools.lru_cache(maxsize=16)
def _settings(content_type: str) -> ContentSettings:
    """A write's content settings, made once per content type (the SDK only reads them)."""
    return ContentSettings(content_type=content_type)


class AzureStore(HandsOnUploads, PrefixedStore):
    """One container (its ``bucket``) and prefix of an Azure storage account. Keys are
    relative to the prefix."""

    scheme = "az"

    def __init__(
        self,
        service: BlobServiceClient,
        container: str,
        prefix: str = "",
        *,
        runtime: Runtime | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        super().__init__(container, prefix, runtime)
        self.service = service
        self.container = container
        self.clock = StoreClock(monotonic=self.runtime.monotonic)
        self.credentials = credentials or Credentials(
            redact(str(service.url)).rstrip("/"), "the client given"
        )
        self.enforces = ENFORCES
        self.list_page_size: int | None = None
        """Rows per listing request (None: Azure's 5000); tests make it small."""
        self._client = service.get_container_client(container)
        self.uploads = BlockUploads(self)
        self._blobs: dict[str, BlobClient] = {}
        self._lock = threading.Lock()

    @property
    def connections(self) -> int:
        return CONNECTIONS

    @property
    def identity(self) -> tuple[str, str]:
        """What enforces this store's conditions: the account and the container."""
        return self.credentials.account_url, self.container

    # -- requests --------------------------------------------------------------------------

    def _observe(self, response: Any) -> None:
        """Every response, errors too, tells the store's clock."""
        self.clock.observe({"date": response.http_response.headers.get("Date", "")})

    def _blob(self, key: str) -> BlobClient:
        name = self.full_key(key)
        with self._lock:
            found = self._blobs.get(name)
            if found is None:
                if len(self._blobs) >= _BLOB_CLIENTS:
                    self._blobs.clear()
                found = self._blobs[name] = self._client.get_blob_client(name)
        return found

    def _fail(
        self, e: Exception, action: str, key: str
    ) -> StoreError | NoSuchObject | InvalidInput:
        """Turn an SDK error into one that names the object and the fix."""
        return failure(e, action, self.describe(key), self.container, self.credentials)

    def _call(
        self,
        action: str,
        key: str,
        call: Callable[[], Any],
        *,
        conditional: bool = False,
        upload: bool = False,
        write: bool = False,
        resent: Callable[[int, str, str], bool] | None = None,
        missing_ok: bool = False,
    ) -> Any:
        """Run one request and map its outcome.

        ``conditional``: a lost race is ``PreconditionFailed``; ``upload``: a block list
        naming a block the blob lacks is ``PartsRejected``; ``write``: a connection lost
        after sending is ``OutcomeUnknown``; ``resent`` (the request has a body, and this
        tells whether a refusal of its signature was one cut short): a body refused as
        damaged is ``BodyDamaged`` (the caller sends it again, ``send_whole``). A blob that
        is not there is ``NoSuchObject`` on a read or where ``missing_ok``, an error otherwise.
        """
        try:
            return call()
        except HttpResponseError as e:
            status, code = answer(e)
            if resent is not None and (code in DAMAGED_CODES or resent(status, code, key)):
                raise BodyDamaged(f"{self.describe(key)}: {status} {code}") from None
            if upload and code in BLOCK_LIST_CODES:
                raise PartsRejected(f"{self.describe(key)}: {code}") from None
            if conditional and (status == 412 or code in RACE_CODES):
                raise PreconditionFailed(f"{self.describe(key)}: {code}", answer=said(e)) from None
            failed = self._fail(e, action, key)
            if isinstance(failed, NoSuchObject) and not missing_ok and action not in READS:
                raise StoreError(
                    f"could not {action} {self.describe(key)}: {status} {code}"
                ) from None
            raise failed from None
        except ServiceResponseError as e:
            if write:
                raise OutcomeUnknown(
                    f"{self.describe(key)}: {shown(e, self.credentials.secrets)}"
                ) from None
            raise self._fail(e, action, key) from None
        except AzureError as e:
            raise self._fail(e, action, key) from None
        except (TypeError, ValueError, KeyError, AttributeError) as e:  # the SDK choked
            raise unreadable(e, action, self.describe(key), self.credentials) from None

    def _cut_short(self, status: int, code: str, key: str) -> bool:
        """Whether a 403 to a request with a body means the body was cut short on its way:
        the account takes our credentials for a request without one."""
        if status != 403 or code not in SIGNATURE_CODES:
            return False
        try:
            self._blob(key).exists(raw_response_hook=self._observe)
        except AzureError:
            return False
        return True

    # -- objects --------------------------------------------------------------------------

    def get(self, key: str, if_none_match: str | None = None) -> Blob | None:
        options: dict[str, Any] = {"raw_response_hook": self._observe}
        if if_none_match:
            options.update(etag=quoted(if_none_match), match_condition=MatchConditions.IfModified)
        blob = self._blob(key)
        try:
            downloaded = blob.download_blob(**options)
            body = downloaded.readall()
        except HttpResponseError as e:
            if answer(e)[0] == 304:
                return None
            raise self._fail(e, "read", key) from None
        except AzureError as e:
            raise self._fail(e, "read", key) from None
        properties = downloaded.properties
        return Blob(body, str(properties.etag), metadata_in(properties.metadata))

    def open(self, key: str, byte_range: tuple[int, int] | None = None) -> AzureStream:
        """The object's bytes, or ``[start, end)`` of them (an ``end`` past the object's end
        is its end), as they arrive. A range that starts at or past the end is refused, as
        Azure does (Azurite answers one at the end with no bytes)."""
        start = length = None
        if byte_range is not None:
            start, end = byte_range
            if start < 0 or end <= start:
                size = self.head(key).size if start == end >= 0 else -1
                if not 0 <= start < size and size != 0:
                    raise self._outside(key, byte_range, size)
                return AzureStream(None, self.describe(key))
            length = end - start
        blob = self._blob(key)
        try:
            chunks, content_range = stream(blob, start, length, self._observe)
        except HttpResponseError as e:
            if answer(e)[0] != 416 or byte_range is None:
                raise self._fail(e, "read", key) from None
            size = self.head(key).size
            if size:
                raise self._outside(key, byte_range, size) from None
            return AzureStream(None, self.describe(key))
        except AzureError as e:
            raise self._fail(e, "read", key) from None
        opened = AzureStream(chunks, self.describe(key), self.credentials.secrets)
        total = content_range.rpartition("/")[2]
        if byte_range is not None and total.isdigit() and byte_range[0] >= int(total) > 0:
            opened.close()
            raise self._outside(key, byte_range, int(total))
        return opened

    def _outside(self, key: str, byte_range: tuple[int, int], size: int) -> StoreError:
        start, end = byte_range
        return StoreError(
            f"could not read {self.describe(key)}: range {start}-{end} is outside its "
            f"{size if size >= 0 else '?'} bytes"
        )

    def head(self, key: str) -> Head:
        blob = self._blob(key)
        properties = self._call(
            "inspect", key, lambda: blob.get_blob_properties(raw_response_hook=self._observe)
        )
        metadata = properties.metadata or {}
        completed = next((v for k, v in metadata.items() if k.lower() == COMPLETED_UPLOAD), None)
        return Head(str(properties.etag), int(properties.size), metadata_in(metadata), completed)

    def _refuse_reserved(self, key: str, action: str) -> None:
        if hidden(key):
            raise InvalidInput(
                f"cannot {action} {self.describe(key)}: {UPLOADS} is the store's own namespace "
                "(the markers of open multipart uploads)"
            )

    def write(self, put: Put) -> str:
        """Write an object in one Put Blob and return its ETag; the body carries its
        ``Content-MD5`` (a file object is read whole first), so a damaged one is refused
        and sent again (``send_whole``)."""
        key, where = put.key, self.describe(put.key)
        self._refuse_reserved(key, "write")
        data = read_all(put.body)
        options: dict[str, Any] = {
            "length": len(data),
            "overwrite": put.mode.kind != "create",
            "metadata": metadata_out(put.metadata, where),
            "content_settings": _settings(put.content_type),
            "transactional_content_md5": hashlib.md5(data, usedforsecurity=False).digest(),
            "raw_response_hook": self._observe,
            **conditions(put.mode),
        }
        blob = self._blob(key)
        answered = send_whole(
            lambda: self._call(
                "write",
                key,
                lambda: blob.upload_blob(data, **options),
                conditional=put.conditional,
                write=True,
                resent=self._cut_short,
            ),
            self.runtime,
            where,
        )
        return str(answered["etag"])

    def put_digested(self, key: str, body: bytes, content_md5: str) -> tuple[bool, str]:
        """Write ``body`` with ``content_md5`` (base64) as its ``Content-MD5``, whatever its
        real digest: (stored, the store's answer). ``doctor`` asks with it whether the
        store verifies a digest."""
        blob = self._blob(key)
        try:
            self._call(
                "write",
                key,
                lambda: blob.upload_blob(
                    body,
                    overwrite=True,
                    transactional_content_md5=base64.b64decode(content_md5),
                    raw_response_hook=self._observe,
                ),
                resent=self._cut_short,
            )
        except BodyDamaged as e:
            return False, str(e).rpartition(": ")[2]
        return True, "201"

    def delete(self, key: str) -> None:
        blob = self._blob(key)
        with contextlib.suppress(NoSuchObject):
            self._call(
                "delete",
                key,
                lambda: blob.delete_blob(raw_response_hook=self._observe),
                missing_ok=True,
            )

    def list(self, prefix: str, delimiter: str | None = None) -> Iterator[Listed]:
        """Keys under ``prefix`` in code-point order (UTF-8 byte order, as S3 sorts), every
        page read first; the store's own namespace left out."""
        base = len(self.full_key(""))
        start = self.full_key(prefix) or None
        options: dict[str, Any] = {
            "name_starts_with": start,
            "results_per_page": self.list_page_size,
            "raw_response_hook": self._observe,
        }

        def rows() -> list[Listed]:
            found: Iterable[Any] = (
                self._client.walk_blobs(delimiter=delimiter, **options)
                if delimiter
                else self._client.list_blobs(**options)
            )
            return [Listed(item.name[base:], isinstance(item, BlobPrefix)) for item in found]

        listed = self._call("list", prefix, rows)
        for row in sorted(listed, key=lambda row: row.key):
            if not hidden(row.key):
                yield row

    # -- versions (blob versioning) --------------------------------------------------------

    def versions(self, key: str) -> Iterator[Version] | None:
        """The versions the account keeps of ``key``, newest first (version ids are the
        times they were written, in a form that sorts; Azure lists them oldest first, so
        all are read). None when the blob is there but has no version id: the account keeps
        no versions."""
        full = self.full_key(key)
        options: dict[str, Any] = {
            "name_starts_with": full,
            "include": ["versions"],
            "results_per_page": self.list_page_size,
            "raw_response_hook": self._observe,
        }

        def listed() -> list[Version] | None:
            rows = [item for item in self._client.list_blobs(**options) if item.name == full]
            if any(not row.version_id for row in rows):
                return None
            return [
                Version(
                    str(row.version_id), quoted(str(row.etag)), int(row.size), row.last_modified
                )
                for row in rows
            ]

        kept = self._call("list the versions of", key, listed)
        if kept is None:
            return None
        return iter(sorted(kept, key=lambda v: v.version_id, reverse=True))

    def get_version(self, key: str, version_id: str) -> Blob:
        """One version of ``key``; ``NoSuchObject`` when it is not there."""
        where = f"{self.describe(key)} (version {version_id})"
        blob = self._blob(key)

        def read() -> tuple[bytes, Any]:
            downloaded = blob.download_blob(version_id=version_id, raw_response_hook=self._observe)
            return downloaded.readall(), downloaded.properties

        try:
            body, properties = self._call("read", key, read)
        except NoSuchObject:
            raise NoSuchObject(where) from None
        return Blob(body, str(properties.etag), metadata_in(properties.metadata))

    # -- multipart uploads: staged blocks and a block-list commit (azure_blocks) -----------

    # -- time -----------------------------------------------------------------------------

    def now(self) -> datetime:
        """The store's time; asks the store once if no response has told it yet (a
        listing of at most one key under the prefix: even a refusal carries a ``Date``)."""
        if not self.clock.known:
            options: dict[str, Any] = {
                "name_starts_with": self.full_key("") or None,
                "results_per_page": 1,
                "raw_response_hook": self._observe,
            }
            try:
                self._call(
                    "list",
                    "",
                    lambda: next(iter(self._client.list_blobs(**options).by_page()), None),
                )
            except StoreError:
                if not self.clock.known:
                    raise
        return self.clock.now()


def connect_azure(
    container: str,
    prefix: str = "",
    *,
    endpoint_url: str | None = None,
    runtime: Runtime | None = None,
    **client: Any,
) -> AzureStore:
    """Open ``az://container/prefix`` with the credentials ``make_service`` finds (``client``:
    its ``retries``, ``connection_string`` or ``transport``)."""
    check_container(container)
    runtime = runtime or DEFAULT
    service, credentials = make_service(endpoint_url, runtime=runtime, **client)
    return AzureStore(service, container, prefix, runtime=runtime, credentials=credentials)


def open_store(
    url: StoreURL, *, endpoint_url: str | None = None, runtime: Runtime | None = None
) -> AzureStore:
    """``connect``'s way in: the store of an ``az://`` URL."""
    return connect_azure(url.bucket, url.prefix, endpoint_url=endpoint_url, runtime=runtime)
