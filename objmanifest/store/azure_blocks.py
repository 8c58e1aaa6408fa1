"""The seam's multipart uploads on Azure Blob Storage, which has staged blocks and a
block-list commit but no upload ids and no abort (``azure_uploads`` names the pieces).

* ``create_upload``: an id of ours, and an empty marker blob ``UPLOADS/KEY~ID`` that says
  the upload is open (markers are what ``list_uploads`` lists);
* ``upload_part``: ``stage_block`` with block id ``ID + part number + MD5 of the part``,
  its ``Content-MD5`` checked by Azure; the part's ETag is that MD5. A marker that is gone
  is ``UploadGone``;
* ``list_parts``: the blob's uncommitted blocks (``get_block_list``) whose id names the
  upload: its parts, their MD5s and sizes, on any machine (so an upload is adopted as on S3);
* ``complete_upload``: ``commit_block_list`` of exactly the named blocks, in order, under
  the mode's condition (create-only: ``If-None-Match: *``); a named block the blob does not
  hold is ``PartsRejected``, and the marker is removed once the commit landed. The blob
  records the upload's id in its metadata (``Head.completed_upload``), so whether an
  object is an upload's completion is told on any machine;
* ``abort_upload``: the marker is removed, so the upload is gone for every call. Its
  blocks cannot be deleted without a blob: Azure discards them at the blob's next commit or
  after seven days;
* Azure keeps one list of uncommitted blocks per blob: the commit of one upload of a key
  discards the blocks of every other upload of that key (their completion then names blocks
  that are gone: ``PartsRejected``), and an abort racing a completion may lose (the commit
  lands; a fenced holder's data object is left to ``gc``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, cast

from azure.core.exceptions import AzureError
from azure.storage.blob import BlobBlock, BlobClient, BlockState, ContainerClient

from ..core.runtime import Runtime
from ..errors import StoreError
from .azure_answers import COMPLETED_UPLOAD, conditions, md5_of_part
from .azure_uploads import (
    MAX_PART_NUMBER,
    UPLOADS,
    block_id,
    is_upload_id,
    marker,
    named_blocks,
    new_upload_id,
    parse_marker,
    parts_of,
)
from .base import CREATE, PartBody, PartsListed, PutMode, send_whole
from .errors import NoSuchObject, OutcomeUnknown, PartsRejected, UploadGone

log = logging.getLogger(__name__)


class BlobStore(Protocol):
    """What the multipart calls use of their ``AzureStore``: its blobs, its requests run
    and mapped, its namespace and its runtime."""

    runtime: Runtime
    list_page_size: int | None
    _client: ContainerClient

    def describe(self, key: str) -> str: ...
    def full_key(self, key: str) -> str: ...
    def _blob(self, key: str) -> BlobClient: ...
    def _call(
        self,
        action: str,
        key: str,
        call: Callable[[], Any],
        *,
        conditional: bool = ...,
        upload: bool = ...,
        write: bool = ...,
        resent: Callable[[int, str, str], bool] | None = ...,
        missing_ok: bool = ...,
    ) -> Any: ...
    def _observe(self, response: Any) -> None: ...
    def _cut_short(self, status: int, code: str, key: str) -> bool: ...
    def _refuse_reserved(self, key: str, action: str) -> None: ...


class BlockUploads:
    """The multipart calls of one ``AzureStore``."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def create(self, key: str) -> str:
        self.store._refuse_reserved(key, "upload")
        upload_id = new_upload_id(self.store.runtime.new_id())
        blob = self.store._blob(marker(key, upload_id))
        self.store._call(
            "start a multipart upload of",
            key,
            lambda: blob.upload_blob(b"", overwrite=True, raw_response_hook=self.store._observe),
        )
        return upload_id

    def _check_open(self, key: str, upload_id: str, action: str) -> None:
        """``UploadGone`` unless ``upload_id`` of ``key`` is open (its marker is there)."""
        if not is_upload_id(upload_id):
            raise UploadGone(f"{self.store.describe(key)}: no upload {upload_id!r} of this store")
        blob = self.store._blob(marker(key, upload_id))
        try:
            self.store._call(
                action,
                key,
                lambda: blob.get_blob_properties(raw_response_hook=self.store._observe),
                missing_ok=True,
            )
        except NoSuchObject:
            raise UploadGone(f"{self.store.describe(key)}: the upload no longer exists") from None

    def upload_part(self, key: str, upload_id: str, number: int, body: PartBody) -> str:
        """Stage part ``number`` as a block named by the upload, the number and the part's
        MD5, which Azure checks (a damaged part is refused and sent again); its bare ETag
        is that MD5."""
        action = f"upload part {number} of"
        if not isinstance(number, int) or not 1 <= number <= MAX_PART_NUMBER:
            raise StoreError(
                f"could not upload part {number} of {self.store.describe(key)}: part numbers are "
                f"1 to {MAX_PART_NUMBER}"
            )
        self._check_open(key, upload_id, action)
        md5, length = md5_of_part(body)
        block = block_id(upload_id, number, md5.hex())
        blob = self.store._blob(key)

        def send() -> Any:
            if not isinstance(body, bytes):
                body.seek(0)
            return self.store._call(
                action,
                key,
                lambda: blob.stage_block(
                    block,
                    cast(Any, body),
                    length=length,
                    transactional_content_md5=md5,
                    raw_response_hook=self.store._observe,
                ),
                resent=self.store._cut_short,
            )

        send_whole(send, self.store.runtime, f"part {number} of {self.store.describe(key)}")
        return md5.hex()

    def list_parts(self, key: str, upload_id: str) -> PartsListed:
        self._check_open(key, upload_id, "list the parts of")
        blob = self.store._blob(key)
        try:
            _, uncommitted = self.store._call(
                "list the parts of",
                key,
                lambda: blob.get_block_list("uncommitted", raw_response_hook=self.store._observe),
                missing_ok=True,
            )
        except NoSuchObject:
            return {}
        return parts_of(upload_id, ((str(b.id), int(b.size)) for b in uncommitted))

    def complete(
        self, key: str, upload_id: str, etags: Sequence[str], mode: PutMode = CREATE
    ) -> None:
        """Commit exactly the named blocks, in order, under ``mode``'s condition; then the
        upload's marker goes. A lost answer is checked once: if the blob holds our blocks,
        the marker goes too (the caller still hears ``OutcomeUnknown``)."""
        action = "complete the multipart upload of"
        self._check_open(key, upload_id, action)
        if not etags:
            raise StoreError(f"could not complete {self.store.describe(key)}: no parts named")
        ids = named_blocks(upload_id, etags)
        if ids is None:
            raise PartsRejected(f"{self.store.describe(key)}: a part's ETag is not an MD5")
        blocks = [BlobBlock(block_id=i, state=BlockState.UNCOMMITTED) for i in ids]
        options: dict[str, Any] = {
            "metadata": {COMPLETED_UPLOAD: upload_id},
            "validate_content": True,
            "raw_response_hook": self.store._observe,
        }
        options.update(conditions(mode))
        blob = self.store._blob(key)
        try:
            send_whole(
                lambda: self.store._call(
                    action,
                    key,
                    lambda: blob.commit_block_list(blocks, **options),
                    conditional=mode.kind != "overwrite",
                    upload=True,
                    write=True,
                    resent=self.store._cut_short,
                ),
                self.store.runtime,
                f"the completion of {self.store.describe(key)}",
            )
        except OutcomeUnknown:
            if self._holds(key, ids):
                self._forget(key, upload_id)
            raise
        self._forget(key, upload_id)

    def _holds(self, key: str, ids: Sequence[str]) -> bool:
        """Whether the blob is exactly these committed blocks (False if it cannot tell)."""
        blob = self.store._blob(key)
        try:
            committed, _ = blob.get_block_list("committed", raw_response_hook=self.store._observe)
        except AzureError:
            return False
        return [str(block.id) for block in committed] == list(ids)

    def _forget(self, key: str, upload_id: str) -> None:
        """Remove a completed upload's marker; one left behind is listed until aborted."""
        try:
            self.abort(key, upload_id)
        except (StoreError, NoSuchObject) as e:
            log.warning("could not remove the marker of the completed upload of %s: %s", key, e)

    def abort(self, key: str, upload_id: str) -> bool:
        """Forget the upload (its marker goes); False if it was already gone. Its staged
        blocks stay until the blob's next commit or seven days have passed."""
        if not is_upload_id(upload_id):
            return False
        blob = self.store._blob(marker(key, upload_id))
        try:
            self.store._call(
                "abort the multipart upload of",
                key,
                lambda: blob.delete_blob(raw_response_hook=self.store._observe),
                missing_ok=True,
            )
        except NoSuchObject:
            return False
        return True

    def list(self, prefix: str) -> Iterator[tuple[str, str]]:
        """(key, upload id) of every open upload under ``prefix``: its markers."""
        base = len(self.store.full_key(""))
        options: dict[str, Any] = {
            "name_starts_with": self.store.full_key(UPLOADS + prefix),
            "results_per_page": self.store.list_page_size,
            "raw_response_hook": self.store._observe,
        }
        names = self.store._call(
            "list the multipart uploads under",
            prefix,
            lambda: [item.name for item in self.store._client.list_blobs(**options)],
        )
        for name in sorted(names):
            parsed = parse_marker(name[base:])
            if parsed is not None:
                yield parsed
