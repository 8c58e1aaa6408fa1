"""Moving an entry's bytes: written once at a key that names the epoch, verified on read.

A holder's data goes to ``TASK/data/STAGE/FILE_ID@EPOCH`` with ``If-None-Match: *``. A fenced
holder therefore writes beside the winner, never over it, and since the manifest only
ever points at the key of the epoch that made the entry ready, its bytes never become
visible. Reads hash while they stream and hand nothing over that does not match.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from . import checksum
from .errors import AlreadyExists, ChecksumMismatch
from .store import OutcomeUnknown, PreconditionFailed, Store

Source = bytes | bytearray | memoryview | str | os.PathLike[str] | BinaryIO
READ_CHUNK = 1024 * 1024
META_DIGEST = "xxh3-128"


@dataclass(frozen=True)
class Stored:
    """Where a holder's bytes landed and what they were."""

    key: str
    checksum: str
    size: int


def data_key(task_id: str, stage: str, file_id: str, epoch: int) -> str:
    """Where a holder writes: one key per epoch, so holders never share one."""
    return f"{task_id}/data/{stage}/{file_id}@{epoch}"


def read_source(data: Source) -> bytes:
    """The bytes of a single-object source: a buffer, a path, or a binary file."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, (str, os.PathLike)):
        return Path(data).read_bytes()
    if isinstance(data, io.TextIOBase):
        raise TypeError("put() needs bytes, a path, or a file opened in binary mode ('rb')")
    return data.read()


def upload(store: Store, key: str, body: bytes) -> Stored:
    """Write ``body`` once at ``key``. Repeating the same bytes is a no-op; other bytes for
    the same epoch go beside them under a key with their digest, never over them."""
    digest = checksum.of_bytes(body)
    hexdigest = digest.removeprefix(checksum.PREFIX)
    for candidate in (key, f"{key}~{hexdigest[:16]}"):
        if _write_once(store, candidate, body, hexdigest):
            return Stored(candidate, digest, len(body))
    raise AlreadyExists(
        f"{store.describe(key)} and its alternative already hold other bytes; "
        "fail() this claim and claim the entry again"
    )


def _write_once(store: Store, key: str, body: bytes, hexdigest: str) -> bool:
    """True once ``key`` holds exactly ``body``; False if it holds something else."""
    meta = {META_DIGEST: hexdigest, "size": str(len(body))}
    for _ in range(3):
        try:
            store.put(key, body, if_none_match=True, metadata=meta)
            return True
        except (PreconditionFailed, OutcomeUnknown):
            pass
        with contextlib.suppress(Exception):
            head = store.head(key)
            return head.metadata.get(META_DIGEST) == hexdigest and head.size == len(body)
    return False


def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    while chunk := stream.read(READ_CHUNK):
        yield chunk


def _check(store: Store, file_id: str, key: str, digest: checksum.Digest,
           expected: str, size: int) -> None:
    if digest.checksum() != expected or digest.size != size:
        raise ChecksumMismatch(
            f"{file_id!r}: {store.describe(key)} holds {digest.size} bytes with "
            f"{digest.checksum()}, but the manifest recorded {size} bytes with {expected}"
        )


def download(store: Store, file_id: str, key: str, expected: str, size: int) -> bytes:
    """The verified bytes of one data object."""
    digest = checksum.Digest()
    buf = bytearray()
    with contextlib.closing(store.open(key)) as stream:
        for chunk in _chunks(stream):
            digest.update(chunk)
            buf += chunk
    _check(store, file_id, key, digest, expected, size)
    return bytes(buf)


def download_to(
    store: Store, file_id: str, key: str, expected: str, size: int, dest: str | os.PathLike[str]
) -> Path:
    """Stream to a temporary file beside ``dest`` and move it into place only once verified:
    on a mismatch nothing is left at ``dest``."""
    target = Path(dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        digest = checksum.Digest()
        with os.fdopen(fd, "wb") as out, contextlib.closing(store.open(key)) as stream:
            for chunk in _chunks(stream):
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        _check(store, file_id, key, digest, expected, size)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target
