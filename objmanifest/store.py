"""A boto3 facade for one bucket and prefix: bytes, ETags, conditions and the store's clock.

No business logic lives here. Backend quirks are normalised here so no layer above sees
them, and every botocore error is mapped to a small set of outcomes:
``PreconditionFailed`` (lost a race), ``OutcomeUnknown`` (a write whose answer was lost),
``NotFound``, and ``StoreError`` for the rest.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlparse

import boto3
import botocore.exceptions
from botocore.config import Config

from .errors import NotFound, ObjManifestError, StoreError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_CONNECTION_ERRORS = (
    botocore.exceptions.ConnectionError,
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ReadTimeoutError,
)


class PreconditionFailed(Exception):
    """412 or 409 on a conditional write: someone else changed the object first."""


class OutcomeUnknown(Exception):
    """A write was sent but no answer came back: it may or may not have been applied."""


@dataclass(frozen=True)
class Blob:
    body: bytes
    etag: str
    metadata: dict[str, str]


@dataclass(frozen=True)
class Head:
    etag: str
    size: int
    metadata: dict[str, str]


class StoreClock:
    """The store's time, from the ``Date`` header of every response.

    Between responses it advances by this machine's monotonic clock, so the wall clock of the
    agent never matters. ``Date`` has whole seconds and is stamped before the answer
    arrives, so each observation is never later than the store's true time, and the best
    estimate is the latest of them. Only the last ``window`` seconds of observations count:
    if the store's clock is stepped back, or this machine's monotonic clock runs fast, the
    estimate follows within a minute instead of staying ahead forever.
    """

    def __init__(self, window: float = 60.0) -> None:
        self._window = window
        self._seen: deque[tuple[float, float]] = deque()  # (monotonic, offset), newest last
        self._lock = threading.Lock()

    def observe(self, headers: dict[str, str] | None) -> None:
        date = (headers or {}).get("date")
        if not date:
            return
        try:
            store_time = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            return
        mono = time.monotonic()
        with self._lock:
            self._seen.append((mono, store_time - mono))
            while len(self._seen) > 1 and self._seen[0][0] < mono - self._window:
                self._seen.popleft()
            if len(self._seen) > 256:  # many answers per second: keep the best of the old
                best = max(self._seen, key=lambda seen: seen[1])
                self._seen = deque([best, self._seen[-1]])

    @property
    def known(self) -> bool:
        return bool(self._seen)

    def now(self) -> datetime:
        with self._lock:
            if not self._seen:
                raise StoreError("the store's time is not known yet: no response carried a Date")
            offset = max(offset for _, offset in self._seen)
        return datetime.fromtimestamp(offset + time.monotonic(), tz=timezone.utc)


def _client_config(**overrides: Any) -> Config:
    settings: dict[str, Any] = {
        "s3": {"addressing_style": "path"},
        "request_checksum_calculation": "when_required",
        "response_checksum_validation": "when_required",
        "retries": {"max_attempts": 5, "mode": "standard"},
        "max_pool_connections": 32,
        "connect_timeout": 10,
        "read_timeout": 60,
    }
    settings.update(overrides)
    return Config(**settings)


def make_client(
    endpoint_url: str | None = None, region: str | None = None, **config: Any
) -> S3Client:
    """A boto3 S3 client with the settings S3-compatible stores need.

    Path-style addressing and ``when_required`` checksums: some stores reject virtual-host
    addressing on loopback and the aws-chunked bodies botocore >= 1.36 sends by default.
    """
    endpoint_url = (
        endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or None
    )
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    session = boto3.session.Session()
    client: S3Client = session.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region or "us-east-1",
        config=_client_config(**config),
    )
    return client


def _error_code(e: botocore.exceptions.ClientError) -> tuple[str, int]:
    err = e.response.get("Error", {})
    status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return str(err.get("Code", "")), status


class Store:
    """One bucket and prefix. Keys passed in are relative to the prefix."""

    def __init__(self, client: S3Client, bucket: str, prefix: str = "") -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.clock = StoreClock()

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def full_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def describe(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.full_key(key)}"

    def _observe(self, response: dict[str, Any]) -> None:
        self.clock.observe(response.get("ResponseMetadata", {}).get("HTTPHeaders"))

    def _fail(self, e: Exception, action: str, key: str) -> StoreError | NotFound:
        """Turn a botocore error into one that names the object and the fix."""
        if isinstance(e, botocore.exceptions.ClientError):
            self._observe(e.response)  # type: ignore[arg-type]
            code, status = _error_code(e)
            if code == "NoSuchBucket":
                return StoreError(
                    f"bucket {self.bucket!r} does not exist (while trying to {action} "
                    f"{self.describe(key)}); create it first"
                )
            if code in ("NoSuchKey", "NotFound") or status == 404:
                return NotFound(f"{self.describe(key)} does not exist")
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                return StoreError(
                    f"the store refused to {action} {self.describe(key)} ({code}): "
                    "check the credentials and the bucket policy"
                )
            return StoreError(f"could not {action} {self.describe(key)}: {code or status}")
        if isinstance(e, botocore.exceptions.NoCredentialsError):
            return StoreError(
                "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "a profile, or pass a configured boto3 client"
            )
        return StoreError(f"could not {action} {self.describe(key)}: {type(e).__name__}: {e}")

    # -- reads -------------------------------------------------------------------------

    def get(self, key: str, if_none_match: str | None = None) -> Blob | None:
        """The object, or None when ``if_none_match`` still matches (304, no body sent)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.full_key(key)}
        if if_none_match:
            kwargs["IfNoneMatch"] = if_none_match
        try:
            response = self.client.get_object(**kwargs)
            body = response["Body"].read()
        except botocore.exceptions.ClientError as e:
            code, status = _error_code(e)
            if status == 304 or code in ("304", "NotModified"):
                self._observe(e.response)  # type: ignore[arg-type]
                return None
            raise self._fail(e, "read", key) from e
        except (botocore.exceptions.BotoCoreError, OSError) as e:
            raise self._fail(e, "read", key) from e
        self._observe(response)  # type: ignore[arg-type]
        return Blob(body=body, etag=response["ETag"], metadata=response.get("Metadata", {}))

    def open(self, key: str, byte_range: tuple[int, int] | None = None) -> BinaryIO:
        """A streaming body: for data too large to hold in memory."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.full_key(key)}
        if byte_range is not None:
            kwargs["Range"] = f"bytes={byte_range[0]}-{byte_range[1] - 1}"
        try:
            response = self.client.get_object(**kwargs)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise self._fail(e, "read", key) from e
        self._observe(response)  # type: ignore[arg-type]
        return response["Body"]  # type: ignore[return-value]

    def head(self, key: str) -> Head:
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=self.full_key(key))
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise self._fail(e, "inspect", key) from e
        self._observe(response)  # type: ignore[arg-type]
        return Head(
            etag=response["ETag"],
            size=int(response["ContentLength"]),
            metadata=response.get("Metadata", {}),
        )

    def list_keys(self, prefix: str) -> Iterator[str]:
        """Keys under ``prefix``, relative to the store prefix."""
        paginator = self.client.get_paginator("list_objects_v2")
        base = len(self.full_key(""))
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.full_key(prefix)):
                for item in page.get("Contents", []):
                    yield item["Key"][base:]
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise self._fail(e, "list", prefix) from e

    # -- writes ------------------------------------------------------------------------

    def put(
        self,
        key: str,
        body: bytes | BinaryIO,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
        metadata: dict[str, str] | None = None,
        content_type: str = "application/octet-stream",
    ) -> str:
        """Write an object and return its ETag.

        With ``if_match`` a missing object is a lost race too: AWS answers 404 there and
        SeaweedFS 412, and both mean "not the version you read".
        """
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self.full_key(key),
            "Body": body,
            "ContentType": content_type,
        }
        if if_match:
            kwargs["IfMatch"] = if_match
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if metadata:
            kwargs["Metadata"] = metadata
        try:
            response = self.client.put_object(**kwargs)
        except botocore.exceptions.ClientError as e:
            code, status = _error_code(e)
            if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                self._observe(e.response)  # type: ignore[arg-type]
                raise PreconditionFailed(f"{self.describe(key)}: {code or status}") from e
            if if_match and (status == 404 or code == "NoSuchKey"):
                self._observe(e.response)  # type: ignore[arg-type]
                raise PreconditionFailed(f"{self.describe(key)}: gone") from e
            raise self._fail(e, "write", key) from e
        except _CONNECTION_ERRORS as e:
            raise OutcomeUnknown(f"{self.describe(key)}: {type(e).__name__}") from e
        except botocore.exceptions.BotoCoreError as e:
            raise self._fail(e, "write", key) from e
        self._observe(response)  # type: ignore[arg-type]
        return response["ETag"]

    def delete(self, key: str) -> None:
        try:
            response = self.client.delete_object(Bucket=self.bucket, Key=self.full_key(key))
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise self._fail(e, "delete", key) from e
        self._observe(response)  # type: ignore[arg-type]

    def now(self) -> datetime:
        """The store's time; asks the store once if no response has told it yet."""
        if not self.clock.known:
            try:
                response = self.client.list_objects_v2(Bucket=self.bucket, MaxKeys=1)
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
                raise self._fail(e, "list", "") from e
            self._observe(response)  # type: ignore[arg-type]
        return self.clock.now()


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix)."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"not an s3:// URL: {url!r}; use s3://BUCKET or s3://BUCKET/PREFIX")
    return parsed.netloc, parsed.path.strip("/")


def connect(
    url: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    client: S3Client | None = None,
) -> Store:
    """Open ``s3://bucket/prefix``.

    The endpoint comes from ``endpoint_url`` or the standard ``AWS_ENDPOINT_URL_S3`` /
    ``AWS_ENDPOINT_URL``; pass ``client`` to use a boto3 client configured your own way.
    """
    bucket, prefix = parse_url(url)
    return Store(client or make_client(endpoint_url, region), bucket, prefix)


def probe_conditional_writes(store: Store, key: str) -> list[str]:
    """What this store gets wrong about conditional writes; empty when it enforces them.

    The protocol is only safe on a store that refuses a second ``If-None-Match: *`` create
    and an ``If-Match`` with a stale ETag, so ``Task.create`` asks before trusting it.
    Each probe write has a body of its own and is read back when its answer is a refusal
    or lost, so a lost response (or a client retry meeting its own write) is not taken for
    a refusal.
    """
    nonce = uuid.uuid4().hex

    def accepted(step: str, **condition: Any) -> bool:
        body = f"{step}:{nonce}".encode()
        try:
            store.put(key, body, **condition)
            return True
        except (PreconditionFailed, OutcomeUnknown):
            pass
        try:
            blob = store.get(key)
        except NotFound:
            return False
        return blob is not None and blob.body == body

    problems = []
    try:
        if not accepted("create", if_none_match=True):
            return [f"a create with If-None-Match: * of a new key {store.describe(key)} failed"]
        if accepted("create-again", if_none_match=True):
            problems.append("If-None-Match: * is ignored (a second create of one key succeeded)")
        if accepted("stale", if_match='"00000000000000000000000000000000"'):
            problems.append("If-Match is ignored (a write with a stale ETag succeeded)")
        if not accepted("current", if_match=store.head(key).etag):
            problems.append("If-Match with the current ETag was refused")
    finally:
        with contextlib.suppress(ObjManifestError):
            store.delete(key)
    return problems
