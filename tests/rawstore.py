"""Raw access to what a task leaves in its store, beside the library.

Tests that must see (or tamper with) the objects themselves, not the manifest's view of
them, go through these few functions, so there is one place to redirect when the storage
layer changes. Keys are relative to the store's prefix, as the library's keys are.
"""

from __future__ import annotations

from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

import objmanifest as om


def put(store: om.Store, key: str, body: bytes) -> None:
    """Write an object unconditionally, as a stray writer would."""
    store.client.put_object(Bucket=store.bucket, Key=store.full_key(key), Body=body)


def get(store: om.Store, key: str) -> bytes:
    return store.client.get_object(Bucket=store.bucket, Key=store.full_key(key))["Body"].read()


def keys(store: om.Store, prefix: str) -> list[str]:
    """Every object key under ``prefix``, sorted."""
    found: list[str] = []
    base = len(store.full_key(""))
    pages = store.client.get_paginator("list_objects_v2").paginate(
        Bucket=store.bucket, Prefix=store.full_key(prefix)
    )
    for page in pages:
        found += [item["Key"][base:] for item in page.get("Contents", [])]
    return sorted(found)


def multipart_uploads(store: om.Store, prefix: str) -> list[tuple[str, str]]:
    """(key, upload id) of every multipart upload under ``prefix`` that is neither completed
    nor aborted."""
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


def abort_uploads(store: om.Store, prefix: str) -> None:
    """Abort every open multipart upload under ``prefix`` (cleaning up after a test)."""
    for key, upload_id in multipart_uploads(store, prefix):
        store.client.abort_multipart_upload(
            Bucket=store.bucket, Key=store.full_key(key), UploadId=upload_id
        )


def date(store: om.Store) -> datetime:
    """The ``Date`` of a fresh answer from the store: its clock, in whole seconds (the true
    time is at most a second later)."""
    response = store.client.list_objects_v2(Bucket=store.bucket, MaxKeys=1)
    return parsedate_to_datetime(response["ResponseMetadata"]["HTTPHeaders"]["date"])
