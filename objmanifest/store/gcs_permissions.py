"""What objmanifest needs to be allowed in a GCS bucket: least-privilege custom roles, bound
with an IAM condition on the prefix (``objmanifest iam-policy --url gs://BUCKET/PREFIX``).

* ``agent``: ``storage.objects.get``, ``list``, ``create`` and ``delete``. GCS has no
  permission that replaces an object without deleting it (overwriting needs
  ``storage.objects.delete``), and every commit of a shard replaces it, so an agent can
  delete manifest objects under the prefix: S3's deny of that has no GCS equivalent.
* ``admin`` (``gc``, ``repair``, ``delete``, ``archive``, ``trim``, sweeping uploads): the
  same, and ``storage.buckets.get`` (to tell a missing bucket from a missing object).
  ``repair``'s reads of the generations object versioning keeps need nothing more: a
  listing with ``versions=true`` is ``storage.objects.list``, a read of one generation
  ``storage.objects.get``.

The binding's condition, ``resource.name.startsWith("projects/_/buckets/B/objects/P/")``,
confines reads, writes and deletes to the prefix. It cannot confine ``storage.objects.list``:
a listing is checked on the bucket (``projects/_/buckets/B``), so the condition must let
the bucket itself through, and whoever may list sees every object name (and size) in the
bucket. Give each deployment a bucket of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidInput
from .permissions import ROLES, Role, needed_in_role

AGENT_PERMISSIONS: dict[str, str] = {
    "storage.objects.get": (
        "read objects and their metadata: task headers, the index, shards, data, journal "
        "blocks, upload markers and parts (compose reads its sources with it)"
    ),
    "storage.objects.list": (
        "list under the prefix: stages, partitions, unfinished uploads and their parts, and "
        "the store's clock when no other answer has told it"
    ),
    "storage.objects.create": (
        "write objects: every commit, data, journal blocks, upload markers and parts, the "
        "object compose makes, probe objects"
    ),
    "storage.objects.delete": (
        "replace an object (GCS needs it for every overwrite: each commit of a shard "
        "replaces it), and remove parts, markers, probe objects and an agent's own fenced data"
    ),
}
"""Each permission an agent needs, and what for."""

ADMIN_PERMISSIONS: dict[str, str] = {
    **AGENT_PERMISSIONS,
    "storage.objects.get": AGENT_PERMISSIONS["storage.objects.get"]
    + "; repair reads the noncurrent generations object versioning keeps with it",
    "storage.objects.list": AGENT_PERMISSIONS["storage.objects.list"]
    + "; repair lists the generations object versioning keeps with it (versions=true)",
    "storage.buckets.get": (
        "tell a missing bucket from a missing object (after a write or a listing answered 404)"
    ),
}

CANNOT_CONFINE = (
    "storage.objects.list is checked on the bucket, not on object names: the condition lets "
    'the bucket through (resource.type == "storage.googleapis.com/Bucket"), so a holder '
    "of either role can list every object name and size in the bucket, whatever the "
    "prefix. Give each deployment (each prefix that must not see another's names) a bucket "
    "of its own.",
    "GCS has no permission that replaces an object without being able to delete it: an agent "
    "that commits a shard can delete it too (S3's policy denies agents that). The roles "
    "confine deletes to the prefix only; bucket object versioning keeps what a delete "
    "removed, for repair (soft delete keeps it too, but repair does not read it).",
    "A condition on resource.name is an IAM binding on the bucket (or project): it needs "
    "uniform bucket-level access on the bucket.",
)
"""What GCS's IAM cannot confine for these roles, in words."""

GET, LIST, CREATE, DELETE = (
    "storage.objects.get",
    "storage.objects.list",
    "storage.objects.create",
    "storage.objects.delete",
)

STORE_PERMISSIONS: Mapping[str, frozenset[str]] = {
    "get": frozenset({GET}),
    "head": frozenset({GET}),
    "open": frozenset({GET}),
    "list": frozenset({LIST}),
    "now": frozenset({LIST}),  # a listing of one name, when no answer has told the time
    "put": frozenset({CREATE, DELETE}),  # replacing an object needs delete
    "put_digested": frozenset({CREATE, DELETE}),
    "delete": frozenset({DELETE}),
    "create_upload": frozenset({CREATE}),  # the upload's marker
    "upload_part": frozenset({CREATE, DELETE, GET}),  # a part sent again replaces it; the
    # marker is read after
    "list_parts": frozenset({LIST}),
    "complete_upload": frozenset({LIST, GET, CREATE, DELETE}),  # compose reads its sources;
    # the marker and parts go after
    "abort_upload": frozenset({LIST, DELETE}),
    "list_uploads": frozenset({LIST}),
    "versions": frozenset({LIST}),  # objects.list with versions=true (repair)
    "get_version": frozenset({GET}),  # one generation's metadata and bytes (repair)
}
"""The permissions each ``ObjectStore`` call of ``GCSStore`` needs."""

ROLE_IDS = {"agent": "objmanifestAgent", "admin": "objmanifestAdmin"}


def _cel(text: str) -> str:
    """``text`` as a CEL string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def condition(bucket: str, prefix: str) -> dict[str, str] | None:
    """The IAM condition that confines a binding to ``prefix`` (None: the whole bucket)."""
    prefix = prefix.strip("/")
    if not prefix:
        return None
    objects = f"projects/_/buckets/{bucket}/objects/{prefix}/"
    return {
        "title": f"objmanifest under {prefix}/"[:100],
        "description": (
            f"Objects under gs://{bucket}/{prefix}/ (unfinished uploads keep their parts "
            "there too); the bucket itself for listing, which GCS checks on the bucket"
        ),
        "expression": (
            f"resource.name.startsWith({_cel(objects)}) || "
            '(resource.type == "storage.googleapis.com/Bucket" && '
            f"resource.name == {_cel(f'projects/_/buckets/{bucket}')})"
        ),
    }


def policy(bucket: str, prefix: str, role: Role = "agent") -> dict[str, Any]:
    """The custom role ``role`` needs for ``gs://bucket/prefix``, the binding that grants
    it under the prefix, what each permission is for and what cannot be confined."""
    if role not in ROLES:
        raise InvalidInput(f"unknown role {role!r}: use one of {', '.join(ROLES)}")
    wanted = AGENT_PERMISSIONS if role == "agent" else ADMIN_PERMISSIONS
    binding: dict[str, Any] = {
        "role": f"projects/PROJECT_ID/roles/{ROLE_IDS[role]}",
        "members": [f"serviceAccount:{role.upper()}@PROJECT_ID.iam.gserviceaccount.com"],
    }
    confined = condition(bucket, prefix)
    if confined is not None:
        binding["condition"] = confined
    return {
        "role": {
            "title": f"objmanifest {role}",
            "description": f"What objmanifest's {role} needs in gs://{bucket}",
            "stage": "GA",
            "includedPermissions": sorted(wanted),
        },
        "bucket_binding": binding,
        "permissions": dict(sorted(wanted.items())),
        "cannot_confine": list(CANNOT_CONFINE),
        "apply": [
            f"gcloud iam roles create {ROLE_IDS[role]} --project=PROJECT_ID "
            "--file=ROLE.yaml  (the role above)",
            f"gcloud storage buckets add-iam-policy-binding gs://{bucket} --member=... "
            f"--role=projects/PROJECT_ID/roles/{ROLE_IDS[role]} --condition=...  (the "
            "binding above)",
        ],
    }


def needed(op: str, address: str) -> str:
    """What a call of ``op`` on ``address`` (``gs://bucket/key``) needs, in words, as
    ``doctor`` reports a refused call."""
    return needed_in_role(STORE_PERMISSIONS, op, address, "permissions", "bound")
