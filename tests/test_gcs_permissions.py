"""The GCS roles ``objmanifest iam-policy --url gs://...`` prints: least privilege, the
condition that confines them to the prefix, and what GCS cannot confine."""

from __future__ import annotations

import pytest

from objmanifest.errors import InvalidInput
from objmanifest.store import gcs_permissions


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
