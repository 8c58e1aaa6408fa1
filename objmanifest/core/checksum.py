"""Checksums: xxh3-128 of the bytes, composite digests of chunked data, S3 multipart ETags,
and the MD5 digests a write carries so the store can refuse a body damaged on its way.

A checksum is written as ``xxh3-128:<32 hex digits>`` so a reader knows the algorithm. A
chunked entry's checksum is a composite of its part digests (``composite``), so a consumer
can verify each part on its own, in parallel, as it arrives; its ``whole_checksum`` is the
plain xxh3-128 of all its bytes in order, what ``xxhsum -H2`` prints for the file.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable

import xxhash

ALGORITHM = "xxh3-128"
PREFIX = ALGORITHM + ":"
COMPOSITE = PREFIX + "composite-"
_MD5 = re.compile(r"[0-9a-f]{32}")


class Digest:
    """A running xxh3-128 digest plus the byte count, fed chunk by chunk."""

    __slots__ = ("_h", "size")

    def __init__(self) -> None:
        self._h = xxhash.xxh3_128()
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._h.update(data)
        self.size += len(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def checksum(self) -> str:
        return PREFIX + self._h.hexdigest()


def of_bytes(data: bytes | bytearray | memoryview) -> str:
    """The checksum string of a whole buffer."""
    return PREFIX + xxhash.xxh3_128_hexdigest(data)


def content_md5(data: bytes | bytearray | memoryview) -> str:
    """The ``Content-MD5`` header of a body: its MD5, base64-encoded (RFC 1864)."""
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode("ascii")


def is_md5(etag: str) -> bool:
    """Whether a bare ETag has the shape of an MD5 (a single object's or a part's, on S3
    without SSE-KMS or SSE-C)."""
    return bool(_MD5.fullmatch(bare_etag(etag)))


def part_hex(data: bytes | bytearray | memoryview) -> str:
    """The bare xxh3-128 hex digest of one part, as recorded per part of a chunked upload."""
    return xxhash.xxh3_128_hexdigest(data)


def composite(part_hexdigests: Iterable[str], part_size: int) -> str:
    """The digest of chunked data: xxh3-128 over the part digests and the part size.

    It depends on the part size, so two uploads of the same bytes with different part sizes
    have different composites; the part size is recorded beside it.
    """
    h = xxhash.xxh3_128()
    h.update(f"{part_size}:".encode())
    count = 0
    for hexdigest in part_hexdigests:
        h.update(bytes.fromhex(hexdigest))
        count += 1
    return f"{COMPOSITE}{count}-{h.hexdigest()}"


def is_composite(checksum: str | None) -> bool:
    """Whether a recorded checksum is the composite of a chunked entry."""
    return bool(checksum) and str(checksum).startswith(COMPOSITE)


def bare_etag(etag: str) -> str:
    """An ETag without its quotes (and without a weak ``W/`` marker), lower-cased."""
    etag = etag.strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    return etag.strip('"').lower()


def multipart_etag(part_etags: Iterable[str]) -> str | None:
    """The ETag S3 gives an object completed from parts with these ETags, unquoted.

    MD5 over the binary MD5s of the parts, then ``-N``. Comparing it with the completed
    object's ETag shows the object was built from exactly these parts, even on stores that
    answer 200 to a completion that did nothing. None when a part ETag is not an MD5 (as
    with SSE-KMS on AWS), so nothing can be implied.
    """
    h = hashlib.md5(usedforsecurity=False)
    count = 0
    for etag in part_etags:
        bare = bare_etag(etag)
        if not _MD5.fullmatch(bare):
            return None
        h.update(bytes.fromhex(bare))
        count += 1
    return f"{h.hexdigest()}-{count}"
