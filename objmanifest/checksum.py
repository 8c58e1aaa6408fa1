"""xxh3-128 checksums: streaming digests and the composite digest of chunked data.

A checksum is written as ``xxh3-128:<32 hex digits>`` so a reader knows the algorithm.
"""

from __future__ import annotations

from collections.abc import Iterable

import xxhash

ALGORITHM = "xxh3-128"
PREFIX = ALGORITHM + ":"


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
    return f"{PREFIX}composite-{count}-{h.hexdigest()}"
