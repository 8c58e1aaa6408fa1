"""What the commit loop is given and counts: the codec and command protocols, the retry
policy and the commit counts."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeVar

from ..core.commit_events import Change
from ..core.model import JournalRecord
from ..errors import (
    InvalidInput,
)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


R_co = TypeVar("R_co", covariant=True)


class Codec(Protocol[T]):
    """How one kind of manifest object is read, written and stamped."""

    @property
    def repair(self) -> str:
        """What a user can do about a corrupt object of this kind, for ``CorruptShard``."""
        ...

    def decode(self, key: str, body: bytes) -> T: ...
    def encode(self, doc: T) -> bytes: ...
    def empty(self) -> T: ...
    def stamp(self, doc: T, commit_id: str) -> T:
        """``doc`` as the next version, written by ``commit_id``. The members of a group
        commit are stamped one after the other with the one id of their write: a doc that
        ends with ``commit_id`` already remembers it once."""
        ...

    def commit_ids(self, doc: T) -> Sequence[str]: ...
    def version(self, doc: T) -> int | None: ...
    def transitions(self, before: T, after: T) -> Sequence[Change]: ...
    def journal(self, doc: T) -> tuple[str | None, tuple[JournalRecord, ...]] | None:
        """The journal id and records ``doc`` carries; None if its schema has no journal."""
        ...

    def with_journal(self, doc: T, journal_id: str, records: Sequence[JournalRecord]) -> T: ...


class Command(Protocol[T, R_co]):
    """A named change: ``apply(doc, store_time) -> (new doc | None, result)``.

    ``apply`` must be pure: the loop may call it several times, on fresher versions, until
    its write wins. A new doc of None means "nothing to write"; a refusal is raised as an
    ``ObjManifestError``.
    """

    @property
    def name(self) -> str: ...
    @property
    def actor(self) -> str: ...
    def apply(self, doc: T, now: datetime) -> tuple[T | None, R_co]: ...


GROUP_MAX = 256


"""The most commands one write carries by default (``CasPolicy.max_group``), so that one PUT
stays of reasonable size; ``repair`` counts on it (each member is a version an object may
carry unflushed)."""


@dataclass(frozen=True)
class CasPolicy:
    """How hard a commit tries before giving up with ``ConflictRetriesExhausted``, and how
    many queued commands of one object one write may carry (at most ``GROUP_MAX``)."""

    max_attempts: int = 100
    base_delay: float = 0.01
    max_delay: float = 1.0
    max_group: int = GROUP_MAX
    fresh_seconds: float = 1.0
    """How long a cached version confirmed current (read, or written here) counts as likely
    still current (``Documents.likely_current``); 0: never."""
    contended_seconds: float = 0.1
    """How long it counts instead while a write of the object lost a race less than
    ``fresh_seconds`` ago: an object others write too is read first, unless this process
    confirmed it this recently (a write of its own that just landed is as fresh as a read
    would be, and saves the read's round trip)."""

    def __post_init__(self) -> None:
        """Refuse a policy that would loop forever, never try, or pause for a negative or
        unbounded time: a bad number here is the caller's, so it is ``InvalidInput``."""
        for name in ("max_attempts", "max_group"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInput(f"CasPolicy.{name} must be a whole number >= 1, not {value!r}")
        if self.max_group > GROUP_MAX:  # repair's RECORDS_AT_RISK counts on this bound
            raise InvalidInput(
                f"CasPolicy.max_group must be at most {GROUP_MAX}, not {self.max_group}"
            )
        for name in ("base_delay", "max_delay", "fresh_seconds", "contended_seconds"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise InvalidInput(
                    f"CasPolicy.{name} must be a finite number of seconds >= 0, not {value!r}"
                )

    def backoff(self, attempt: int, rand: float) -> float:
        """The pause after lost race number ``attempt``; ``rand`` is uniform in [0, 1)."""
        return rand * min(self.max_delay, self.base_delay * float(2 ** min(attempt, 16)))


_COUNTING = threading.Lock()


@dataclass
class Stats:
    """Counts for metrics and the demo's summary: commits that landed (whether their answer
    came back or the re-read recognised them), lost races, reads, 304s, lost answers."""

    commits: int = 0
    grouped: int = 0
    """Commits that landed in another commit's write (a group commit's members after its
    first): the writes that landed are ``commits - grouped``."""
    conflicts: int = 0
    reads: int = 0
    not_modified: int = 0
    lost_responses: int = 0
    journal_blocks: int = 0
    """Journal blocks this process wrote (or found written by another)."""

    @property
    def writes(self) -> int:
        """Writes of manifest objects that landed: one per PUT, whatever it carried."""
        return self.commits - self.grouped

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to ``name``; safe from any thread (commits of different objects run in
        parallel and share these counts)."""
        with _COUNTING:
            setattr(self, name, getattr(self, name) + n)

    def landed(self, commits: int) -> None:
        """Count the ``commits`` one write that landed carried: all but its first grouped."""
        with _COUNTING:
            self.commits += commits
            self.grouped += commits - 1
