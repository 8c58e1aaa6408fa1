"""How Azure's answers are read: an error's status and code, which codes mean a lost race,
a damaged body or a refusal of the credentials, and a download as a stream that says a
broken read."""

from __future__ import annotations

import contextlib
import hashlib
import re
from enum import Enum
from typing import Any, BinaryIO

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)

from ..errors import AccessDenied, InvalidInput, ReadBrokeOff, StoreError
from .azure_client import Credentials, redact
from .base import PartBody, PutMode
from .errors import NoSuchObject

RACE_CODES = frozenset({"BlobAlreadyExists", "ConditionNotMet", "TargetConditionNotMet"})
"""A conditional write that lost: create-only on an existing blob (409), a version that
is no longer current, or a blob that is gone (412)."""

DAMAGED_CODES = frozenset({"Md5Mismatch", "Crc64Mismatch", "InvalidXmlDocument"})
"""A body that did not arrive as it was sent (its ``Content-MD5`` or its crc64 does not
match, a block list that is no XML any more): nothing was stored."""

SIGNATURE_CODES = frozenset({"AuthenticationFailed", "AuthorizationFailure"})
"""A request whose signature the account did not accept. A Shared Key signature covers
``Content-Length``: a body cut short on its way, with a length to match, is refused so
too, by an account that takes the same credentials for everything else."""

DENIED_CODES = frozenset(
    {
        "AuthorizationPermissionMismatch",
        "AuthorizationPermissionDenied",
        "InsufficientAccountPermissions",
        "AuthorizationResourceTypeMismatch",
        "AuthorizationServiceMismatch",
    }
)
"""Signed in, but the role (or the SAS token) does not allow this request."""

BLOCK_LIST_CODES = frozenset({"InvalidBlockList", "InvalidBlockId"})
"""A commit that names a block the blob does not hold uncommitted."""


ENFORCES = {
    "create-only": "Put Blob with If-None-Match: *",
    "create-only race": "Put Blob with If-None-Match: *",
    "update-if-match": "Put Blob with If-Match on the blob's ETag",
    "update-if-match, missing key": "If-Match on a blob that is gone",
    "update-if-match race": "Put Blob with If-Match on the blob's ETag",
    "conditional multipart completion": "a create-only Put Block List of staged blocks",
    "Date header": "the Date of every response, errors too",
    "ranged reads": "Get Blob with x-ms-range",
    "listing": "List Blobs with prefix and delimiter, sorted by code point here",
    "digest verification": "the transactional Content-MD5 of every Put Blob and Put Block",
}
"""How Azure enforces each of the probe's checks, for ``doctor``'s answers."""


def answer(e: BaseException) -> tuple[int, str]:
    """The HTTP status and Azure's error code of an SDK error (0 and "" if none)."""
    response = getattr(e, "response", None)
    status = int(getattr(e, "status_code", None) or getattr(response, "status_code", 0) or 0)
    code: Any = getattr(e, "error_code", None)
    if code is None and response is not None:
        code = response.headers.get("x-ms-error-code")
    if isinstance(code, Enum):
        code = code.value
    return status, str(code or "")


def shown(e: BaseException, secrets: tuple[str, ...] = ()) -> str:
    """What an SDK error says, in one line of at most 300 characters, without secrets."""
    text = " ".join(str(getattr(e, "message", None) or e).split())
    return redact(text, secrets)[:300]


def said(e: HttpResponseError) -> str:
    """``STATUS Code``, as the store answered a refused request."""
    status, code = answer(e)
    return f"{status} {code}".strip()


def failure(
    e: Exception, action: str, where: str, container: str, credentials: Credentials
) -> StoreError | NoSuchObject | InvalidInput:
    """An SDK error as the error users see: it names the object and the fix, and never a
    secret (a blob that is not there: ``NoSuchObject``, which the store turns into an error
    on any call but a read's)."""
    status, code = answer(e)
    account = redact(credentials.account_url, credentials.secrets)
    if isinstance(e, HttpResponseError) and status:
        if code == "ContainerNotFound":
            return StoreError(
                f"container {container!r} does not exist in {account} (while trying "
                f"to {action} {where}); create it first: az storage container create "
                f"--name {container}"
            )
        if code == "BlobNotFound" or (status == 404 and not code and action == "inspect"):
            return NoSuchObject(where)
        if code in DENIED_CODES:
            return AccessDenied(
                f"the store refused to {action} {where} ({code}): the identity's role "
                f"lacks a data action (`objmanifest iam-policy --url az://{container}` "
                "prints the role objmanifest needs, `objmanifest doctor` names what is "
                "missing)"
            )
        if status in (401, 403) or code in SIGNATURE_CODES:
            return StoreError(
                f"{account} refused the credentials of {credentials.how} while "
                f"trying to {action} {where} ({status} {code}): check the account key or "
                "SAS token (its expiry and permissions), or sign in again (az login)"
            )
        if status == 404 or not code:
            return StoreError(
                f"{account} does not behave like Azure Blob Storage: it answered {status} "
                f"{code or 'without an error code'} when asked to {action} {where}. Check "
                "the account URL (--endpoint-url, AZURE_STORAGE_ACCOUNT_URL) or the "
                "connection string's BlobEndpoint"
            )
        if code == "InvalidMetadata":
            return InvalidInput(f"cannot {action} {where}: Azure refused its metadata")
        return StoreError(f"could not {action} {where}: {status} {code}".rstrip())
    if isinstance(e, ClientAuthenticationError):
        return StoreError(
            f"could not sign in to {account} to {action} {where} with "
            f"{credentials.how}: {shown(e, credentials.secrets)}. Sign in (az login, a managed "
            "identity, AZURE_CLIENT_ID with AZURE_TENANT_ID and AZURE_CLIENT_SECRET) or set "
            "AZURE_STORAGE_CONNECTION_STRING"
        )
    if isinstance(e, (ServiceRequestError, ServiceResponseError)):
        return StoreError(
            f"could not {action} {where}: no answer from {account} "
            f"({shown(e, credentials.secrets)}); "
            "check that the store runs and the account URL (--endpoint-url, "
            "AZURE_STORAGE_ACCOUNT_URL, or the connection string's BlobEndpoint) is right"
        )
    return StoreError(
        f"could not {action} {where}: {type(e).__name__}: {shown(e, credentials.secrets)}"
    )


_PLAIN_NAME = re.compile(r"[a-z][a-z0-9]*")
_ENCODED_NAME = re.compile(r"_((?:[0-9a-f]{2})+)")


def metadata_out(metadata: dict[str, str] | None, where: str) -> dict[str, str] | None:
    """Metadata as Azure takes it: names as identifiers, values printable ASCII."""
    if not metadata:
        return None
    out: dict[str, str] = {}
    for name, value in metadata.items():
        if not isinstance(value, str) or not all(" " <= c <= "~" for c in value):
            raise InvalidInput(
                f"cannot write {where}: metadata {name!r} has a value that is not printable "
                f"ASCII ({value!r}); object metadata travels in HTTP headers"
            )
        out[name if _PLAIN_NAME.fullmatch(name) else "_" + name.encode().hex()] = value
    return out


COMPLETED_UPLOAD = "objmanifest_upload"
"""The metadata name under which a blob committed from an upload's blocks records the
upload's id (``Head.completed_upload``): no name of a caller's goes as it (``metadata_out``
sends a name with ``_`` as ``_`` and hex)."""


def metadata_in(metadata: dict[str, str] | None) -> dict[str, str]:
    """Metadata as the caller wrote it (the store's own ``COMPLETED_UPLOAD`` left out)."""
    out: dict[str, str] = {}
    for name, value in (metadata or {}).items():
        if name.lower() == COMPLETED_UPLOAD:
            continue
        encoded = _ENCODED_NAME.fullmatch(name)
        try:
            shown_name = bytes.fromhex(encoded.group(1)).decode() if encoded else name
        except UnicodeDecodeError:
            shown_name = name
        out[shown_name] = value
    return out


def unreadable(e: Exception, action: str, where: str, credentials: Credentials) -> StoreError:
    """An answer the SDK could not read (it raised something of Python's own)."""
    account = redact(credentials.account_url, credentials.secrets)
    return StoreError(
        f"{account} does not behave like Azure Blob Storage: its answer when "
        f"asked to {action} {where} could not be read ({type(e).__name__}); check the account "
        "URL or the connection string"
    )


def conditions(mode: PutMode) -> dict[str, Any]:
    """A write's condition as the SDK takes it."""
    if mode.kind == "create":
        return {"match_condition": MatchConditions.IfMissing}
    if mode.kind == "update":
        return {"etag": quoted(mode.etag or ""), "match_condition": MatchConditions.IfNotModified}
    return {}


def quoted(etag: str) -> str:
    """An ETag as Azure compares it: quoted, its hex in capitals (``0x8DC...``); the seam
    may be given a bare one, which ``checksum.bare_etag`` writes in small letters."""
    if etag.startswith('"'):
        return etag
    if etag[:2].lower() == "0x":
        return f'"0x{etag[2:].upper()}"'
    return f'"{etag}"'


def read_all(body: bytes | BinaryIO) -> bytes:
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    return bytes(body.read())


def md5_of_part(body: PartBody) -> tuple[bytes, int]:
    """The MD5 and the length of a part; a stream is read through and rewound."""
    if isinstance(body, bytes):
        return hashlib.md5(body, usedforsecurity=False).digest(), len(body)
    digest = hashlib.md5(usedforsecurity=False)
    body.seek(0)
    left = body.length
    while left > 0 and (chunk := body.read(min(left, 1024 * 1024))):
        digest.update(chunk)
        left -= len(chunk)
    body.seek(0)
    return digest.digest(), body.length


def stream(blob: Any, start: int | None, length: int | None, hook: Any) -> tuple[Any, str]:
    """One GET of ``blob`` (a ``BlobClient``), bytes ``start`` on for ``length`` (None:
    all of it): the body as it arrives (chunks, never read ahead) and the Content-Range.

    The SDK's ``download_blob`` reads its first chunk before it returns and asks again,
    after a second's sleep, for a chunk whose body broke off; a stream of the seam says a
    broken read (``ReadBrokeOff``), so this is the SDK's own Get Blob operation, the one
    ``download_blob`` calls, with the client's pipeline (its credentials, retry policy and
    hooks). The bytes are kept as stored (no decoding of a Content-Encoding)."""
    byte_range = None
    if start is not None:
        byte_range = f"bytes={start}-" + (f"{start + length - 1}" if length else "")

    def keep(_: Any, body: Any, headers: dict[str, Any]) -> tuple[Any, str]:
        return body, str(headers.get("Content-Range") or "")

    kept: tuple[Any, str] = blob._client.blob.download(
        range=byte_range, cls=keep, decompress=False, raw_response_hook=hook
    )
    return kept


class AzureStream:
    """A response body as our ``ByteStream``: a read that breaks off is ``ReadBrokeOff``."""

    def __init__(self, chunks: Any, where: str, secrets: tuple[str, ...] = ()) -> None:
        self._chunks: Any = chunks
        self._buffer = bytearray()
        self._where = where
        self._secrets = secrets

    def read(self, size: int = -1) -> bytes:
        try:
            while self._chunks is not None and (size < 0 or len(self._buffer) < size):
                chunk = next(self._chunks, b"")
                if not chunk:
                    self._chunks = None
                self._buffer += chunk
        except (AzureError, OSError) as e:
            self.close()
            raise ReadBrokeOff(
                f"reading {self._where} broke off ({shown(e, self._secrets)})"
            ) from None
        cut = len(self._buffer) if size < 0 else min(size, len(self._buffer))
        data = bytes(self._buffer[:cut])
        del self._buffer[:cut]
        return data

    def close(self) -> None:
        chunks, self._chunks = self._chunks, None
        response = getattr(getattr(chunks, "response", None), "internal_response", None)
        if response is not None:
            with contextlib.suppress(Exception):  # the connection is gone either way
                response.close()
