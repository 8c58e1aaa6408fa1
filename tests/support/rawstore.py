"""Raw access to what a task leaves in its store, beside the library.

Tests that must see (or tamper with) the objects themselves, not the manifest's view of
them, go through these few functions. On an S3 store they use the boto3 client directly,
so nothing of objmanifest stands between the test and the bucket; on a ``MemoryStore``
they use the store's own calls, unconditionally. Keys are relative to the store's prefix,
as the library's keys are.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

import objmanifest as om
from objmanifest.store.gcs import GCSStore

S3_NAMES = {
    "get": "GetObject",
    "open": "GetObject",
    "head": "HeadObject",
    "put": "PutObject",
    "delete": "DeleteObject",
    "list": "ListObjectsV2",
    "create_upload": "CreateMultipartUpload",
    "upload_part": "UploadPart",
    "list_parts": "ListParts",
    "complete_upload": "CompleteMultipartUpload",
    "abort_upload": "AbortMultipartUpload",
    "list_uploads": "ListMultipartUploads",
    "versions": "ListObjectVersions",
    "get_version": "GetObject",
}
"""A MemoryStore call -> the S3 operation it stands for, so request counts compare alike."""


def is_s3(store: Any) -> bool:
    return isinstance(store, om.S3Store)


def put(store: Any, key: str, body: bytes) -> None:
    """Write an object unconditionally, as a stray writer would."""
    if is_s3(store):
        store.client.put_object(Bucket=store.bucket, Key=store.full_key(key), Body=body)
    else:
        store.put(key, body)


def get(store: Any, key: str) -> bytes:
    """The bytes of ``key`` as the store has them."""
    if is_s3(store):
        body: bytes = store.client.get_object(Bucket=store.bucket, Key=store.full_key(key))[
            "Body"
        ].read()
        return body
    blob = store.get(key)
    assert blob is not None
    return bytes(blob.body)


def delete(store: Any, key: str) -> None:
    if is_s3(store):
        store.client.delete_object(Bucket=store.bucket, Key=store.full_key(key))
    else:
        store.delete(key)


def keys(store: Any, prefix: str) -> list[str]:
    """Every object key under ``prefix``, sorted."""
    if not is_s3(store):
        return sorted(row.key for row in store.list(prefix))
    found: list[str] = []
    base = len(store.full_key(""))
    pages = store.client.get_paginator("list_objects_v2").paginate(
        Bucket=store.bucket, Prefix=store.full_key(prefix)
    )
    for page in pages:
        found += [item["Key"][base:] for item in page.get("Contents", [])]
    return sorted(found)


def gcs_of(store: Any) -> GCSStore | None:
    """The ``GCSStore`` ``store`` is (or wraps, as the test fixtures do), else None."""
    inner = getattr(store, "inner", store)
    return inner if isinstance(inner, GCSStore) else None


def _generations(store: GCSStore, key: str) -> list[Any]:
    """The SDK's rows of every generation GCS keeps of ``key``, newest first."""
    full = store.full_key(key)
    rows = store.gcs.client.list_blobs(store.bucket, prefix=full, versions="true")
    return sorted((r for r in rows if r.name == full), key=lambda r: -int(r.generation))


def kept(store: Any, key: str) -> list[tuple[str, bytes]]:
    """(version id, bytes) of every version the store keeps of ``key`` that is not a delete
    marker, newest first: on S3 and GCS as the bucket lists and serves them (through its
    SDK), on a ``MemoryStore`` as its backend holds them."""
    gcs = gcs_of(store)
    if gcs is not None:
        bucket = gcs.gcs.client.bucket(gcs.bucket)
        return [
            (str(r.generation), bucket.blob(r.name, generation=r.generation).download_as_bytes())
            for r in _generations(gcs, key)
        ]
    if not is_s3(store):
        listed = store.backend.versions(key) or ()
        return [
            (v.version_id, store.backend.get_version(key, v.version_id).body)
            for v in listed
            if not v.deleted
        ]
    full = store.full_key(key)
    found: list[tuple[str, bytes]] = []
    pages = store.client.get_paginator("list_object_versions").paginate(
        Bucket=store.bucket, Prefix=full
    )
    for page in pages:
        for v in page.get("Versions", []):
            if v["Key"] == full:
                body = store.client.get_object(
                    Bucket=store.bucket, Key=full, VersionId=v["VersionId"]
                )
                found.append((v["VersionId"], body["Body"].read()))
    return found


def delete_markers(store: Any, key: str) -> int:
    """How many delete markers the store keeps of ``key`` (GCS has none: a deleted object
    is one whose generations are all noncurrent)."""
    if gcs_of(store) is not None:
        return 0
    if not is_s3(store):
        return sum(1 for v in store.backend.versions(key) or () if v.deleted)
    full = store.full_key(key)
    page = store.client.list_object_versions(Bucket=store.bucket, Prefix=full)
    return sum(1 for m in page.get("DeleteMarkers", []) if m["Key"] == full)


def delete_version(store: Any, key: str, version_id: str) -> None:
    """Remove one kept version for good, as a lifecycle rule's expiry does (on GCS, a
    delete of that generation: fake-gcs-server cannot, see ``LACKS``)."""
    gcs = gcs_of(store)
    if gcs is not None:
        full = gcs.full_key(key)
        gcs.gcs.client.bucket(gcs.bucket).blob(full, generation=int(version_id)).delete()
    elif is_s3(store):
        store.client.delete_object(
            Bucket=store.bucket, Key=store.full_key(key), VersionId=version_id
        )
    else:
        store.backend.delete_version(key, version_id)


def multipart_uploads(store: Any, prefix: str) -> list[tuple[str, str]]:
    """(key, upload id) of every multipart upload under ``prefix`` that is neither completed
    nor aborted."""
    if not is_s3(store):
        return sorted(store.list_uploads(prefix))
    found: list[tuple[str, str]] = []
    base = len(store.full_key(""))
    kwargs: dict[str, Any] = {"Bucket": store.bucket, "Prefix": store.full_key(prefix)}
    while True:
        page = store.client.list_multipart_uploads(**kwargs)
        found += [(u["Key"][base:], u["UploadId"]) for u in page.get("Uploads", [])]
        if not page.get("IsTruncated"):
            return sorted(found)
        kwargs["KeyMarker"] = page.get("NextKeyMarker", "")
        kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker", "")


def abort_uploads(store: Any, prefix: str) -> None:
    """Abort every open multipart upload under ``prefix`` (cleaning up after a test)."""
    for key, upload_id in multipart_uploads(store, prefix):
        if is_s3(store):
            store.client.abort_multipart_upload(
                Bucket=store.bucket, Key=store.full_key(key), UploadId=upload_id
            )
        else:
            store.abort_upload(key, upload_id)


@contextlib.contextmanager
def _calls_counted(store: Any, seen: Counter[str]) -> Iterator[None]:
    """Count each call of the seam on ``store`` (an Azure, GCS or directory store) while the
    block runs, by wrapping the instance's methods."""

    def counted(op: str, call: Any) -> Any:
        def count(*args: Any, **kwargs: Any) -> Any:
            seen[S3_NAMES[op]] += 1
            return call(*args, **kwargs)

        return count

    wrapped = [op for op in S3_NAMES if hasattr(store, op)]  # versions are optional
    for op in wrapped:
        setattr(store, op, counted(op, getattr(store, op)))
    try:
        yield
    finally:
        for op in wrapped:
            delattr(store, op)


def date(store: Any) -> datetime:
    """The store's clock as a fresh answer gives it: the ``Date`` of an S3 response (whole
    seconds; the true time is at most a second later), or a MemoryStore's clock."""
    if not is_s3(store):
        now: datetime = store.now()
        return now
    response = store.client.list_objects_v2(Bucket=store.bucket, MaxKeys=1)
    return parsedate_to_datetime(response["ResponseMetadata"]["HTTPHeaders"]["date"])


@contextlib.contextmanager
def requests(store: Any) -> Iterator[Counter[str]]:
    """Count the S3 operations the store sends while the block runs (the calls of a store
    of another kind are counted under the names of the S3 operations they stand for)."""
    seen: Counter[str] = Counter()
    if not is_s3(store) and not hasattr(store, "faults"):
        with _calls_counted(store, seen):
            yield seen
        return
    if not is_s3(store):

        def hook(op: str, key: str) -> None:
            seen[S3_NAMES[op]] += 1

        store.faults.hooks.append(hook)
        try:
            yield seen
        finally:
            store.faults.hooks.remove(hook)
        return

    def count(model: Any, **_: Any) -> None:
        seen[model.name] += 1

    events = store.client.meta.events
    events.register("before-call.s3", count)
    try:
        yield seen
    finally:
        events.unregister("before-call.s3", count)
