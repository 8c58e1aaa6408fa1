"""``S3Store``: the storage seam over boto3, for AWS S3 and S3-compatible stores.

No layer of the manifest above it sees botocore (only the local-server tooling, the demo
and the tests make boto3 clients of their own). Every quirk of the stores
tested (AWS, SeaweedFS, MinIO, LocalStack, moto) is normalised here: 409, 412 and a 404 on
``If-Match`` are all a lost race, a connection that drops after a write was sent is an
unknown outcome, a body refused as damaged (``BadDigest`` and its kin) is sent again,
``NoSuchKey`` on a read is ``NoSuchObject``, ``NoSuchUpload`` is a vanished upload, and
every other error becomes a
``StoreError`` that names the object and the fix. The store's clock is read from the
``Date`` header of every response, errors included.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from functools import partial
from typing import IO, TYPE_CHECKING, Any, cast

import botocore.exceptions

from ..core import checksum
from ..core.runtime import Runtime
from ..errors import InvalidInput, ReadBrokeOff, StoreError
from .base import (
    CREATE,
    Blob,
    Head,
    Listed,
    PartBody,
    PartsListed,
    PrefixedStore,
    Put,
    PutMode,
    StoreClock,
    Version,
    send_whole,
)
from .errors import (
    BodyDamaged,
    NoSuchObject,
    OutcomeUnknown,
    PartsRejected,
    PreconditionFailed,
    UploadGone,
)
from .s3_answers import (
    COMPLETE_DAMAGED_CODES,
    CONNECTION_ERRORS,
    DAMAGED_CODES,
    PART_DAMAGED_CODES,
    RACE_CODES,
    S3Stream,
    error_code,
    failure,
    missing,
    not_s3,
    page_versions,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class S3Store(PrefixedStore):
    """One bucket and prefix of an S3 store. Keys passed in are relative to the prefix."""

    scheme = "s3"

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        prefix: str = "",
        *,
        runtime: Runtime | None = None,
    ) -> None:
        super().__init__(bucket, prefix, runtime)
        self.client = client
        self.clock = StoreClock(monotonic=self.runtime.monotonic)
        self.versions_page_size: int | None = None
        """Rows per ListObjectVersions request (None: S3's 1000); tests make it small."""

    @property
    def connections(self) -> int:
        return int(getattr(self.client.meta.config, "max_pool_connections", None) or 10)

    def _observe(self, response: Any) -> None:
        self.clock.observe(response.get("ResponseMetadata", {}).get("HTTPHeaders"))

    def _endpoint(self) -> str | None:
        return getattr(self.client.meta, "endpoint_url", None)

    def _not_s3(self, what: str, action: str, key: str) -> StoreError:
        """The endpoint answered something no S3 store answers."""
        return not_s3(self._endpoint(), what, action, self.describe(key))

    def _field(self, response: Any, name: str, action: str, key: str) -> Any:
        """A field every S3 answer to this request has; its absence means it is not S3."""
        value = response.get(name)
        if value is None:
            raise self._not_s3(f"without {name}", action, key)
        return value

    def _fail(
        self, e: Exception, action: str, key: str
    ) -> StoreError | NoSuchObject | InvalidInput:
        """Turn a botocore error into one that names the object and the fix (a missing
        object only on a read: ``READS``)."""
        if isinstance(e, botocore.exceptions.ClientError):
            self._observe(e.response)
        return failure(e, action, self.describe(key), self.bucket, self._endpoint())

    def _call(
        self,
        action: str,
        key: str,
        call: Callable[[], Any],
        *,
        conditional: bool = False,
        upload: bool = False,
        write: bool = False,
        resent: bool = False,
        damaged: frozenset[str] = DAMAGED_CODES,
        gone_is_race: bool = False,
    ) -> Any:
        """Run one request and map its outcome.

        ``conditional``: a lost race is ``PreconditionFailed``; ``upload``: a vanished
        upload is ``UploadGone`` and a rejected part list ``PartsRejected``; ``write``: a
        connection lost after sending is ``OutcomeUnknown``; ``resent``: a body refused as
        damaged (an error code in ``damaged``) is ``BodyDamaged`` (the caller sends it
        again, ``send_whole``); ``gone_is_race``: a missing object is a lost race too
        (``If-Match`` on a key that is not there).
        """
        try:
            response = call()
        except botocore.exceptions.ClientError as e:
            self._observe(e.response)
            code, status = error_code(e)
            if resent and code in damaged:
                raise BodyDamaged(f"{self.describe(key)}: {code}") from e
            if upload and code == "NoSuchUpload":
                raise UploadGone(f"{self.describe(key)}: the upload no longer exists") from e
            if upload and code in ("InvalidPart", "InvalidPartOrder"):
                raise PartsRejected(f"{self.describe(key)}: {code}") from e
            if conditional and (status in (409, 412) or code in RACE_CODES):
                raise PreconditionFailed(
                    f"{self.describe(key)}: {code or status}", answer=f"{status} {code}".strip()
                ) from e
            if gone_is_race and missing(code, status, action):
                raise PreconditionFailed(
                    f"{self.describe(key)}: gone", answer=f"{status} {code}".strip()
                ) from e
            raise self._fail(e, action, key) from e
        except CONNECTION_ERRORS as e:
            if write:
                raise OutcomeUnknown(f"{self.describe(key)}: {type(e).__name__}") from e
            raise self._fail(e, action, key) from e
        except botocore.exceptions.BotoCoreError as e:
            raise self._fail(e, action, key) from e
        self._observe(response)
        return response

    # -- objects --------------------------------------------------------------------------

    def get(self, key: str, if_none_match: str | None = None) -> Blob | None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.full_key(key)}
        if if_none_match:
            kwargs["IfNoneMatch"] = if_none_match
        try:
            response = self.client.get_object(**kwargs)
            body = S3Stream(response["Body"], self.describe(key)).read()
        except botocore.exceptions.ClientError as e:
            code, status = error_code(e)
            if status == 304 or code in ("304", "NotModified"):
                self._observe(e.response)
                return None
            raise self._fail(e, "read", key) from e
        except ReadBrokeOff as e:
            raise StoreError(f"could not read {self.describe(key)}: {e}") from e
        except botocore.exceptions.BotoCoreError as e:
            raise self._fail(e, "read", key) from e
        self._observe(response)
        etag = self._field(response, "ETag", "read", key)
        return Blob(body=body, etag=etag, metadata=response.get("Metadata", {}))

    def open(self, key: str, byte_range: tuple[int, int] | None = None) -> S3Stream:
        """The object's bytes, or ``[start, end)`` of them (an ``end`` past the object's
        end is its end; ``range_header`` checks an empty one)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.full_key(key)}
        if byte_range is not None:
            header = self.range_header(key, byte_range)
            if header is None:
                return S3Stream(io.BytesIO(b""), self.describe(key))
            kwargs["Range"] = header
        response = self._call("read", key, lambda: self.client.get_object(**kwargs))
        return S3Stream(response["Body"], self.describe(key))

    def head(self, key: str) -> Head:
        response = self._call(
            "inspect",
            key,
            lambda: self.client.head_object(Bucket=self.bucket, Key=self.full_key(key)),
        )
        return Head(
            etag=self._field(response, "ETag", "inspect", key),
            size=int(response["ContentLength"]),
            metadata=response.get("Metadata", {}),
        )

    def write(self, put: Put) -> str:
        """Write an object and return its ETag.

        With ``PutMode.update`` a missing object is a lost race too: AWS answers 404 there
        and SeaweedFS 412, and both mean "not the version you read". A body given as bytes
        carries its ``Content-MD5``: a store that verifies it refuses the body if it was
        damaged on its way, and it is sent again (``send_whole``).
        """
        key, body, mode = put.key, put.body, put.mode
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self.full_key(key),
            "Body": body,
            "ContentType": put.content_type,
        }
        if isinstance(body, (bytes, bytearray, memoryview)):
            kwargs["ContentMD5"] = checksum.content_md5(body)
        if mode.kind == "update":
            kwargs["IfMatch"] = mode.etag
        elif mode.kind == "create":
            kwargs["IfNoneMatch"] = "*"
        if put.metadata:
            kwargs["Metadata"] = put.metadata
        response = send_whole(
            lambda: self._call(
                "write",
                key,
                lambda: self.client.put_object(**kwargs),
                conditional=put.conditional,
                write=True,
                resent=True,
                gone_is_race=mode.kind == "update",
            ),
            self.runtime,
            self.describe(key),
        )
        return str(self._field(response, "ETag", "write", key))

    def put_digested(self, key: str, body: bytes, content_md5: str) -> tuple[bool, str]:
        """Write ``body`` with ``content_md5`` (base64) as its ``Content-MD5``, whatever its
        real digest: (stored, the store's answer). A refusal for the digest (``BadDigest``,
        ``InvalidDigest``) is (False, answer); any other error is raised. ``doctor`` asks
        with it whether the store verifies a digest."""
        try:
            response = self.client.put_object(
                Bucket=self.bucket, Key=self.full_key(key), Body=body, ContentMD5=content_md5
            )
        except botocore.exceptions.ClientError as e:
            self._observe(e.response)
            code, status = error_code(e)
            if code in ("BadDigest", "InvalidDigest"):
                return False, f"{status} {code}"
            raise self._fail(e, "write", key) from e
        except botocore.exceptions.BotoCoreError as e:
            raise self._fail(e, "write", key) from e
        self._observe(response)
        return True, "200"

    def delete(self, key: str) -> None:
        self._call(
            "delete",
            key,
            lambda: self.client.delete_object(Bucket=self.bucket, Key=self.full_key(key)),
        )

    def list(self, prefix: str, delimiter: str | None = None) -> Iterator[Listed]:
        """Keys under ``prefix`` in S3's order (by code point, as UTF-8 bytes sort).

        Every page is read before the first row is given: SeaweedFS pages through its
        directory tree, so ``a/b`` comes before ``a.json`` there, and only the whole listing
        can be put in order. A page's common prefixes are merged with its keys.
        """
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.full_key(prefix)}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        rows: dict[str, Listed] = {}
        while True:
            request = dict(kwargs)
            page = self._call("list", prefix, partial(self.client.list_objects_v2, **request))
            for item in page.get("Contents", []):
                rows[item["Key"]] = Listed(self.relative(item["Key"]))
            for common in page.get("CommonPrefixes", []):
                rows[common["Prefix"]] = Listed(self.relative(common["Prefix"]), True)
            if not page.get("IsTruncated"):
                break
            kwargs["ContinuationToken"] = page["NextContinuationToken"]
        for key in sorted(rows):
            yield rows[key]

    # -- versions (bucket versioning) ----------------------------------------------------

    def versions(self, key: str) -> Iterator[Version] | None:
        """The versions the bucket keeps of ``key``, newest first, delete markers too
        (ListObjectVersions, a page at a time as they are read). None where none is kept
        beside the object: a bucket without versioning lists only the object there, as
        version ``null``; and where the store does not implement the request
        (``NotImplemented``)."""
        full = self.full_key(key)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full}
        if self.versions_page_size:
            kwargs["MaxKeys"] = self.versions_page_size
        try:
            first = self._call(
                "list the versions of", key, partial(self.client.list_object_versions, **kwargs)
            )
        except StoreError as e:
            cause = e.__cause__
            if isinstance(cause, botocore.exceptions.ClientError) and error_code(cause)[0] in (
                "NotImplemented",
                "MethodNotAllowed",
            ):
                return None
            raise
        rows = self._page_versions(first, key)
        if len(rows) == 1 and rows[0].version_id == "null" and not first.get("IsTruncated"):
            return None
        return self._version_pages(key, kwargs, first)

    def _page_versions(self, page: Any, key: str) -> Sequence[Version]:
        try:
            return page_versions(page, self.full_key(key))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise self._not_s3("a version listing without its fields", "list", key) from None

    def _version_pages(self, key: str, kwargs: dict[str, Any], page: Any) -> Iterator[Version]:
        full = kwargs["Prefix"]
        while True:
            yield from self._page_versions(page, key)
            later = [v["Key"] for v in (*page.get("Versions", []), *page.get("DeleteMarkers", []))]
            if not page.get("IsTruncated") or any(k != full for k in later):
                return  # keys come in order: one past ``full`` ends its versions
            kwargs.update(
                KeyMarker=page["NextKeyMarker"], VersionIdMarker=page["NextVersionIdMarker"]
            )
            page = self._call(
                "list the versions of", key, partial(self.client.list_object_versions, **kwargs)
            )

    def get_version(self, key: str, version_id: str) -> Blob:
        """One version of ``key`` (GetObject with its ``VersionId``); ``NoSuchObject`` when
        it is not there (``NoSuchVersion``; a delete marker, which AWS answers with 405)."""
        where = f"{self.describe(key)} (version {version_id})"
        try:
            response = self.client.get_object(
                Bucket=self.bucket, Key=self.full_key(key), VersionId=version_id
            )
            body = S3Stream(response["Body"], where).read()
        except botocore.exceptions.ClientError as e:
            code, status = error_code(e)
            if code in ("NoSuchVersion", "NoSuchKey", "MethodNotAllowed") or status == 405:
                self._observe(e.response)
                raise NoSuchObject(where) from None
            raise self._fail(e, "read a version of", key) from e
        except ReadBrokeOff as e:
            raise StoreError(f"could not read {where}: {e}") from e
        except botocore.exceptions.BotoCoreError as e:
            raise self._fail(e, "read a version of", key) from e
        self._observe(response)
        etag = self._field(response, "ETag", "read a version of", key)
        return Blob(body=body, etag=etag, metadata=response.get("Metadata", {}))

    # -- multipart uploads ----------------------------------------------------------------

    def create_upload(self, key: str) -> str:
        response = self._call(
            "start a multipart upload of",
            key,
            lambda: self.client.create_multipart_upload(Bucket=self.bucket, Key=self.full_key(key)),
        )
        return str(self._field(response, "UploadId", "start a multipart upload of", key))

    def upload_part(self, key: str, upload_id: str, number: int, body: PartBody) -> str:
        """Send one part; its bare ETag (the part's MD5 on S3 and the stores tested here).

        A part streamed from a file carries no digest header (that would need a second read
        of it): the caller compares the ETag with the MD5 of what it sent. A part the store
        refuses as damaged anyway (a signed payload hash over http, or a signature that no
        longer matches a part cut short) is sent again.

        Bytes go as a file object too: given ``bytes``, botocore copies them into one buffer
        with the headers; ``BytesIO`` shares them and is rewound for a retry.
        """
        stream = io.BytesIO(body) if isinstance(body, bytes) else cast(IO[bytes], body)
        length = len(body) if isinstance(body, bytes) else body.length

        def send() -> Any:
            stream.seek(0)
            return self._call(
                f"upload part {number} of",
                key,
                lambda: self.client.upload_part(
                    Bucket=self.bucket,
                    Key=self.full_key(key),
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=stream,
                    ContentLength=length,
                ),
                upload=True,
                resent=True,
                damaged=PART_DAMAGED_CODES,
            )

        try:
            response = send_whole(send, self.runtime, f"part {number} of {self.describe(key)}")
        except StoreError as e:
            if self._unclear_but_gone(e, key, upload_id):
                raise UploadGone(f"{self.describe(key)}: the upload no longer exists") from e
            raise
        return checksum.bare_etag(self._field(response, "ETag", f"upload part {number} of", key))

    def _unclear_but_gone(self, e: Exception, key: str, upload_id: str) -> bool:
        """Whether an upload call's error that did not name ``NoSuchUpload`` (a 404 of
        another kind, or a server error: moto answers 500 to a part or a completion of an
        upload that is gone) was about an upload that no longer exists."""
        cause = e.__cause__
        if not isinstance(cause, botocore.exceptions.ClientError):
            return False
        status = error_code(cause)[1]
        return (status >= 500 or status == 404) and self._upload_gone(key, upload_id)

    def _upload_gone(self, key: str, upload_id: str) -> bool:
        """Whether the store says the upload no longer exists (False if it cannot tell)."""
        try:
            self._call(
                "list the parts of",
                key,
                lambda: self.client.list_parts(
                    Bucket=self.bucket, Key=self.full_key(key), UploadId=upload_id, MaxParts=1
                ),
                upload=True,
            )
        except UploadGone:
            return True
        except StoreError:
            return False
        return False

    def list_parts(self, key: str, upload_id: str) -> PartsListed:
        listed: PartsListed = {}
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self.full_key(key),
            "UploadId": upload_id,
        }
        while True:
            page = dict(kwargs)
            response = self._call(
                "list the parts of", key, partial(self.client.list_parts, **page), upload=True
            )
            for part in response.get("Parts", []):
                etag = checksum.bare_etag(part["ETag"])
                listed.setdefault(int(part["PartNumber"]), {})[etag] = int(part["Size"])
            if not response.get("IsTruncated"):
                return listed
            kwargs["PartNumberMarker"] = int(response["NextPartNumberMarker"])

    def complete_upload(
        self, key: str, upload_id: str, etags: Sequence[str], mode: PutMode = CREATE
    ) -> None:
        parts = [{"PartNumber": n, "ETag": f'"{etag}"'} for n, etag in enumerate(etags, start=1)]
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self.full_key(key),
            "UploadId": upload_id,
            "MultipartUpload": {"Parts": parts},
        }
        if mode.kind == "create":
            kwargs["IfNoneMatch"] = "*"
        elif mode.kind == "update":
            kwargs["IfMatch"] = mode.etag

        def send() -> Any:
            return self._call(
                "complete the multipart upload of",
                key,
                lambda: self.client.complete_multipart_upload(**kwargs),
                conditional=mode.kind != "overwrite",
                upload=True,
                write=True,
                resent=True,
                damaged=COMPLETE_DAMAGED_CODES,
            )

        try:
            send_whole(send, self.runtime, f"the completion of {self.describe(key)}")
        except StoreError as e:
            if self._unclear_but_gone(e, key, upload_id):
                raise UploadGone(f"{self.describe(key)}: the upload no longer exists") from e
            raise

    def abort_upload(self, key: str, upload_id: str) -> bool:
        """Abort the upload; False if it was completed or aborted already.

        SeaweedFS answers 204 to an abort of an upload that is gone (where AWS and moto
        answer ``NoSuchUpload``), so the store is asked first whether the upload exists.
        """
        if self._upload_gone(key, upload_id):
            return False
        try:
            self._call(
                "abort the multipart upload of",
                key,
                lambda: self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=self.full_key(key), UploadId=upload_id
                ),
                upload=True,
            )
        except UploadGone:
            return False
        return True

    def list_uploads(self, prefix: str) -> Iterator[tuple[str, str]]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.full_key(prefix)}
        while True:
            request = dict(kwargs)
            response = self._call(
                "list the multipart uploads under",
                prefix,
                partial(self.client.list_multipart_uploads, **request),
            )
            for upload in response.get("Uploads", []):
                yield self.relative(upload["Key"]), upload["UploadId"]
            if not response.get("IsTruncated"):
                return
            kwargs["KeyMarker"] = response.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = response.get("NextUploadIdMarker", "")

    # -- time -----------------------------------------------------------------------------

    def now(self) -> datetime:
        """The store's time; asks the store once if no response has told it yet.

        The question is a listing of at most one key under the store's own prefix, so a
        permission scoped to that prefix is enough; even a refusal carries a ``Date``.
        """
        if not self.clock.known:
            try:
                self._call(
                    "list",
                    "",
                    lambda: self.client.list_objects_v2(
                        Bucket=self.bucket, Prefix=self.full_key(""), MaxKeys=1
                    ),
                )
            except StoreError:
                if not self.clock.known:
                    raise
        return self.clock.now()
