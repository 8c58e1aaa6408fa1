"""``GCSStore``: the storage seam over Google Cloud Storage's JSON API (``google-cloud-storage``),
for ``gs://BUCKET/PREFIX``.

**Versions are generations.** GCS has no ETag conditions on writes: its preconditions are on
the object's *generation*, a positive integer that changes with every write. The seam's
"etag" strings on this store carry the generation (``"1712345678901234"``), never GCS's
ETag: ``CREATE`` is ``ifGenerationMatch=0``, ``PutMode.update(G)`` ``ifGenerationMatch=G``
(412 when the object is another version or gone), ``get(key, G)`` ``ifGenerationNotMatch=G``.
A token that is not a positive integer names no version: an update with it is a lost race
without asking, a read with it reads.

**Writes.** Every whole object is one ``uploadType=multipart`` upload carrying its CRC32C
(the digest GCS checks), so GCS refuses a body damaged on its way (``send_whole`` sends it
again); it is the only upload whose preconditions fake-gcs-server enforces.

**Reads.** ``get`` asks for the object's metadata (with ``ifGenerationNotMatch``: 304 when
unchanged, no body sent), then for the bytes of exactly that generation (checked against
its CRC32C). An unchanged object is None even where the store ignores read preconditions
(fake-gcs-server): the generation it answered is compared with the one asked about. A
changed object costs two requests where S3 takes one, so its metadata is exact.

**Chunked entries** (``create_upload`` ... ``complete_upload``) are parts stored as objects
of their own and composed: see ``gcs_uploads``. **Versions** (``versions``,
``get_version``) are the noncurrent generations object versioning keeps: see
``gcs_versions``.

**Errors.** 412 is a lost race (``PreconditionFailed``), 304 an unchanged object, 404 a
missing object (or, answered to a write or a listing, a missing bucket: a ``StoreError``
that says so), a connection that broke after a write was sent ``OutcomeUnknown``, 429 and
5xx are retried with backoff (``gcs_client``: GCS allows about one update a second per
object, so 429 on a hot object is normal), 401/403 and missing credentials a ``StoreError``
(``AccessDenied`` for 403) naming the fix. The store's clock is the ``Date`` of every answer
(a hook on the client's session). Nothing of the SDK crosses this module's line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from typing import Any, TypeVar
from urllib.parse import quote

import google.auth.exceptions
from google.api_core import exceptions as api_exceptions
from google.cloud import storage
from google.cloud.storage.exceptions import DataCorruption, InvalidResponse

from ..core import checksum
from ..core.runtime import Runtime
from ..errors import AccessDenied, InvalidInput, StoreError
from .base import (
    OVERWRITE,
    Blob,
    HandsOnUploads,
    Head,
    Listed,
    ObjectStore,
    PrefixedStore,
    Put,
    PutMode,
    StoreClock,
    Version,
    send_whole,
)
from .errors import BodyDamaged, NoSuchObject, OutcomeUnknown, PreconditionFailed
from .gcs_answers import (
    ENFORCES,
    GCSStream,
    answer,
    crc32c_base64,
    damaged,
    download,
    generation,
    missing_what,
    not_found,
    retry_status,
    status_error,
)
from .gcs_client import (
    CONNECTION_ERRORS,
    POOL,
    READ_RETRY,
    TIMEOUT,
    WRITE_RETRY,
    GCSClient,
    make_gcs_client,
)
from .gcs_uploads import PARTS, UPLOAD_META, Uploads, shown
from .gcs_versions import Generations
from .urls import StoreURL

T = TypeVar("T")

READS = 10
"""How often ``get`` asks when the generation it was reading was replaced between its
metadata and its bytes (after a short jittered pause that doubles each time)."""


class GCSStore(HandsOnUploads, PrefixedStore):
    """One bucket and prefix of Google Cloud Storage. Keys passed in are relative to the
    prefix; the store's own upload parts live under ``PARTS`` beside them, unlisted."""

    scheme = "gs"

    def __init__(
        self,
        client: GCSClient,
        bucket: str,
        prefix: str = "",
        *,
        runtime: Runtime | None = None,
    ) -> None:
        super().__init__(bucket, prefix, runtime)
        self.enforces = ENFORCES
        self.gcs = client
        self.clock = StoreClock(monotonic=self.runtime.monotonic)
        client.attach(self.clock)
        self._bucket = client.client.bucket(bucket)
        self._bucket_seen = False
        """Whether the bucket was found there (asked once, after a 404 that did not say)."""
        self.uploads = Uploads(self)
        self.generations = Generations(self)

    @property
    def connections(self) -> int:
        return POOL

    @property
    def identity(self) -> tuple[str, str]:
        """What the store probe's verdict is about (endpoint and bucket): what a store
        enforces does not depend on the prefix."""
        return self.gcs.endpoint, self.bucket

    def blob(self, key: str, generation: int | None = None) -> storage.Blob:
        """The SDK's handle of ``key`` (sends nothing)."""
        return self._bucket.blob(self.full_key(key), generation=generation)

    def _writable(self, key: str) -> None:
        if key == PARTS.rstrip("/") or key.startswith(PARTS):
            raise InvalidInput(
                f"{self.describe(key)} is in {PARTS}, where this store keeps the parts of "
                "unfinished uploads; use another key"
            )

    # -- errors ---------------------------------------------------------------------------

    def fail(self, e: BaseException, action: str, key: str) -> StoreError | NoSuchObject:
        """An SDK or transport error as one that names the object and the fix."""
        if isinstance(e, api_exceptions.RetryError) and e.cause is not None:
            inner = self.fail(e.cause, action, key)
            if isinstance(e.cause, api_exceptions.TooManyRequests):
                return StoreError(
                    f"could not {action} {self.describe(key)}: GCS kept answering 429 (too many "
                    "requests) for two minutes; it allows about one update a second per "
                    "object: spread the work over more partitions or stages"
                )
            return inner
        if isinstance(e, api_exceptions.NotFound):
            return self.missing(action, key, not_found(e), e.response)
        if isinstance(e, api_exceptions.Forbidden):
            return AccessDenied(
                f"the store refused to {action} {self.describe(key)} (403 Forbidden): the "
                "credentials lack a permission (`objmanifest iam-policy --url gs://...` prints "
                "the role objmanifest needs, `objmanifest doctor` names what is missing)"
            )
        if isinstance(e, (api_exceptions.Unauthorized, google.auth.exceptions.RefreshError)):
            return StoreError(
                f"the store refused the credentials to {action} {self.describe(key)}: run "
                "`gcloud auth application-default login` again, or check "
                "GOOGLE_APPLICATION_CREDENTIALS"
            )
        if isinstance(e, google.auth.exceptions.GoogleAuthError):
            return StoreError(
                f"could not {action} {self.describe(key)}: the credentials could not be used "
                f"({type(e).__name__}); check GOOGLE_APPLICATION_CREDENTIALS"
            )
        if isinstance(e, api_exceptions.GoogleAPICallError):
            page = self.page(action, key, e.code, e.response, _text(e.response))
            if page is not None:
                return page
            said = " ".join(f"{answer(e)} {e.message}".split())
            return StoreError(f"could not {action} {self.describe(key)}: {said}"[:500])
        if isinstance(e, CONNECTION_ERRORS):
            return StoreError(
                f"could not {action} {self.describe(key)}: no answer from "
                f"{self.gcs.shown_endpoint} ({type(e).__name__}); check that the store runs "
                "and the endpoint (--endpoint-url, STORAGE_EMULATOR_HOST) is right"
            )
        if isinstance(e, DataCorruption):
            return StoreError(
                f"could not {action} {self.describe(key)}: the bytes that arrived do not match "
                "the object's CRC32C (damaged on their way); retry"
            )
        if isinstance(e, InvalidResponse):
            status = getattr(e.response, "status_code", "?")
            return StoreError(f"could not {action} {self.describe(key)}: answered {status}")
        return StoreError(f"could not {action} {self.describe(key)}: {type(e).__name__}: {e}")

    def missing(
        self, action: str, key: str, says: str | None, response: Any, ask: bool = True
    ) -> StoreError | NoSuchObject:
        """What a 404 that ``says`` what is missing (``missing_what``) means: a missing
        object or bucket when it says so; else an endpoint that is no GCS JSON API when it
        answered a page of markup (a web server, another cloud's API), a missing bucket when
        asked (once a store, where ``ask``: an emulator says only "Not Found"), or a missing
        object."""
        if says == "bucket":
            return self._no_bucket(action, key)
        if says == "object":  # GCS's own words, even in a text/html answer to a download
            return NoSuchObject(self.describe(key))
        page = self.page(action, key, 404, response, _text(response))
        if page is not None:
            return page
        if ask and not self._bucket_seen:
            if self.bucket_missing():
                return self._no_bucket(action, key)
            self._bucket_seen = True
        return NoSuchObject(self.describe(key))

    def page(
        self, action: str, key: str, status: Any, response: Any, body: str
    ) -> StoreError | None:
        """The error of a refusal that is a page of HTML or XML (a web server, another
        cloud's API), which no GCS JSON API answers; None for any other, and for a server
        error (GCS's front end may answer 502 or 503 with a page of its own)."""
        headers = getattr(response, "headers", None)
        kind = str(headers.get("Content-Type", "")) if headers is not None else ""
        if not isinstance(status, int) or (status >= 500 and status != 501):
            return None
        if ("html" not in kind and "xml" not in kind) or not body.lstrip().startswith("<"):
            return None
        return StoreError(
            f"{self.gcs.shown_endpoint} does not behave like the GCS JSON API: it answered "
            f"{status} with a page ({kind.split(';')[0]}) when asked to {action} "
            f"{self.describe(key)}; check the endpoint (--endpoint-url, STORAGE_EMULATOR_HOST)"
        )

    def _no_bucket(self, action: str, key: str) -> StoreError:
        return StoreError(
            f"bucket {self.bucket!r} does not exist (while trying to {action} "
            f"{self.describe(key)}); create it first (`gcloud storage buckets create "
            f"gs://{self.bucket}`)"
        )

    def bucket_missing(self) -> bool:
        """Whether the bucket is missing (asked after a 404 that does not say which)."""
        try:
            return not self._bucket.exists(timeout=TIMEOUT, retry=READ_RETRY)
        except (api_exceptions.GoogleAPICallError, *CONNECTION_ERRORS):
            return False

    def call(
        self,
        action: str,
        key: str,
        send: Callable[[], T],
        *,
        conditional: bool = False,
        write: bool = False,
        resent: bool = False,
        absent_ok: bool = False,
    ) -> T:
        """Run one request and map its outcome (as ``S3Store._call``): ``conditional``, a
        412 is ``PreconditionFailed``; ``write``, a broken connection is ``OutcomeUnknown``
        and a 404 means the bucket is missing (asked, where the answer does not say it),
        unless ``absent_ok`` (a delete: a missing object is what it wants, and asking about
        the bucket would need a permission agents do not have); ``resent``, a body refused
        for its digest is ``BodyDamaged``. A write waits its turn (``GCSClient.pace_write``)."""
        if write:
            self.gcs.pace_write()
        try:
            return send()
        except (api_exceptions.BadRequest, api_exceptions.PreconditionFailed) as e:
            if resent and damaged(e):
                raise BodyDamaged(f"{self.describe(key)}: {answer(e)}") from e
            if conditional and isinstance(e, api_exceptions.PreconditionFailed):
                raise PreconditionFailed(f"{self.describe(key)}: 412", answer=answer(e)) from e
            raise self.fail(e, action, key) from e
        except api_exceptions.NotFound as e:
            raise self.missing(action, key, not_found(e), e.response, ask=not absent_ok) from e
        except CONNECTION_ERRORS as e:
            if write:
                raise OutcomeUnknown(f"{self.describe(key)}: {type(e).__name__}") from e
            raise self.fail(e, action, key) from e
        except google.auth.exceptions.TransportError as e:
            if write:
                raise OutcomeUnknown(f"{self.describe(key)}: {type(e).__name__}") from e
            raise self.fail(e, action, key) from e
        except (
            api_exceptions.GoogleAPICallError,
            api_exceptions.RetryError,
            google.auth.exceptions.GoogleAuthError,
            DataCorruption,
            InvalidResponse,
        ) as e:
            raise self.fail(e, action, key) from e

    # -- objects --------------------------------------------------------------------------

    def _metadata(self, key: str, not_generation: int | None = None) -> storage.Blob | None:
        """The object's metadata; None when it is still generation ``not_generation``."""
        blob = self.blob(key)
        try:
            self.call(
                "read",
                key,
                lambda: blob.reload(
                    if_generation_not_match=not_generation, timeout=TIMEOUT, retry=READ_RETRY
                ),
            )
        except StoreError as e:
            if isinstance(e.__cause__, api_exceptions.NotModified):
                return None
            raise
        if blob.generation is None:
            raise StoreError(
                f"{self.gcs.shown_endpoint} answered no generation for "
                f"{self.describe(key)}: is it a GCS JSON API endpoint?"
            )
        if not_generation is not None and blob.generation == not_generation:
            return None  # a store that ignores ifGenerationNotMatch
        return blob

    def get(self, key: str, if_none_match: str | None = None) -> Blob | None:
        known = generation(if_none_match)
        for attempt in range(READS):
            if attempt:
                self.runtime.sleep(0.005 * 2**attempt * (0.5 + self.runtime.random()))
            meta = self._metadata(key, known)
            if meta is None:
                return None
            exact = self.blob(key, generation=meta.generation)
            try:
                body: bytes = self.call("read", key, partial(download, exact))
            except NoSuchObject:
                continue  # replaced (or deleted) since its metadata was read: ask again
            return Blob(body=body, etag=str(meta.generation), metadata=shown(meta))
        raise StoreError(
            f"could not read {self.describe(key)}: it was replaced {READS} times while being "
            "read; retry"
        )

    def head(self, key: str) -> Head:
        meta = self._metadata(key)
        assert meta is not None
        return Head(
            etag=str(meta.generation),
            size=int(meta.size or 0),
            metadata=shown(meta),
            completed_upload=(meta.metadata or {}).get(UPLOAD_META),
        )

    def open(self, key: str, byte_range: tuple[int, int] | None = None) -> GCSStream:
        """The object's bytes, or ``[start, end)`` of them (an ``end`` past the object's
        end is its end), streamed from one media download (``range_header`` checks an empty
        one)."""
        headers: dict[str, str] = {}
        if byte_range is not None:
            header = self.range_header(key, byte_range)
            if header is None:
                return GCSStream(None, self.describe(key))
            headers["Range"] = header
        url = (
            f"{self.gcs.endpoint}/download/storage/v1/b/{quote(self.bucket, safe='')}/o/"
            f"{quote(self.full_key(key), safe='')}?alt=media"
        )

        def send() -> Any:
            return self.gcs.session.request(
                "GET", url, headers=headers, stream=True, timeout=TIMEOUT
            )

        response = self.call("read", key, lambda: READ_RETRY(retry_status(send))())
        if response.status_code == 404:
            body = _text(response)  # read before the close (then kept by the response)
            response.close()
            raise self.missing("read", key, missing_what(body), response)
        if response.status_code == 416:
            response.close()
            raise StoreError(
                f"could not read {self.describe(key)}: range {byte_range} is outside the object"
            )
        if response.status_code not in (200, 206):
            status, body = response.status_code, _text(response)
            response.close()
            page = self.page("read", key, status, response, body)
            raise page or self.fail(status_error(status, "media download"), "read", key)
        return GCSStream(response, self.describe(key))

    def write(self, put: Put) -> str:
        """Write an object with one multipart upload and return its generation."""
        self._writable(put.key)
        return str(self.write_whole(put).generation)

    def precondition(self, key: str, mode: PutMode) -> int | None:
        """``ifGenerationMatch`` for ``mode``: 0 to create, the generation to update, None
        to overwrite. An update naming no generation is a lost race at once."""
        if mode.kind == "create":
            return 0
        if mode.kind == "update":
            match = generation(mode.etag)
            if match is None:
                raise PreconditionFailed(
                    f"{self.describe(key)}: {mode.etag!r} is no generation", answer="412"
                )
            return match
        return None

    def write_whole(self, put: Put, action: str = "write") -> storage.Blob:
        """One multipart upload of ``put`` under its mode's ``precondition``, with its
        CRC32C, sent again while the store refuses it as damaged on its way. The CRC32C is
        the digest GCS checks (and recommends); an MD5 beside it would check nothing more
        and costs a hash of the body on every commit, many times the CRC32C's. GCS computes
        the MD5 of what it stored itself (a part's ETag)."""
        key = put.key
        match = self.precondition(key, put.mode)
        data = put.data()
        crc32c = crc32c_base64(data)
        blob = send_whole(
            lambda: self.call(
                action,
                key,
                lambda: self._upload(put, data, match, crc32c),
                conditional=match is not None,
                write=True,
                resent=True,
            ),
            self.runtime,
            self.describe(key),
        )
        if blob.generation is None:
            raise StoreError(
                f"{self.gcs.shown_endpoint} answered no generation for {self.describe(key)}: "
                "is it a GCS JSON API endpoint?"
            )
        return blob

    def _upload(
        self, put: Put, data: bytes, match: int | None, crc32c: str, md5: str | None = None
    ) -> storage.Blob:
        """``put``'s one upload request, of ``data`` (its body whole)."""
        blob = self.blob(put.key)
        if put.metadata:
            blob.metadata = put.metadata
        if md5 is not None:
            blob.md5_hash = md5
        blob.crc32c = crc32c
        blob.upload_from_string(
            data,
            content_type=put.content_type,
            if_generation_match=match,
            checksum=None,  # the digest is in the upload's metadata already
            retry=WRITE_RETRY,
            timeout=TIMEOUT,
        )
        return blob

    def put_digested(self, key: str, body: bytes, content_md5: str) -> tuple[bool, str]:
        """Write ``body`` with ``content_md5`` (base64) as its MD5, whatever its real
        digest, once, and a CRC32C (the digest every write carries) that is wrong exactly
        when that MD5 is: (stored, the store's answer). ``doctor`` asks with it whether the
        store checks a digest."""
        put = Put(key, body, OVERWRITE, None, "application/octet-stream")
        right = checksum.content_md5(body) == content_md5
        crc32c = crc32c_base64(body if right else body + b"!")
        try:
            self.call(
                "write",
                key,
                lambda: self._upload(put, body, None, crc32c, content_md5),
                write=True,
                resent=True,
            )
        except BodyDamaged as e:
            cause = e.__cause__
            return False, answer(cause) if isinstance(
                cause, api_exceptions.GoogleAPICallError
            ) else "refused"
        return True, "200"

    def delete(self, key: str) -> None:
        self._writable(key)
        blob = self.blob(key)
        try:
            self.call(
                "delete",
                key,
                lambda: blob.delete(timeout=TIMEOUT, retry=WRITE_RETRY),
                write=True,
                absent_ok=True,
            )
        except NoSuchObject:
            return
        except OutcomeUnknown as e:
            raise StoreError(
                f"could not delete {self.describe(key)}: the answer was lost ({e}); it may or "
                "may not be gone, retry"
            ) from e

    def list(self, prefix: str, delimiter: str | None = None) -> Iterator[Listed]:
        """Keys under ``prefix`` in code-point order, every page read first; the store's
        own ``PARTS`` are never listed."""
        rows: dict[str, Listed] = {}
        base = len(self.full_key(""))
        for name, is_prefix in self.list_names(self.full_key(prefix), delimiter, prefix):
            key = name[base:]
            if key.startswith(PARTS):
                continue
            rows[name] = Listed(key, is_prefix)
        for name in sorted(rows):
            yield rows[name]

    def list_names(
        self, full_prefix: str, delimiter: str | None, key: str, limit: int | None = None
    ) -> Iterator[tuple[str, bool]]:
        """(object name, is a common prefix) of every object under ``full_prefix``."""

        def pages() -> list[tuple[str, bool]]:
            listing = self.gcs.client.list_blobs(
                self._bucket,
                prefix=full_prefix,
                delimiter=delimiter or None,
                max_results=limit,
                page_size=self.page_size,
                timeout=TIMEOUT,
                retry=READ_RETRY,
            )
            found: list[tuple[str, bool]] = []
            for page in listing.pages:
                found += [(item.name, False) for item in page]
                found += [(common, True) for common in page.prefixes]
            return found

        try:
            return iter(self.call("list", key, pages))
        except NoSuchObject as e:
            raise self.listing_failed("list", key, e) from e

    def listing_failed(self, action: str, key: str, e: NoSuchObject) -> StoreError:
        """A listing answered 404: the bucket is missing (asked), or the answer says so."""
        if self.bucket_missing():
            return self._no_bucket(action, key)
        return StoreError(f"could not {action} {self.describe(key)}: answered 404")

    page_size: int | None = None
    """How many names a listing asks for per page (None: the store's own, 1000)."""

    # -- versions (object versioning: noncurrent generations, see gcs_versions) -----------

    def versions(self, key: str) -> Iterator[Version] | None:
        return self.generations.versions(key)

    def get_version(self, key: str, version_id: str) -> Blob:
        return self.generations.get_version(key, version_id)

    # -- multipart uploads ----------------------------------------------------------------

    def create_upload(self, key: str) -> str:
        self._writable(key)
        return self.uploads.create(key)

    # -- time -----------------------------------------------------------------------------

    def now(self) -> datetime:
        """The store's time; asks the store once (a listing of at most one key under the
        store's own prefix) if no answer has told it yet. Even a refusal carries a Date."""
        if not self.clock.known:
            try:
                self.list_names(self.full_key(""), "/", "", limit=1)
            except StoreError:
                if not self.clock.known:
                    raise
        return self.clock.now()


def open_store(url: StoreURL, *, endpoint_url: str | None, runtime: Runtime | None) -> ObjectStore:
    """The store a ``gs://BUCKET/PREFIX`` URL names (``store.connect``): at
    ``endpoint_url`` (else ``STORAGE_EMULATOR_HOST``, else Google's, with application
    default credentials)."""
    return GCSStore(make_gcs_client(endpoint_url), url.bucket, url.prefix, runtime=runtime)


def _text(response: Any) -> str:
    """The first of an error answer's text ("" where there is none to read)."""
    try:
        return str(response.text)[:2000] if response is not None else ""
    except (AttributeError, RuntimeError, ValueError):  # a stream already consumed or closed
        return ""
