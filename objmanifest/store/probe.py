"""Asking a store whether it enforces conditional writes, before trusting it with a task."""

from __future__ import annotations

import logging

from ..errors import NotFound, ObjManifestError, OutcomeUnknown, PreconditionFailed
from .base import CREATE, ObjectStore, PutMode

PROBE_PREFIX = ".objmanifest-probe/"

log = logging.getLogger(__name__)


def probe_conditional_writes(store: ObjectStore, key: str) -> list[str]:
    """What this store gets wrong about conditional writes; empty when it enforces them.

    The protocol is only safe on a store that refuses a second ``If-None-Match: *`` create
    and an ``If-Match`` with a stale ETag, so ``Task.create`` asks before trusting it.
    Each probe write has a body of its own and is read back when its answer is a refusal
    or lost, so a lost response (or a client retry meeting its own write) is not taken for
    a refusal.
    """
    nonce = store.runtime.new_id()

    def accepted(step: str, mode: PutMode) -> bool:
        body = f"{step}:{nonce}".encode()
        try:
            store.put(key, body, mode=mode)
            return True
        except (PreconditionFailed, OutcomeUnknown):
            pass
        try:
            blob = store.get(key)
        except NotFound:
            return False
        return blob is not None and blob.body == body

    problems = []
    reached = False  # did the first write get an answer? (if not, there is nothing to remove)
    try:
        created = accepted("create", CREATE)
        reached = True
        if not created:
            return [f"a create with If-None-Match: * of a new key {store.describe(key)} failed"]
        if accepted("create-again", CREATE):
            problems.append("If-None-Match: * is ignored (a second create of one key succeeded)")
        if accepted("stale", PutMode.update('"00000000000000000000000000000000"')):
            problems.append("If-Match is ignored (a write with a stale ETag succeeded)")
        if not accepted("current", PutMode.update(store.head(key).etag)):
            problems.append("If-Match with the current ETag was refused")
    finally:
        try:
            if reached:
                store.delete(key)
        except ObjManifestError as e:
            log.warning("could not remove the probe object %s: %s", store.describe(key), e)
    return problems
