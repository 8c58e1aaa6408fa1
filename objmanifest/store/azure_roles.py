"""What objmanifest needs to be allowed in an Azure container: least-privilege custom roles
(``objmanifest iam-policy --url az://CONTAINER/PREFIX``).

Azure's built-in roles do not fit: Storage Blob Data Contributor lets an agent delete any
blob, manifest objects included, and Reader cannot write. A custom role names data actions
only; which blobs they reach is said by a condition on the role's assignment (Azure ABAC,
condition version 2.0), since a role definition cannot name paths. So each role here is
the two: a definition scoped to the container, and the condition to assign it with.

* ``agent``: reads and lists under the prefix only; writes the kinds of objects agents
  write (task headers, the index, shards, upload states, data, journal blocks, probe
  objects, upload markers); deletes only data objects, probe objects and upload markers,
  never a manifest object (whatever a stage or file id is called).
* ``admin`` (``gc``, ``repair``, ``delete``, ``archive``, ``trim``, ``sweep_uploads``):
  reads, writes and deletes everything under the prefix.

``DATA_ACTIONS`` says which data action each call of the storage seam needs on Azure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidInput
from . import PROBE_PREFIX
from .azure_uploads import UPLOADS
from .permissions import (
    AGENT_REMOVES,
    AGENT_WRITES,
    MANIFEST_OBJECTS,
    ROLES,
    Role,
    needed_in_role,
)

BLOBS = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
READ = f"{BLOBS}/read"
WRITE = f"{BLOBS}/write"
ADD = f"{BLOBS}/add/action"
DELETE = f"{BLOBS}/delete"

PURPOSE: Mapping[str, str] = {
    READ: "Get Blob, Get Blob Properties, Get Block List (reads, conditional reads, the parts "
    "of an upload) and List Blobs (listing, the store's clock, open uploads); with blob "
    "versioning on, listing and reading a blob's earlier versions (repair)",
    WRITE: "Put Blob (create-only and If-Match writes of the manifest, data, journal blocks), "
    "Put Block and Put Block List (the parts of a chunked entry and their create-only commit)",
    ADD: "creating a blob that does not exist yet (Azure asks for write or add on a new blob)",
    DELETE: "Delete Blob (agents: data and probe objects and the markers of their uploads; "
    "admin: anything under the prefix)",
}
"""What each data action is for."""

CLIENT_ACTIONS: Mapping[str, frozenset[str]] = {
    "download_blob": frozenset({READ}),
    "stream": frozenset({READ}),  # Get Blob, as a stream (azure_answers.stream)
    "get_blob_properties": frozenset({READ}),
    "exists": frozenset({READ}),
    "get_block_list": frozenset({READ}),
    "list_blobs": frozenset({READ}),
    "walk_blobs": frozenset({READ}),
    "upload_blob": frozenset({WRITE, ADD}),
    "stage_block": frozenset({WRITE, ADD}),
    "commit_block_list": frozenset({WRITE, ADD}),
    "delete_blob": frozenset({DELETE}),
}
"""The data actions each SDK call ``AzureStore`` makes needs."""

DATA_ACTIONS: Mapping[str, frozenset[str]] = {
    "get": frozenset({READ}),
    "head": frozenset({READ}),
    "open": frozenset({READ}),
    "list": frozenset({READ}),
    "now": frozenset({READ}),
    "put": frozenset({READ, WRITE, ADD}),  # READ: a 403 is asked again without a body
    "put_digested": frozenset({READ, WRITE, ADD}),
    "delete": frozenset({DELETE}),
    "create_upload": frozenset({WRITE, ADD}),  # the upload's marker
    "upload_part": frozenset({READ, WRITE, ADD}),  # asks for the marker first; a body cut
    # short (a 403) is told from refused credentials by asking again
    "list_parts": frozenset({READ}),
    "complete_upload": frozenset({READ, WRITE, ADD, DELETE}),  # the marker goes at the end
    "abort_upload": frozenset({DELETE}),
    "list_uploads": frozenset({READ}),
    "versions": frozenset({READ}),  # List Blobs with its versions
    "get_version": frozenset({READ}),  # Get Blob of one version
}
"""The data actions each ``ObjectStore`` call needs on Azure."""

NOT_CONFINED = (
    "A role definition names actions, never paths: the paths are confined by the condition, "
    "so assign the role with it (condition version 2.0) at the container's scope.",
    "Anyone with the account key or a SAS token is not bound by roles or conditions at all: "
    "give agents identities (azure-identity) and disallow Shared Key access on the account "
    "(allowSharedKeyAccess=false) where you can.",
    "blobs/write allows replacing a blob, not only creating it: agents need it to update "
    "shards, so an agent could also replace a data object it may write (consume verifies "
    "every object against its xxh3 checksum, and refuses one that differs).",
    "Staged, uncommitted blocks cannot be deleted by anyone: Azure drops them at the blob's "
    "next commit or after seven days.",
    "List Blobs needs blobs/read on the container; the condition confines listing to "
    "requests whose prefix is under the store's prefix.",
)


def _literal(prefix: str) -> str:
    if any(c in prefix for c in "*?'\\"):
        raise InvalidInput(
            f"a prefix with '*', '?', a quote or a backslash cannot be written in an Azure "
            f"role condition: {prefix!r}; use a plain path such as az://CONTAINER/jobs"
        )
    return prefix


def _path(pattern: str) -> str:
    return f"@Resource[{BLOBS}:path] StringLike '{pattern}'"


def _any(patterns: list[str]) -> str:
    return " OR ".join(_path(p) for p in patterns)


def _actions(*actions: str) -> str:
    return " OR ".join(f"ActionMatches{{'{a}'}}" for a in actions)


def _only(guard: str, allowed: str) -> str:
    """Requests that match ``guard`` are allowed only where ``allowed`` holds."""
    return f"(\n (\n  !({guard})\n )\n OR\n (\n  {allowed}\n )\n)"


def condition(prefix: str, role: Role = "agent") -> str:
    """The condition (version 2.0) to assign ``role`` with, for ``az://CONTAINER/PREFIX``."""
    if role not in ROLES:
        raise InvalidInput(f"unknown role {role!r}: use one of {', '.join(ROLES)}")
    base = f"{_literal(prefix.strip('/'))}/" if prefix.strip("/") else ""
    in_prefix = f"@Resource[{BLOBS}:path] StringStartsWith '{base}'"
    listing = "SubOperationMatches{'Blob.List'}"
    parts = [
        _only(f"{_actions(READ)} AND NOT {listing}", in_prefix),
        _only(
            f"{_actions(READ)} AND {listing}", f"@Request[{BLOBS}:prefix] StringStartsWith '{base}'"
        ),
    ]
    if role == "admin":
        parts.append(_only(_actions(WRITE, ADD, DELETE), in_prefix))
    else:
        writes = [f"{base}{p}" for p in (*AGENT_WRITES, f"{UPLOADS}*")]
        removes = [f"{base}{p}" for p in (*AGENT_REMOVES, f"{UPLOADS}*")]
        never = [f"{base}{p}" for p in MANIFEST_OBJECTS]
        parts.append(_only(_actions(WRITE, ADD), _any(writes)))
        parts.append(_only(_actions(DELETE), f"({_any(removes)}) AND NOT ({_any(never)})"))
    return "\nAND\n".join(parts)


def policy(container: str, prefix: str, role: Role = "agent") -> dict[str, Any]:
    """The custom role ``role`` needs on ``az://container/prefix``, the condition to assign
    it with, what each data action is for, and what Azure cannot confine."""
    text = condition(prefix, role)
    name = f"objmanifest {role} ({container}/{prefix.strip('/')})".replace(" ()", "")
    scope = (
        "/subscriptions/SUBSCRIPTION_ID/resourceGroups/RESOURCE_GROUP/providers/"
        f"Microsoft.Storage/storageAccounts/ACCOUNT/blobServices/default/containers/{container}"
    )
    actions = [READ, WRITE, ADD, DELETE]
    return {
        "roleDefinition": {
            "Name": name,
            "IsCustom": True,
            "Description": f"objmanifest's {role} on az://{container}/{prefix.strip('/')}: "
            "assign it with the condition beside it",
            "Actions": [],
            "NotActions": [],
            "DataActions": actions,
            "NotDataActions": [],
            "AssignableScopes": [scope],
        },
        "condition": text,
        "conditionVersion": "2.0",
        "assign": (
            f"az role definition create --role-definition role.json; az role assignment create "
            f"--role '{name}' --assignee PRINCIPAL --scope {scope} --condition @condition.txt "
            "--condition-version 2.0"
        ),
        "dataActions": {action: PURPOSE[action] for action in actions},
        "notConfined": list(NOT_CONFINED),
        "reserved": f"{PROBE_PREFIX} (doctor's objects) and {UPLOADS} (open uploads) are the "
        "store's own, under the prefix",
    }


def needed(op: str, address: str) -> str:
    """What a call of ``op`` on ``address`` (``az://container/key``) needs, in words, as
    ``doctor`` reports a refused call."""
    return needed_in_role(DATA_ACTIONS, op, address, "data actions", "assigned")
