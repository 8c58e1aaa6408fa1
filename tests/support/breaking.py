"""Sources that break part-way: a producer whose disk fails, whose input command dies, in
the middle of a put. Shared by every test that needs one."""

from __future__ import annotations

import io
from typing import Any


class BreakingStream(io.RawIOBase):
    """A pipe-like stream (not seekable, size unknown) whose producer dies at ``fail_at``:
    reads deliver the bytes before it, then raise ``OSError(message)``."""

    def __init__(self, data: bytes, fail_at: int, message: str = "the source broke") -> None:
        self.inner, self.fail_at, self.message = io.BytesIO(data), fail_at, message

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.fail_at - self.inner.tell()
        if left <= 0:
            raise OSError(self.message)
        return self.inner.readinto(memoryview(buffer)[: min(len(buffer), left)])


class BreakingFile(BreakingStream):
    """A seekable file without a descriptor (read part by part) that breaks at ``fail_at``:
    a producer that dies in the middle of a chunked put and leaves its upload open."""

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.inner.seek(offset, whence)

    def tell(self) -> int:
        return self.inner.tell()
