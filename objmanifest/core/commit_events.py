"""Commits as events: what changed, by which command, for whom.

Every commit that lands on a manifest object (a stage shard, the index, an upload state) is
published once as a ``CommitEvent`` to the observers of its ``Documents``. Observers are
where side effects of transitions live (an entry that became ``dead`` has its upload
aborted), and where a journal, metrics or a status page will listen; no caller runs such a
side effect by hand.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Change:
    """One item of an object that a commit changed: an entry of a shard (states are entry
    states; ``removed`` when it left the shard), the upload of an upload state (states are
    its status), or a declaration in the index."""

    item: str
    after: str
    before: str | None = None
    """Its state before the commit; None if the commit created it."""
    epoch: int | None = None
    retry_count: int | None = None
    error: str | None = None
    checksum: str | None = None
    # What a repair needs to rebuild the entry from its journal (``ops.repair``), each set
    # only when it applies: the data of a ready entry (with its checksum), the marks made
    # on it, and the declaration (when the commit created the entry).
    key: str | None = None
    size: int | None = None
    part_size: int | None = None
    parts_key: str | None = None
    whole_checksum: str | None = None
    consumed_by: tuple[str, ...] | None = None
    depends_on: tuple[str, ...] | None = None
    consumers: tuple[str, ...] | None = None
    # The times a stage's deadline and a retry backoff count from (store time): each set
    # when the commit set it (``retry_at`` whenever the entry has one), so a rebuilt entry
    # keeps them.
    claimed_at: datetime | None = None
    ready_at: datetime | None = None
    retry_at: datetime | None = None


_CHANGE_DEFAULTS = {f.name: f.default for f in fields(Change) if f.default is not MISSING}
_new_change = object.__new__
_set = object.__setattr__


def change_of(item: str, after: str, **changed: Any) -> Change:
    """``Change(item=item, after=after, **changed)`` as its ``__init__`` makes it (every field,
    in order), without the ``__init__``: a frozen dataclass sets each of its twenty fields
    through ``object.__setattr__``, which was most of a commit's transitions. Only for
    names of ``Change``'s fields, which its callers spell out."""
    made = _new_change(Change)
    _set(made, "__dict__", {"item": item, "after": after, **_CHANGE_DEFAULTS, **changed})
    return made


@dataclass(frozen=True)
class CommitEvent:
    """A commit that landed: the object, its new version, the named command and its actor,
    the store's time it was decided at, what it changed, and how long it took."""

    key: str
    version: int | None
    command: str
    actor: str
    commit_id: str
    at: datetime
    transitions: tuple[Change, ...]
    seconds: float = field(default=0.0, compare=False)
    """From the call of ``commit`` (when it joined the CAS loop, waiting for a write in
    flight included) to the write that landed, on the runtime's monotonic clock: the
    commit latency metrics report. A measurement, not what happened, so equality ignores
    it."""


Observer = Callable[[CommitEvent], None]


class Observers:
    """The observers of a task's commits, shared by every ``Documents`` of the task.

    An observer runs in the committing thread, after the commit landed and outside its lock.
    An observer that raises is logged with its traceback; the commit stands either way.
    """

    def __init__(self) -> None:
        self._observers: tuple[Observer, ...] = ()
        self._lock = threading.Lock()

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Add ``observer``; returns the function that removes it."""
        with self._lock:
            self._observers = (*self._observers, observer)

        def unsubscribe() -> None:
            with self._lock:
                self._observers = tuple(o for o in self._observers if o is not observer)

        return unsubscribe

    def publish(self, event: CommitEvent) -> None:
        for observer in self._observers:
            try:
                observer(event)
            except Exception:
                log.exception("an observer of %s failed on %s", event.key, event.command)
