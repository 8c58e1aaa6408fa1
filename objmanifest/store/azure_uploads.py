"""The names of the pieces of a multipart upload on Azure (``azure_blocks`` makes the
upload of them):

* An upload id is ``ID_LENGTH`` hex digits of our own.
* Part N of upload U, whose bytes have the MD5 M, is the block ``U + NNNNN + M`` (hex M,
  ``BLOCK_ID_LENGTH`` characters, base64-encoded by the SDK): every block id of a blob has
  the same length, as Azure requires; a block is found again by its upload, its part
  number and its digest from the block list alone (Get Block List gives ids and sizes, no
  digests); and a part sent twice with other bytes is a block of its own.
* An open upload of ``key`` is the empty blob ``UPLOADS + key + "~" + U`` under the store's
  prefix: ``UPLOADS`` starts with a dot, and no manifest key does (they start with a task
  id: a letter or a digit), so no key of the manifest is ever one, and listings leave the
  namespace out.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

from ..core import checksum

UPLOADS = ".objmanifest-uploads/"
"""The namespace of upload markers, under the store's prefix."""

ID_LENGTH = 24
PART_DIGITS = 5
MAX_PART_NUMBER = 10_000
BLOCK_ID_LENGTH = ID_LENGTH + PART_DIGITS + 32

_UPLOAD_ID = re.compile(f"[0-9a-f]{{{ID_LENGTH}}}")
_BLOCK_ID = re.compile(f"([0-9a-f]{{{ID_LENGTH}}})([0-9]{{{PART_DIGITS}}})([0-9a-f]{{32}})")


def new_upload_id(fresh: str) -> str:
    """An upload id from ``fresh`` (the runtime's new id): its first ``ID_LENGTH`` hex
    digits, or a digest of it when it is not hex."""
    if _UPLOAD_ID.fullmatch(fresh[:ID_LENGTH]):
        return fresh[:ID_LENGTH]
    return hashlib.sha256(fresh.encode()).hexdigest()[:ID_LENGTH]


def is_upload_id(upload_id: object) -> bool:
    """Whether ``upload_id`` could be one of ours (anything else names no upload)."""
    return isinstance(upload_id, str) and bool(_UPLOAD_ID.fullmatch(upload_id))


def block_id(upload_id: str, number: int, md5_hex: str) -> str:
    """The block that carries part ``number`` of ``upload_id``, whose MD5 is ``md5_hex``."""
    return f"{upload_id}{number:0{PART_DIGITS}d}{md5_hex}"


def parse_block_id(block: str) -> tuple[str, int, str] | None:
    """(upload id, part number, MD5) of one of our block ids; None for another's."""
    found = _BLOCK_ID.fullmatch(block)
    if found is None:
        return None
    return found.group(1), int(found.group(2)), found.group(3)


def parts_of(upload_id: str, blocks: Iterable[tuple[str, int]]) -> dict[int, dict[str, int]]:
    """Part number -> {MD5: size} of the blocks (id, size) that carry parts of the upload."""
    listed: dict[int, dict[str, int]] = {}
    for block, size in blocks:
        parsed = parse_block_id(block)
        if parsed is not None and parsed[0] == upload_id:
            listed.setdefault(parsed[1], {})[parsed[2]] = size
    return dict(sorted(listed.items()))


def named_blocks(upload_id: str, etags: Sequence[str]) -> list[str] | None:
    """The blocks of parts 1..N with these ETags; None if one is no MD5 (names no block)."""
    bare = [checksum.bare_etag(etag).lower() for etag in etags]
    if not all(checksum.is_md5(etag) for etag in bare):
        return None
    return [block_id(upload_id, n, etag) for n, etag in enumerate(bare, start=1)]


def marker(key: str, upload_id: str) -> str:
    """The marker of the open upload ``upload_id`` of ``key`` (relative to the prefix)."""
    return f"{UPLOADS}{key}~{upload_id}"


def parse_marker(name: str) -> tuple[str, str] | None:
    """(key, upload id) of a marker name (relative to the prefix); None if it is not one."""
    if not name.startswith(UPLOADS):
        return None
    rest = name[len(UPLOADS) :]
    if len(rest) <= ID_LENGTH + 1:
        return None
    key, tilde, upload_id = rest[: -ID_LENGTH - 1], rest[-ID_LENGTH - 1], rest[-ID_LENGTH:]
    if tilde != "~" or not is_upload_id(upload_id):
        return None
    return key, upload_id


def hidden(key: str) -> bool:
    """Whether a listed key (relative to the prefix) is the store's own, never shown."""
    return key.startswith(UPLOADS) or key == UPLOADS.rstrip("/")
