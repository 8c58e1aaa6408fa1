"""The GCS roles ``objmanifest iam-policy --url gs://...`` prints: least privilege, the
condition that confines them to the prefix, and what GCS cannot confine."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

import objmanifest as om
from objmanifest.errors import InvalidInput
from objmanifest.store import PutMode, access_needed, gcs_permissions
from tests.support.gcs_double import GCSDouble
from tests.support.internals import engine

BUCKET = "objmanifest-roles"
MiB = 1024 * 1024


def test_the_agent_role_is_object_permissions_only() -> None:
    doc = gcs_permissions.policy("bkt", "jobs/nightly", "agent")
    assert doc["role"]["includedPermissions"] == [
        "storage.objects.create",
        "storage.objects.delete",
        "storage.objects.get",
        "storage.objects.list",
    ]
    assert set(doc["permissions"]) == set(doc["role"]["includedPermissions"])
    assert all(why for why in doc["permissions"].values())
    admin = gcs_permissions.policy("bkt", "jobs/nightly", "admin")
    extra = set(admin["role"]["includedPermissions"]) - set(doc["role"]["includedPermissions"])
    assert extra == {"storage.buckets.get"}


def test_the_binding_is_confined_to_the_prefix() -> None:
    binding = gcs_permissions.policy("bkt", "/jobs/nightly/", "agent")["bucket_binding"]
    assert binding["condition"]["expression"] == (
        'resource.name.startsWith("projects/_/buckets/bkt/objects/jobs/nightly/") || '
        '(resource.type == "storage.googleapis.com/Bucket" && '
        'resource.name == "projects/_/buckets/bkt")'
    )
    assert "condition" not in gcs_permissions.policy("bkt", "", "agent")["bucket_binding"]


def test_a_prefix_with_quotes_stays_one_cel_string() -> None:
    expression = gcs_permissions.condition("bkt", 'a"b\\c')["expression"]  # type: ignore[index]
    assert 'startsWith("projects/_/buckets/bkt/objects/a\\"b\\\\c/")' in expression


def test_what_gcs_cannot_confine_is_said() -> None:
    said = " ".join(gcs_permissions.policy("bkt", "p", "agent")["cannot_confine"])
    assert "storage.objects.list" in said and "bucket of its own" in said
    assert "delete" in said


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(InvalidInput, match="unknown role"):
        gcs_permissions.policy("bkt", "p", "root")  # type: ignore[arg-type]


def test_the_roles_name_exactly_the_permissions_the_store_asks_for() -> None:
    """Every agent command, then every admin command, against the GCS double, which records
    the permission GCS checks for each request: the agent's work needs exactly the agent
    role's permissions, the admin's nothing beyond the admin role's."""
    double = GCSDouble()
    try:
        double.create_bucket(BUCKET)
        store = om.connect(f"gs://{BUCKET}/jobs", endpoint_url=double.endpoint_url)
        double.permissions.clear()
        config = om.TransferConfig(threshold=5 * MiB, part_size=5 * MiB)
        task = om.Task.create(
            store, "job", stages=["a", "b"], lease_seconds=60, max_retries=1, transfer=config
        )
        task.declare_many([("small", "a"), ("big", "a"), ("doomed", "a"), ("later", "b")])
        agent = task.agent("worker")
        for file_id, data in (("small", b"x" * 100), ("big", os.urandom(11 * MiB))):
            claim = agent.claim(file_id)
            assert claim is not None
            agent.renew(claim)
            agent.put(claim, data)
            assert agent.consume(file_id) == data
        doomed = agent.claim("doomed")
        assert doomed is not None
        agent.release(doomed)
        doomed = agent.claim("doomed")
        assert doomed is not None
        agent.fail(doomed, "no input")
        task.status()
        list(task.log())
        om.Task.list(store)
        used = set(double.permissions)
        assert used == set(gcs_permissions.AGENT_PERMISSIONS), used

        double.permissions.clear()
        task.gc()
        task.sweep_uploads()
        store.delete(engine(task).shard_key("b", "later"))  # repair asks for its versions
        assert [o.source for o in task.repair().objects] == ["journal"]
        task.archive(older_than=0)
        task.trim_journal(keep_versions=1)
        task.delete(force=True)
        used = set(double.permissions)
        assert used <= set(gcs_permissions.ADMIN_PERMISSIONS), used
    finally:
        double.stop()


def test_each_call_needs_exactly_the_permissions_doctor_names() -> None:
    """Each call of the store, alone against the double (a write replacing an object, a
    part sent again, an update completed over an object, the versions repair reads): what
    GCS checks is exactly what ``STORE_PERMISSIONS`` says, which ``doctor`` names for a
    refused call."""
    double = GCSDouble()
    try:
        double.create_bucket(BUCKET)
        store = om.connect(f"gs://{BUCKET}/calls", endpoint_url=double.endpoint_url)
        etag = store.put("k", b"first")
        store.put("big", b"an object the completion replaces")
        upload_id = store.create_upload("big")
        store.upload_part("big", upload_id, 1, b"part")
        seen: dict[str, set[str]] = {}

        def calls() -> Iterator[tuple[str, Callable[[], object]]]:
            yield "get", lambda: store.get("k")
            yield "head", lambda: store.head("k")
            yield "open", lambda: store.open("k").read()
            yield "list", lambda: list(store.list(""))
            yield "put", lambda: store.put("k", b"second")
            yield "delete", lambda: store.delete("gone")
            yield "upload_part", lambda: store.upload_part("big", upload_id, 1, b"again")
            yield "list_parts", lambda: store.list_parts("big", upload_id)
            yield "list_uploads", lambda: list(store.list_uploads(""))
            parts = [next(iter(store.list_parts("big", upload_id)[1]))]
            head = store.head("big")
            yield (
                "complete_upload",
                lambda: store.complete_upload("big", upload_id, parts, PutMode.update(head.etag)),
            )
            other = store.create_upload("other")
            store.upload_part("other", other, 1, b"x")
            yield "abort_upload", lambda: store.abort_upload("other", other)
            yield "create_upload", lambda: store.create_upload("third")
            yield "versions", lambda: store.versions("k")
            kept = store.head("k").etag
            yield "get_version", lambda: store.get_version("k", kept)

        for op, call in calls():
            double.permissions.clear()
            call()
            seen[op] = set(double.permissions)
        assert etag
        for op, used in seen.items():
            assert used == gcs_permissions.STORE_PERMISSIONS[op], op
        said = access_needed("put", f"gs://{BUCKET}/calls/k")
        assert said == gcs_permissions.needed("put", f"gs://{BUCKET}/calls/k")
        assert "storage.objects.create and storage.objects.delete on gs://" in said
        assert "iam-policy --url gs://" in said
    finally:
        double.stop()
