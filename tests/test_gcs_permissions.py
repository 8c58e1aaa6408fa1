"""The GCS roles ``objmanifest iam-policy --url gs://...`` prints: least privilege, the
condition that confines them to the prefix, and what GCS cannot confine."""

from __future__ import annotations

import os

import pytest

import objmanifest as om
from objmanifest.errors import InvalidInput
from objmanifest.store import gcs_permissions
from tests.support.gcs_double import GCSDouble

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
        task.repair()
        task.archive(older_than=0)
        task.trim_journal(keep_versions=1)
        task.delete(force=True)
        used = set(double.permissions)
        assert used <= set(gcs_permissions.ADMIN_PERMISSIONS), used
    finally:
        double.stop()
