"""What objmanifest needs to be allowed in a bucket: least-privilege AWS IAM policies.

Two roles, for the bucket and prefix of a store URL (``objmanifest iam-policy``):

* ``agent``: everything agents and shell steps do (``init``, ``declare``, ``claim``,
  ``put``, ``renew``, ``fail``, ``release``, ``consume``, ``status``, ``reap``, ``log``,
  ``migrate``, ``revive``, ``undeclare``, ``doctor`` ...). It reads and lists only under the
  prefix (listing through the ``s3:prefix`` condition, never bucket-wide), writes only the
  kinds of objects agents write (task headers, the index, shards, upload states, data,
  journal blocks, probe objects), and deletes and aborts uploads only where agents do: data
  objects (a fenced holder's own bytes, an upload replaced by a newer one, the upload of an
  entry that died) and probe objects. A statement denies it the deletion of every kind of
  manifest object, so no object an entry or a journal depends on can go, whatever a stage
  or file id is called.
* ``admin``: ``gc``, ``repair``, ``delete``, ``archive``, ``trim`` and
  ``Task.sweep_uploads``: everything under the prefix, and listing the bucket's multipart
  uploads (S3 cannot narrow that permission to a prefix); listing and reading the versions
  a versioned bucket keeps under the prefix (``repair`` restores a lost manifest object
  from its last sound version). Agents never read old versions.

``STORE_ACTIONS`` says which IAM actions each call of the storage seam needs on S3;
``tests/test_permissions.py`` derives them from the S3 calls in ``store/s3.py`` and runs
agents and operators against these policies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from ..core.layout import ARCHIVE, DAMAGED, DATA, HEADER, INDEX, JOURNAL, SHARDS, UPLOADS
from ..errors import InvalidInput
from . import PROBE_PREFIX

Role = Literal["agent", "admin"]
ROLES: tuple[Role, ...] = ("agent", "admin")

CLIENT_ACTIONS: Mapping[str, str] = {
    "get_object": "s3:GetObject",
    "head_object": "s3:GetObject",
    "put_object": "s3:PutObject",
    "delete_object": "s3:DeleteObject",
    "list_objects_v2": "s3:ListBucket",
    "create_multipart_upload": "s3:PutObject",
    "upload_part": "s3:PutObject",
    "complete_multipart_upload": "s3:PutObject",
    "list_parts": "s3:ListMultipartUploadParts",
    "abort_multipart_upload": "s3:AbortMultipartUpload",
    "list_multipart_uploads": "s3:ListBucketMultipartUploads",
    "list_object_versions": "s3:ListBucketVersions",
    "get_object+VersionId": "s3:GetObjectVersion",
}
"""The IAM action that allows each S3 request ``S3Store`` sends (by boto3 method; a request
of one version, with a ``VersionId``, is ``METHOD+VersionId``)."""

STORE_ACTIONS: Mapping[str, frozenset[str]] = {
    "get": frozenset({"s3:GetObject"}),
    "head": frozenset({"s3:GetObject"}),
    "open": frozenset({"s3:GetObject"}),
    "put": frozenset({"s3:PutObject"}),
    "put_digested": frozenset({"s3:PutObject"}),
    "delete": frozenset({"s3:DeleteObject"}),
    "list": frozenset({"s3:ListBucket"}),
    "now": frozenset({"s3:ListBucket"}),
    "create_upload": frozenset({"s3:PutObject"}),
    # asks whether the upload is gone when an answer is unclear
    "upload_part": frozenset({"s3:PutObject", "s3:ListMultipartUploadParts"}),
    "list_parts": frozenset({"s3:ListMultipartUploadParts"}),
    "complete_upload": frozenset({"s3:PutObject", "s3:ListMultipartUploadParts"}),
    # asks first whether the upload is still there (SeaweedFS answers 204 either way)
    "abort_upload": frozenset({"s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"}),
    "list_uploads": frozenset({"s3:ListBucketMultipartUploads"}),
    "versions": frozenset({"s3:ListBucketVersions"}),
    "get_version": frozenset({"s3:GetObjectVersion"}),
}
"""The IAM actions each ``ObjectStore`` call needs on S3."""

BUCKET_ACTIONS = frozenset(
    {"s3:ListBucket", "s3:ListBucketMultipartUploads", "s3:ListBucketVersions"}
)
"""Actions on the bucket itself; every other one is on an object."""

PREFIX_SCOPED = frozenset({"s3:ListBucket", "s3:ListBucketVersions"})
"""Bucket actions confined to the prefix by the ``s3:prefix`` condition."""

JSON = ".json"
DATA_KEYS = f"*/{DATA}*@*"
"""Data objects: ``TASK/data/STAGE/FILE_ID@EPOCH[~TAG]`` (never ending in ``.json``)."""

AGENT_WRITES = (
    f"*/{HEADER}",
    f"*/{INDEX}",
    f"*/{SHARDS}*{JSON}",
    f"*/{UPLOADS}*{JSON}",
    f"*/{JOURNAL}*{JSON}",
    DATA_KEYS,
    f"{PROBE_PREFIX}*",
)
"""Keys (under the prefix, as IAM patterns) agents write: not archive objects, nor the
copies of damaged objects ``repair`` keeps (``damaged/shards/X.json@TIME`` ends in a time,
so ``*/shards/*.json`` does not match it). IAM's ``*`` spans ``/``, so a pattern can also
match a key of another kind whose stage is called ``shards``, ``uploads`` or ``journal``."""

AGENT_REMOVES = (DATA_KEYS, f"{PROBE_PREFIX}*")
"""Keys agents delete, or abort uploads to: data and probe objects."""

MANIFEST_OBJECTS = (
    f"*/{HEADER}",
    f"*/{INDEX}",
    f"*/{SHARDS}*",
    f"*/{UPLOADS}*",
    f"*/{JOURNAL}*",
    f"*/{ARCHIVE}*",
    f"*/{DAMAGED}*",
)
"""Keys no agent may delete. ``*/data/*@*`` alone would also match the upload state (or a
journal block of it) of a file id with a ``data/`` segment and an ``@``; this denial closes
that (an agent's own fenced bytes under such a name are then left to ``gc``)."""

ADMIN_OBJECT_ACTIONS = (
    "s3:GetObject",
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
    "s3:GetObjectVersion",
)


def _literal(text: str) -> str:
    """``text`` with IAM's wildcard and variable characters taken literally."""
    return "".join({"*": "${*}", "?": "${?}", "$": "${$}"}.get(c, c) for c in text)


def bucket_arn(bucket: str) -> str:
    return f"arn:aws:s3:::{_literal(bucket)}"


def object_arn(bucket: str, prefix: str, pattern: str) -> str:
    """The ARN of the keys ``pattern`` (an IAM pattern) names under ``prefix``."""
    base = f"{_literal(prefix.strip('/'))}/" if prefix.strip("/") else ""
    return f"{bucket_arn(bucket)}/{base}{pattern}"


def _listing(bucket: str, prefix: str, action: str = "s3:ListBucket") -> dict[str, Any]:
    """ListBucket (or ListBucketVersions), under the prefix only when there is one (the
    URL's whole scope)."""
    what = "Versions" if action == "s3:ListBucketVersions" else ""
    statement: dict[str, Any] = {
        "Sid": f"List{what}UnderThePrefix",
        "Effect": "Allow",
        "Action": [action],
        "Resource": bucket_arn(bucket),
    }
    if prefix.strip("/"):
        # S3 checks this for a GET or HEAD of a missing key too (with the key as s3:prefix),
        # to answer 404 instead of 403: objmanifest relies on that 404.
        statement["Condition"] = {"StringLike": {"s3:prefix": [f"{_literal(prefix.strip('/'))}/*"]}}
    else:
        statement["Sid"] = f"ListTheBucket{what}"
    return statement


def policy(bucket: str, prefix: str, role: Role = "agent") -> dict[str, Any]:
    """The IAM policy document ``role`` needs for ``s3://bucket/prefix``."""
    if role not in ROLES:
        raise InvalidInput(f"unknown role {role!r}: use one of {', '.join(ROLES)}")

    def arns(patterns: tuple[str, ...]) -> list[str]:
        return [object_arn(bucket, prefix, p) for p in patterns]

    statements: list[dict[str, Any]] = [_listing(bucket, prefix)]
    if role == "admin":
        statements += [
            {
                "Sid": "ListMultipartUploads",
                "Effect": "Allow",
                "Action": ["s3:ListBucketMultipartUploads"],
                "Resource": bucket_arn(bucket),
            },
            {
                "Sid": "EverythingUnderThePrefix",
                "Effect": "Allow",
                "Action": list(ADMIN_OBJECT_ACTIONS),
                "Resource": arns(("*",)),
            },
            _listing(bucket, prefix, "s3:ListBucketVersions"),
        ]
    else:
        statements += [
            {
                "Sid": "ReadUnderThePrefix",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:ListMultipartUploadParts"],
                "Resource": arns(("*",)),
            },
            {
                "Sid": "WriteManifestDataAndJournal",
                "Effect": "Allow",
                "Action": ["s3:PutObject"],
                "Resource": arns(AGENT_WRITES),
            },
            {
                "Sid": "RemoveDataAndProbeObjects",
                "Effect": "Allow",
                "Action": ["s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": arns(AGENT_REMOVES),
            },
            {
                "Sid": "NeverDeleteManifestObjects",
                "Effect": "Deny",
                "Action": ["s3:DeleteObject"],
                "Resource": arns(MANIFEST_OBJECTS),
            },
        ]
    return {"Version": "2012-10-17", "Statement": statements}


def actions(document: Mapping[str, Any]) -> frozenset[str]:
    """Every action a policy document allows somewhere."""
    return frozenset(
        action
        for statement in document["Statement"]
        if statement["Effect"] == "Allow"
        for action in statement["Action"]
    )


def needed_in_role(
    granted: Mapping[str, frozenset[str]], op: str, address: str, what: str, given: str
) -> str:
    """What a call of ``op`` on ``address`` needs where a role with objmanifest's condition
    grants it (Azure, GCS), in words: the ``granted`` names of ``op`` (its ``what`` where
    none is known), and how the role is ``given``, as ``doctor`` reports a refused call."""
    wanted = sorted(granted.get(op, frozenset({f"(the {what} of {op})"})))
    scheme = address.partition("://")[0]
    return (
        f"{' and '.join(wanted)} on {address}, in a role {given} with objmanifest's condition "
        f"(`objmanifest iam-policy --url {scheme}://...` prints both)"
    )


def needed(op: str, address: str) -> str:
    """What a call of ``op`` on ``address`` (``s3://bucket/key``) needs, in words: the
    actions and the resource, as ``doctor`` reports a refused call."""
    wanted = sorted(STORE_ACTIONS.get(op, frozenset({f"(the permission of {op})"})))
    bucket, _, key = address.removeprefix("s3://").partition("/")
    object_actions = [a for a in wanted if a not in BUCKET_ACTIONS]
    parts = []
    if object_actions:
        parts.append(f"{' and '.join(object_actions)} on {bucket_arn(bucket)}/{_literal(key)}")
    for action in (a for a in wanted if a in BUCKET_ACTIONS):
        scope = f" (s3:prefix {key})" if action in PREFIX_SCOPED and key else ""
        parts.append(f"{action} on {bucket_arn(bucket)}{scope}")
    return "; ".join(parts)
