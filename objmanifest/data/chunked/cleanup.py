"""Cleaning up uploads nobody will finish, and marking data nobody may adopt back.

An upload is kept while its entry may be adopted by a later holder. It is aborted when the
entry dies (the task's commit observer calls ``abandon`` on every transition to ``dead``),
when the entry is made ready another way, or when a holder starts a new upload in its
place. ``sweep`` finds what is left over. Data a consumer found bad is marked
(``reject_data``) before the entry fails, so it is never adopted back.
"""

from __future__ import annotations

import logging

from ...core.model import Entry
from ...core.states import State
from ...store import list_keys
from .scope import Scope
from .state import Abort, Reject, UploadCodec, UploadState, read_state

log = logging.getLogger(__name__)


def abandon(scope: Scope, stage: str, file_id: str, epoch: int | None = None) -> str | None:
    """Abort the entry's recorded upload (unless a holder newer than ``epoch`` has it), for
    an entry that is dead or was produced another way. The state is marked aborted first,
    so no holder records parts for it any more; returns the key if an upload was aborted."""
    key = scope.layout.upload_state(stage, file_id)
    codec = UploadCodec(scope.layout.task_id, stage, file_id, scope.schema)
    old = scope.docs.detached().commit(key, codec, Abort(epoch))
    if old is None or old.key is None or old.upload_id is None:
        return None
    if not scope.store.abort_upload(old.key, old.upload_id):
        return None  # completed or aborted already
    log.info("%s: aborted the upload of %s", file_id, old.key)
    return old.key


def reject_data(scope: Scope, entry: Entry) -> None:
    """A consumer found the entry's chunked data bad (or missing): mark its upload so no
    later holder adopts that object back. Must land before the entry is failed; a store
    fault is raised (the entry then stays as it is, and the next consumer tries again)."""
    if not entry.is_chunked or entry.key is None or entry.parts_key is None:
        return
    codec = UploadCodec(scope.layout.task_id, entry.stage, entry.file_id, scope.schema)
    scope.docs.detached().commit(entry.parts_key, codec, Reject(entry.key))


def sweep(scope: Scope) -> list[str]:
    """Abort the uploads nobody can adopt any more; returns their keys.

    That is the upload of an entry that is dead, gone, or ready with other data, and any
    upload under the task's data that no state records (its starter died before recording
    it) unless its entry is being written now. Any agent may run it at any time.
    """
    return sweep_plan(scope, apply=True)


def sweep_plan(scope: Scope, *, apply: bool) -> list[str]:
    """``sweep``, or with ``apply=False`` only the keys it would abort (``gc --dry-run``)."""
    store, layout = scope.store, scope.layout
    aborted: list[str] = []
    recorded: set[tuple[str, str]] = set()
    for key in list(list_keys(store, layout.uploads_prefix)):
        doc = read_state(store, layout, key)
        if doc is None or doc.status != "open" or doc.key is None or doc.upload_id is None:
            continue
        entry = scope.entry(doc.stage, doc.file_id)
        if _adoptable(entry, doc.key):
            recorded.add((doc.key, doc.upload_id))
        elif not apply or abandon(scope, doc.stage, doc.file_id):
            aborted.append(doc.key)
    for key, upload_id in list(store.list_uploads(layout.data_prefix)):
        if (key, upload_id) in recorded or _being_written(scope, key):
            continue
        if not apply or store.abort_upload(key, upload_id):
            aborted.append(key)
    return aborted


def adoptable(entry: Entry | None, doc: UploadState | None, key: str) -> bool:
    """Is ``key`` an upload (or the object it completed) a holder of ``entry`` may still
    adopt? Then gc keeps it whoever started it."""
    return doc is not None and doc.status == "open" and doc.key == key and _adoptable(entry, key)


def _adoptable(entry: Entry | None, key: str) -> bool:
    """May a holder still finish this upload? Not once the entry is dead or has other data."""
    if entry is None or entry.state is State.dead:
        return False
    return entry.state not in (State.ready, State.consumed) or entry.key == key


def _being_written(scope: Scope, key: str) -> bool:
    """Is ``key`` the data key of an entry someone holds now?"""
    parsed = scope.layout.parse(key)
    if parsed.kind != "data" or parsed.stage not in scope.stages or parsed.file_id is None:
        return False
    assert parsed.stage is not None
    entry = scope.entry(parsed.stage, parsed.file_id)
    return entry is not None and entry.state is State.writing
