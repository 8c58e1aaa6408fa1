"""How GCS's answers are read: a version token as a generation, a refusal of a damaged body,
a response body as a stream that says a broken read, a retryable status of a raw request,
one generation's bytes checked against their CRC32C, and the digests a body carries."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable
from typing import Any

import google_crc32c
import requests
from google.api_core import exceptions as api_exceptions
from google.cloud import storage

from ..errors import ReadBrokeOff
from .gcs_client import CONNECTION_ERRORS, READ_RETRY, TIMEOUT

ENFORCES = {
    "create-only": "a multipart upload with ifGenerationMatch=0",
    "create-only race": "a multipart upload with ifGenerationMatch=0",
    "update-if-match": "a multipart upload with ifGenerationMatch on the object's generation",
    "update-if-match, missing key": "ifGenerationMatch on an object that is gone",
    "update-if-match race": "a multipart upload with ifGenerationMatch on the generation",
    "conditional multipart completion": "compose of the part objects with ifGenerationMatch=0",
    "Date header": "the Date of every response, errors too",
    "ranged reads": "a media download with Range",
    "listing": "objects.list with prefix and delimiter, sorted by code point here",
    "digest verification": "the CRC32C in every upload's metadata (the MD5 when one is sent)",
}
"""How GCS enforces each of the probe's checks, for ``doctor``'s answers."""


def generation(token: str | None) -> int | None:
    """The generation a version token names, None if it names none (a generation is a
    positive integer; an S3 ETag or ``"0"`` is no version of any GCS object)."""
    if token is None:
        return None
    bare = token.strip().strip('"')
    if not bare.isascii() or not bare.isdigit():
        return None
    number = int(bare)
    return number if number > 0 else None


def damaged(e: Exception) -> bool:
    """Whether GCS refused a body for not matching the digest sent with it: a 400
    (``Provided MD5 hash ... doesn't match calculated MD5 hash``) from GCS, a 412 (``md5Hash
    validation failed``) from storage-testbench."""
    if not isinstance(e, (api_exceptions.BadRequest, api_exceptions.PreconditionFailed)):
        return False
    text = str(getattr(e, "message", "") or e).lower()
    digest = "md5" in text or "crc32c" in text
    return digest and ("match" in text or "validation failed" in text)


def missing_what(said: str) -> str | None:
    """What a 404 says is missing, by the store's own words (GCS: ``The specified bucket does
    not exist.``, ``No such object: B/K``), never the request's URL (a bucket may be called
    ``my-bucket``): "bucket", "object", or None when it does not say (an emulator's ``Not
    Found``: the bucket is asked, ``GCSStore.missing``)."""
    text = said.lower()
    if "bucket does not exist" in text:
        return "bucket"
    return "object" if "no such object" in text else None


def not_found(e: api_exceptions.NotFound) -> str | None:
    """``missing_what`` of an SDK's 404."""
    said = [str(err.get("message", "")) for err in (e.errors or []) if isinstance(err, dict)]
    return missing_what(" ".join([*said, str(e.message)]))


def answer(e: api_exceptions.GoogleAPICallError) -> str:
    """How the store said it, in short: ``412 conditionNotMet``."""
    reasons = [str(err.get("reason", "")) for err in (e.errors or []) if isinstance(err, dict)]
    reason = next((r for r in reasons if r), "")
    return f"{e.code} {reason}".strip() if e.code else reason


def download(blob: storage.Blob) -> bytes:
    """The bytes of the generation ``blob`` names, checked against its CRC32C."""
    body: bytes = blob.download_as_bytes(checksum="crc32c", timeout=TIMEOUT, retry=READ_RETRY)
    return body


def status_error(status: int, what: str) -> api_exceptions.GoogleAPICallError:
    """The SDK's error for an HTTP ``status`` answered to a raw request."""
    error: api_exceptions.GoogleAPICallError = api_exceptions.from_http_status(  # type: ignore[no-untyped-call]
        status, what
    )
    return error


def retry_status(send: Callable[[], Any]) -> Callable[[], Any]:
    """``send`` with a retryable status raised (for ``READ_RETRY``) instead of returned."""

    def checked() -> Any:
        response = send()
        if response.status_code in (429, 408, 500, 502, 503, 504):
            status = response.status_code
            response.close()
            raise status_error(status, "media download")
        return response

    return checked


def md5_hex(md5_hash: str | None) -> str:
    """GCS's base64 ``md5Hash`` as the bare hex an S3 part ETag is."""
    return base64.b64decode(md5_hash).hex() if md5_hash else ""


def crc32c_base64(body: bytes) -> str:
    """A body's CRC32C as GCS's JSON API writes it: base64 of its 4 big-endian bytes."""
    return base64.b64encode(google_crc32c.value(body).to_bytes(4, "big")).decode()


class GCSStream:
    """A media download as our ``ByteStream``: a read that breaks off is ``ReadBrokeOff``,
    and one that ends before the ``Content-Length`` the store announced is one too."""

    def __init__(self, response: requests.Response | None, where: str) -> None:
        """``response``: None for no bytes at all (an empty range)."""
        self._response = response
        self._raw: Any = response.raw if response is not None else None
        self._where = where
        length = response.headers.get("Content-Length") if response is not None else "0"
        self._left = int(length) if length and length.isdigit() else None

    def read(self, size: int = -1) -> bytes:
        if self._raw is None:
            return b""
        try:
            data: bytes = self._raw.read(None if size < 0 else size, decode_content=False)
        except CONNECTION_ERRORS as e:
            raise ReadBrokeOff(f"reading {self._where} broke off ({type(e).__name__}: {e})") from e
        if self._left is not None:
            self._left -= len(data)
            if not data and self._left > 0 and size != 0:
                raise ReadBrokeOff(
                    f"reading {self._where} broke off with {self._left} bytes still to come"
                )
        return data

    def close(self) -> None:
        if self._response is None:
            return
        with contextlib.suppress(*CONNECTION_ERRORS):  # the connection is gone either way
            self._response.close()
