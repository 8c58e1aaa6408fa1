"""The side effects of entry transitions, run from commit events in one place.

The task subscribes ``TransitionEffects`` to its commits, so every path that moves an entry
(``fail``, a takeover in ``claim`` or ``claim_many``, ``reap``, a checksum mismatch) gets
the same follow-up, whoever committed it:

* an entry that became ``dead``: nobody will adopt its upload, so it is aborted;
* an entry made ``ready`` as one object after an earlier holder: that holder's upload is
  aborted (unless a newer holder has it).

A follow-up that fails is logged; ``Task.sweep_uploads`` finds what is left over.
"""

from __future__ import annotations

import logging

from ..core import checksum
from ..core.commit_events import CommitEvent
from ..core.layout import Parsed
from ..core.states import State
from ..errors import ObjManifestError
from .chunked import Scope, abandon

log = logging.getLogger(__name__)

DEAD, READY, WRITING = State.dead.value, State.ready.value, State.writing.value
"""The states a transition is looked at for, as its ``Change`` says them (every commit's
transitions are looked at: an enum's ``value`` is a property lookup each time)."""


class TransitionEffects:
    """A commit observer that runs the side effects of entry transitions."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def __call__(self, event: CommitEvent) -> None:
        parsed: Parsed | None = None  # parsed only for a transition with an effect (rare)
        for t in event.transitions:
            if t.after == DEAD and t.before != DEAD:
                epoch, why = None, "it is dead"
            elif (
                t.after == READY
                and t.before == WRITING
                and (t.epoch or 0) > 1
                and not checksum.is_composite(t.checksum)
            ):
                epoch, why = t.epoch, "it was made ready as one object"
            else:
                continue
            parsed = parsed or self.scope.layout.parse(event.key)
            if parsed.kind != "shard":
                return
            self._abandon(parsed.stage, t.item, epoch, why)

    def _abandon(self, stage: str | None, file_id: str, epoch: int | None, why: str) -> None:
        try:
            # The task's one shard holds every stage: the entry says which is its own.
            stage = stage or self.scope.stage_of(file_id)
            abandon(self.scope, stage, file_id, epoch)
        except ObjManifestError as e:
            log.warning(
                "could not abort the upload of %r (%s); sweep_uploads will: %s", file_id, why, e
            )
