"""How S3's answers are read: which error codes mean a lost race, a damaged body, a missing
object or a connection problem, each error said in words that name the object and the fix
(``failure``), and a response body as a stream that says a broken read."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import botocore.exceptions
import urllib3.exceptions

from ..errors import AccessDenied, InvalidInput, ReadBrokeOff, StoreError
from .base import Version
from .errors import NoSuchObject
from .urls import without_credentials

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


READS = ("read", "inspect")
"""The actions (``get``/``open``, ``head``) whose 404 is an object that is not there; on any
other call a 404 is no answer S3 gives, and an error."""


def missing(code: str, status: int, action: str) -> bool:
    """Whether an S3 error answer says the object is not there: ``NoSuchKey`` (a HEAD's
    404 has no code); a 404 of another call without a code is no S3 answer, and
    ``NoSuchBucket`` no object's."""
    if status == 404 and code in ("404", "") and action != "inspect":
        return False
    return code != "NoSuchBucket" and (code in ("NoSuchKey", "NotFound") or status == 404)


def not_s3(endpoint: str | None, what: str, action: str, where: str) -> StoreError:
    """The endpoint answered something no S3 store answers."""
    shown = without_credentials(endpoint) if endpoint else "the endpoint"
    return StoreError(
        f"{shown} does not behave like S3: it answered {what} when asked to {action} "
        f"{where}. Check the endpoint (--endpoint-url, AWS_ENDPOINT_URL_S3, "
        "AWS_ENDPOINT_URL) and that it is an S3 API, not a web or console port"
    )


def failure(
    e: Exception, action: str, where: str, bucket: str, endpoint: str | None
) -> StoreError | NoSuchObject | InvalidInput:
    """A botocore error as one that names the object (``where``) and the fix (a missing
    object only on a read: ``READS``)."""
    if isinstance(e, botocore.exceptions.ParamValidationError):
        detail = " ".join(str(e).split())
        return InvalidInput(f"cannot {action} {where}: {detail[:300]}")
    if isinstance(e, botocore.exceptions.ClientError):
        code, status = error_code(e)
        if status == 404 and code in ("404", "") and action != "inspect":
            # S3 explains every 404 but a HEAD's (NoSuchKey, NoSuchBucket ...)
            return not_s3(endpoint, "404 without an S3 error code", action, where)
        if code == "NoSuchBucket":
            return StoreError(
                f"bucket {bucket!r} does not exist (while trying to {action} {where}); "
                "create it first"
            )
        if missing(code, status, action):
            if action in READS:
                return NoSuchObject(where)
            return StoreError(f"could not {action} {where}: {code or status}")
        if code == "AccessDenied":
            return AccessDenied(
                f"the store refused to {action} {where} (AccessDenied): the credentials "
                "lack a permission (`objmanifest iam-policy` prints the policy objmanifest "
                "needs, `objmanifest doctor` names what is missing)"
            )
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return StoreError(
                f"the store refused to {action} {where} ({code}): check the credentials and "
                "the bucket policy"
            )
        if code == "EntityTooSmall":
            return StoreError(
                f"the store refused to {action} {where}: a part is smaller than 5 MiB (only "
                "the last may be); use part_size >= 5 MiB"
            )
        return StoreError(f"could not {action} {where}: {code or status}")
    if isinstance(e, botocore.exceptions.NoCredentialsError):
        return StoreError(
            "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "a profile, or pass a configured boto3 client"
        )
    if isinstance(e, CONNECTION_ERRORS):
        shown = without_credentials(endpoint) if endpoint else "the S3 endpoint"
        return StoreError(
            f"could not {action} {where}: no answer from {shown} ({connection_problem(e)}); "
            "check that the store runs and the endpoint (--endpoint-url, AWS_ENDPOINT_URL_S3, "
            "AWS_ENDPOINT_URL) is right"
        )
    return StoreError(f"could not {action} {where}: {type(e).__name__}: {e}")


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


def page_versions(page: Mapping[str, Any], key: str) -> list[Version]:
    """The versions of ``key`` one ListObjectVersions page holds, newest first.

    The page gives versions and delete markers apart, each newest first; they are merged by
    time, the one S3 marks latest first (S3's times have whole seconds: within one second,
    which of a write and a delete came first is not said, and a delete marker is put first).
    """
    written = [
        (
            bool(v.get("IsLatest")),
            Version(v["VersionId"], v["ETag"], int(v["Size"]), v["LastModified"]),
        )
        for v in page.get("Versions", [])
        if v.get("Key") == key
    ]
    markers = [
        (bool(m.get("IsLatest")), Version(m["VersionId"], "", 0, m["LastModified"], deleted=True))
        for m in page.get("DeleteMarkers", [])
        if m.get("Key") == key
    ]
    merged: list[Version] = []
    while written or markers:
        if not markers or (written and _before(written[0], markers[0])):
            merged.append(written.pop(0)[1])
        else:
            merged.append(markers.pop(0)[1])
    return merged


def _before(version: tuple[bool, Version], marker: tuple[bool, Version]) -> bool:
    """Whether a version written comes before (is newer than) a delete marker."""
    if version[0] or marker[0]:
        return version[0]
    return version[1].at is not None and marker[1].at is not None and version[1].at > marker[1].at
