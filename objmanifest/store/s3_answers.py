"""How S3's answers are read: which error codes mean a lost race, a damaged body or a
connection problem, and a response body as a stream that says a broken read."""

from __future__ import annotations

import contextlib
from typing import Any

import botocore.exceptions
import urllib3.exceptions

from ..errors import ReadBrokeOff

CONNECTION_ERRORS = (
    botocore.exceptions.ConnectionError,
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ReadTimeoutError,
)


READ_ERRORS = (botocore.exceptions.BotoCoreError, urllib3.exceptions.HTTPError, OSError)


RACE_CODES = ("PreconditionFailed", "ConditionalRequestConflict")


DAMAGED_CODES = frozenset(
    {
        "BadDigest",  # Content-MD5 or x-amz-checksum-* does not match (AWS, SeaweedFS, LocalStack)
        "InvalidDigest",
        "XAmzContentChecksumMismatch",
        "XAmzContentSHA256Mismatch",  # the signed payload hash (AWS over http)
        "IncompleteBody",  # fewer bytes than Content-Length said
    }
)


"""Refusals of a body that arrived other than it was sent: nothing was stored."""


PART_DAMAGED_CODES = DAMAGED_CODES | {"SignatureDoesNotMatch"}


"""A part carries no digest, but its signature covers its Content-Length: a part cut short
on its way (with a length to match) is refused as SignatureDoesNotMatch (SeaweedFS), by a
store that had just taken the same credentials for the upload itself."""


COMPLETE_DAMAGED_CODES = DAMAGED_CODES | {"MalformedXML"}


"""The part list of a completion is XML we wrote: refused as malformed, it was damaged on
its way (a byte flipped, the body cut short), and nothing was done."""


def connection_problem(e: Exception) -> str:
    """What went wrong with the connection, in words (no SDK class names)."""
    if isinstance(e, botocore.exceptions.ReadTimeoutError):
        return "it stopped answering: read timed out"
    if isinstance(e, botocore.exceptions.ConnectTimeoutError):
        return "connecting timed out"
    if isinstance(e, botocore.exceptions.EndpointConnectionError):
        return "the connection was refused, or the host is unknown"
    return "the connection broke"


def error_code(e: botocore.exceptions.ClientError) -> tuple[str, int]:
    err = e.response.get("Error", {})
    status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return str(err.get("Code", "")), status


class S3Stream:
    """A response body as our ``ByteStream``: a read that breaks off is ``ReadBrokeOff``."""

    def __init__(self, body: Any, where: str) -> None:
        self._body = body
        self._where = where

    def read(self, size: int = -1) -> bytes:
        try:
            data: bytes = self._body.read(None if size < 0 else size)
        except READ_ERRORS as e:
            raise ReadBrokeOff(f"reading {self._where} broke off ({type(e).__name__}: {e})") from e
        return data

    def close(self) -> None:
        with contextlib.suppress(*READ_ERRORS):  # the connection is gone either way
            self._body.close()
