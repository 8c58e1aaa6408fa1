"""The compare-and-swap loop (``cas.Documents``) on ``MemoryStore``: no server, no sleeping.

The document is a tiny one of our own (``Tally``: counters, the store time of the last
change, a version and the last commit ids) with named commands that add, take (refusing
when there is not enough) and raise a counter to a floor (nothing to write when it is
already there). The runtime records every sleep, returns fixed randomness and numbered ids,
and the store's clock moves one second at each reading, so each attempt has its own time.
Every test states exactly which calls reached the store, what was slept, counted and
published, and what the object holds afterwards.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, BinaryIO

import pytest

from objmanifest.cas.loop import Documents
from objmanifest.cas.policy import GROUP_MAX, CasPolicy, Stats
from objmanifest.core.commit_events import Change, CommitEvent
from objmanifest.core.runtime import Runtime
from objmanifest.errors import (
    ConflictRetriesExhausted,
    CorruptShard,
    InvalidInput,
    ObjManifestError,
    StoreError,
    UnsupportedSchema,
)
from objmanifest.store import CREATE, OVERWRITE, MemoryStore, PutMode
from objmanifest.store.errors import NoSuchObject, OutcomeUnknown, PreconditionFailed

from ..make import at

KEY = "tallies/main.json"
OTHER = "tallies/other.json"
RAND = 0.375
"""What the runtime's ``random()`` returns: exact in binary, so backoffs compare exactly."""
WAIT = 5.0
"""Bound on waiting for another thread; a passing test waits far less."""
KEPT = 4
"""How many commit ids a tally keeps."""


# -- the document, its codec and its commands ---------------------------------------------


@dataclass(frozen=True)
class Tally:
    counts: dict[str, int] = field(default_factory=dict)
    changed_at: str | None = None
    version: int = 0
    commits: tuple[str, ...] = ()


class TallyCodec:
    """A tally as JSON; its transitions are the counters a commit changed."""

    repair = "write the tally again"

    def decode(self, key: str, body: bytes) -> Tally:
        try:
            data = json.loads(body)
            return Tally(
                dict(data["counts"]), data["changed_at"], data["version"], tuple(data["commits"])
            )
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptShard(key, f"not a tally: {e}") from None

    def encode(self, doc: Tally) -> bytes:
        return json.dumps(
            {
                "counts": doc.counts,
                "changed_at": doc.changed_at,
                "version": doc.version,
                "commits": doc.commits,
            },
            sort_keys=True,
        ).encode()

    def empty(self) -> Tally:
        return Tally()

    def stamp(self, doc: Tally, commit_id: str) -> Tally:
        """The next version; the members of a group share their write's id, kept once."""
        commits = doc.commits if doc.commits[-1:] == (commit_id,) else (*doc.commits, commit_id)
        return replace(doc, version=doc.version + 1, commits=commits[-KEPT:])

    def commit_ids(self, doc: Tally) -> Sequence[str]:
        return doc.commits

    def version(self, doc: Tally) -> int | None:
        return doc.version

    def journal(self, doc: Tally) -> None:
        """A tally keeps no journal (the journal has tests of its own, test_journal.py)."""
        return None

    def with_journal(self, doc: Tally, journal_id: str, records: Sequence[Any]) -> Tally:
        return doc

    def transitions(self, before: Tally, after: Tally) -> list[Change]:
        return [
            Change(
                item=name,
                before=None if name not in before.counts else str(before.counts[name]),
                after=str(n),
            )
            for name, n in sorted(after.counts.items())
            if before.counts.get(name) != n
        ]


CODEC = TallyCodec()


class NotEnough(ObjManifestError):
    """The refusal of ``Take``."""


@dataclass(frozen=True)
class Add:
    """Adds ``n`` to a counter; returns its new value. ``seen`` records the version of every
    doc it was applied to."""

    item: str
    n: int = 1
    actor: str = "ann"
    name: str = "add"
    seen: list[int] = field(default_factory=list, compare=False)

    def apply(self, doc: Tally, now: datetime) -> tuple[Tally | None, int]:
        self.seen.append(doc.version)
        value = doc.counts.get(self.item, 0) + self.n
        return replace(
            doc, counts={**doc.counts, self.item: value}, changed_at=now.isoformat()
        ), value


@dataclass(frozen=True)
class Take:
    """Takes ``n`` from a counter, refusing with ``NotEnough`` when it holds less."""

    item: str
    n: int = 1
    actor: str = "bob"
    name: str = "take"
    seen: list[int] = field(default_factory=list, compare=False)

    def apply(self, doc: Tally, now: datetime) -> tuple[Tally | None, int]:
        self.seen.append(doc.version)
        have = doc.counts.get(self.item, 0)
        if have < self.n:
            raise NotEnough(f"{self.item} holds {have}, fewer than {self.n}")
        counts = {**doc.counts, self.item: have - self.n}
        return replace(doc, counts=counts, changed_at=now.isoformat()), have - self.n


@dataclass(frozen=True)
class AtLeast:
    """Raises a counter to ``n``; nothing to write when it holds that much already."""

    item: str
    n: int
    actor: str = "cat"
    name: str = "at_least"
    seen: list[int] = field(default_factory=list, compare=False)

    def apply(self, doc: Tally, now: datetime) -> tuple[Tally | None, int]:
        self.seen.append(doc.version)
        have = doc.counts.get(self.item, 0)
        if have >= self.n:
            return None, have
        counts = {**doc.counts, self.item: self.n}
        return replace(doc, counts=counts, changed_at=now.isoformat()), self.n


# -- the rig: store, runtime, clock, a rival writer ---------------------------------------


class Clock:
    """The store's clock: one second later at each reading (``at(1)``, ``at(2)`` ...)."""

    def __init__(self) -> None:
        self.readings = 0

    def __call__(self) -> datetime:
        self.readings += 1
        return at(self.readings)


def when(reading: int) -> str:
    """What a command stores as ``changed_at`` when it ran at the clock's ``reading``."""
    return at(reading).isoformat()


def op(n: int) -> str:
    """The first 16 characters of the runtime's ``n``-th id: one commit's operation."""
    return f"{n:016x}"


def cid(n: int, attempt: int) -> str:
    """The commit id of attempt ``attempt`` of the ``n``-th commit."""
    return f"{op(n)}.{attempt}"


@dataclass(frozen=True)
class Put:
    key: str
    mode: PutMode
    content_type: str


class Store(MemoryStore):
    """A ``MemoryStore`` that records every PUT's key, condition and content type, and can
    play a client retry that met its own earlier write: the next ``echoes`` PUTs land and
    are answered 412."""

    def __init__(self, bucket: str, **kwargs: Any) -> None:
        super().__init__(bucket, "p", **kwargs)
        self.puts: list[Put] = []
        self.echoes = 0

    def put(
        self,
        key: str,
        body: bytes | BinaryIO,
        *,
        mode: PutMode = OVERWRITE,
        metadata: dict[str, str] | None = None,
        content_type: str = "application/octet-stream",
    ) -> str:
        self.puts.append(Put(key, mode, content_type))
        etag = super().put(key, body, mode=mode, metadata=metadata, content_type=content_type)
        if self.echoes:
            self.echoes -= 1
            raise PreconditionFailed(f"{self.describe(key)}: met its own earlier write")
        return etag


class Runaway(Exception):
    """A loop that would never end; raised from the store after too many calls."""


class Monotonic:
    """The runtime's monotonic clock: it stands still until a test moves it (``t``)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Rig:
    """Our ``Documents`` on a recording store, what its runtime slept, what it published."""

    store: Store
    docs: Documents
    rival: Documents
    """Another writer of the same objects, with its own store object and cache."""
    sleeps: list[float]
    events: list[CommitEvent]
    monotonic: Monotonic
    """The runtime's monotonic clock, unless the rig was given another."""

    @property
    def calls(self) -> dict[str, int]:
        """The calls that reached our store, by name (not those a hook broke off first)."""
        return dict(self.store.faults.calls)

    def forget_calls(self) -> None:
        self.store.faults.calls.clear()
        self.store.puts.clear()

    def peek(self, key: str = KEY) -> Tally | None:
        """The object as stored, read past every cache and counter."""
        raw = MemoryStore(self.store.bucket, "p")
        try:
            blob = raw.get(key)
        except NoSuchObject:
            return None
        assert blob is not None
        return CODEC.decode(key, blob.body)

    def etag(self, key: str = KEY) -> str:
        return MemoryStore(self.store.bucket, "p").head(key).etag

    def before(self, op: str, action: Callable[[], None], times: int = 1) -> None:
        """Run ``action`` before each of our next ``times`` calls ``op`` on ``KEY``."""
        left = [times]

        def hook(name: str, key: str) -> None:
            if name == op and key == KEY and left[0] > 0:
                left[0] -= 1
                action()

        self.store.faults.hooks.append(hook)

    def rival_adds(self, item: str) -> Callable[[], None]:
        return lambda: self.rival.commit(KEY, CODEC, Add(item, actor="rex"))


def make_rig(policy: CasPolicy | None = None, monotonic: Callable[[], float] | None = None) -> Rig:
    bucket = f"cas-unit-{uuid.uuid4().hex}"
    ids = itertools.count(1)
    sleeps: list[float] = []
    clock = Monotonic()
    runtime = Runtime(
        monotonic=monotonic or clock,
        sleep=sleeps.append,
        random=lambda: RAND,
        new_id=lambda: f"{op(next(ids))}{'f' * 16}",
    )
    store = Store(bucket, clock=Clock(), runtime=runtime)
    total = itertools.count(1)

    def budget(name: str, key: str) -> None:
        if next(total) > 200:
            raise Runaway(f"{name} {key}: more than 200 calls to the store")

    store.faults.hooks.append(budget)
    rival_ids = itertools.count(1)
    rival_runtime = Runtime(
        sleep=lambda s: None,
        random=lambda: 0.0,
        new_id=lambda: f"r{next(rival_ids):015d}{'0' * 16}",
    )
    rival = Documents(Store(bucket, clock=lambda: at(-1), runtime=rival_runtime))
    docs = Documents(store, policy or CasPolicy())
    events: list[CommitEvent] = []
    docs.observers.subscribe(events.append)
    return Rig(store, docs, rival, sleeps, events, clock)


@pytest.fixture
def rig() -> Rig:
    return make_rig()


def rival_id(n: int) -> str:
    """The commit id of the rival's ``n``-th commit (each lands at its first attempt)."""
    return f"r{n:015d}.1"


def event(
    commit_id: str,
    at_reading: int,
    version: int,
    *transitions: Change,
    command: str = "add",
    actor: str = "ann",
    key: str = KEY,
) -> CommitEvent:
    return CommitEvent(
        key=key,
        version=version,
        command=command,
        actor=actor,
        commit_id=commit_id,
        at=at(at_reading),
        transitions=transitions,
    )


def moved(item: str, before: int | None, after: int) -> Change:
    return Change(item=item, before=None if before is None else str(before), after=str(after))


def backoff(attempt: int) -> float:
    return CasPolicy().backoff(attempt, RAND)


# -- creating, and the warm path ----------------------------------------------------------


def test_a_commit_on_an_absent_object_creates_it_with_a_create_only_put(rig: Rig) -> None:
    command = Add("x", 2)
    assert rig.docs.commit(KEY, CODEC, command) == 2

    assert rig.calls == {"get": 1, "put": 1}
    assert rig.store.puts == [Put(KEY, CREATE, "application/json")]
    assert command.seen == [0]
    assert rig.peek() == Tally({"x": 2}, when(1), 1, (cid(1, 1),))
    assert rig.docs.stats == Stats(commits=1, reads=1)
    assert rig.sleeps == []
    assert rig.events == [event(cid(1, 1), 1, 1, moved("x", None, 2))]


def test_a_warm_commit_is_one_put_and_no_get(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))
    etag = rig.etag()
    rig.forget_calls()

    assert rig.docs.commit(KEY, CODEC, Add("x")) == 2
    assert rig.calls == {"put": 1}
    assert rig.store.puts == [Put(KEY, PutMode.update(etag), "application/json")]
    assert rig.peek() == Tally({"x": 2}, when(2), 2, (cid(1, 1), cid(2, 1)))
    assert rig.docs.stats == Stats(commits=2, reads=1)

    etag = rig.etag()
    assert rig.docs.commit(KEY, CODEC, Add("y")) == 1
    assert rig.calls == {"put": 2}
    assert rig.store.puts[1] == Put(KEY, PutMode.update(etag), "application/json")
    assert rig.peek() == Tally({"x": 2, "y": 1}, when(3), 3, (cid(1, 1), cid(2, 1), cid(3, 1)))
    assert rig.docs.stats == Stats(commits=3, reads=1)
    assert [e.commit_id for e in rig.events] == [cid(1, 1), cid(2, 1), cid(3, 1)]


def test_the_commit_id_is_the_first_16_characters_of_a_new_id_and_the_attempt(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.rival.commit(KEY, CODEC, Add("y"))
    rig.docs.commit(KEY, CODEC, Add("x"))  # loses on its cache, wins on its second attempt
    stored = rig.peek()
    assert stored is not None
    assert stored.commits == (cid(1, 1), rival_id(1), cid(2, 2))
    assert cid(2, 2) == "0000000000000002.2"


# -- how likely the cached version is current -----------------------------------------------

FRESH = CasPolicy().fresh_seconds


def test_a_cached_version_counts_as_current_for_one_second_by_default() -> None:
    assert FRESH == 1.0


def test_nothing_cached_is_not_likely_current(rig: Rig) -> None:
    assert not rig.docs.likely_current(KEY)
    rig.rival.commit(KEY, CODEC, Add("x"))  # stored, but never read by us
    assert not rig.docs.likely_current(KEY)
    assert rig.calls == {}


def test_a_read_is_likely_current_for_fresh_seconds_and_a_304_confirms_it_again(
    rig: Rig,
) -> None:
    rig.rival.commit(KEY, CODEC, Add("x"))
    rig.docs.read(KEY, CODEC)
    rig.monotonic.t += FRESH - 0.25
    assert rig.docs.likely_current(KEY)
    rig.monotonic.t += 0.25  # exactly fresh_seconds after the read
    assert not rig.docs.likely_current(KEY)

    rig.docs.read(KEY, CODEC)  # a 304
    assert rig.docs.stats.not_modified == 1
    assert rig.docs.likely_current(KEY)
    rig.monotonic.t += FRESH - 0.25
    assert rig.docs.likely_current(KEY)
    rig.monotonic.t += 0.25
    assert not rig.docs.likely_current(KEY)
    assert rig.calls == {"get": 2}


def test_a_write_that_landed_is_likely_current(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))  # created: nothing was cached before
    assert rig.docs.likely_current(KEY)
    rig.monotonic.t += FRESH
    assert not rig.docs.likely_current(KEY)
    rig.docs.commit(KEY, CODEC, Add("x"))  # one PUT on the cached version, no read
    assert rig.calls == {"get": 1, "put": 2}
    assert rig.docs.likely_current(KEY)


CONTENDED = CasPolicy().contended_seconds


def test_a_version_counts_for_a_tenth_of_a_second_while_the_object_is_contended() -> None:
    assert CONTENDED == 0.1


def lose_a_race(rig: Rig) -> float:
    """Our write of a version read 10 s ago loses to the rival's; the 412 comes back 0.5 s
    after the commit began, and the write after the re-read lands 0.5 s later. Returns when
    the race was lost."""
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.monotonic.t += 10
    rig.rival.commit(KEY, CODEC, Add("y"))

    def later() -> None:
        rig.monotonic.t += 0.5

    rig.before("put", later, times=2)
    rig.forget_calls()
    rig.docs.commit(KEY, CODEC, Add("x"))  # a 412 on the cache, a re-read, then it lands
    assert rig.calls == {"put": 2, "get": 1}
    assert rig.docs.stats.conflicts == 1
    return rig.monotonic.t - 0.5


def test_after_a_lost_race_a_version_counts_only_while_just_confirmed(rig: Rig) -> None:
    """The object has another writer: the version this process wrote a moment ago is as
    fresh as a read would be, one confirmed longer ago is likely stale."""
    lost_at = lose_a_race(rig)
    landed_at = rig.monotonic.t
    assert landed_at == lost_at + 0.5
    assert rig.docs.likely_current(KEY)  # just written
    rig.monotonic.t = landed_at + CONTENDED - 0.01
    assert rig.docs.likely_current(KEY)
    rig.monotonic.t = landed_at + CONTENDED
    assert not rig.docs.likely_current(KEY)

    rig.monotonic.t = lost_at + FRESH - 0.2
    rig.docs.read(KEY, CODEC)  # a 304: confirmed again, but the lost race is recent
    assert rig.docs.likely_current(KEY)
    rig.monotonic.t += CONTENDED
    assert not rig.docs.likely_current(KEY)


def test_a_contended_version_stops_counting_exactly_contended_seconds_after() -> None:
    rig = make_rig(CasPolicy(contended_seconds=0.25))  # a binary fraction: exact sums
    lost_at = lose_a_race(rig)
    landed_at = lost_at + 0.5
    rig.monotonic.t = landed_at + 0.25 - 2**-20
    assert rig.docs.likely_current(KEY)
    rig.monotonic.t = landed_at + 0.25
    assert rig.monotonic.t - landed_at == 0.25
    assert not rig.docs.likely_current(KEY)


def test_once_a_lost_race_is_fresh_seconds_old_a_version_counts_for_fresh_seconds(
    rig: Rig,
) -> None:
    lost_at = lose_a_race(rig)
    rig.monotonic.t = lost_at + FRESH - 0.5
    rig.docs.read(KEY, CODEC)  # confirmed half a second before the lost race is old
    rig.monotonic.t = lost_at + FRESH - 0.01
    assert not rig.docs.likely_current(KEY)  # 0.49 s old, while contended
    rig.monotonic.t = lost_at + FRESH  # no race lost for fresh_seconds
    assert rig.docs.likely_current(KEY)
    rig.monotonic.t = lost_at + FRESH - 0.5 + FRESH - 0.01
    assert rig.docs.likely_current(KEY)
    rig.monotonic.t = lost_at + FRESH - 0.5 + FRESH
    assert not rig.docs.likely_current(KEY)


def test_a_race_lost_after_the_version_was_confirmed_makes_it_stale(rig: Rig) -> None:
    """A write of the cached version lost (its re-read then failed): the version is known
    to be old, however recently it was confirmed."""
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.rival.commit(KEY, CODEC, Add("y"))
    rig.monotonic.t += 0.01
    assert rig.docs.likely_current(KEY)  # the rival's write is not known here yet

    def unreadable() -> None:
        raise StoreError("the store is down")

    rig.before("get", unreadable)
    with pytest.raises(StoreError):
        rig.docs.commit(KEY, CODEC, Add("x"))  # a 412 on the cache, then the read fails
    assert rig.docs.stats.conflicts == 1
    assert not rig.docs.likely_current(KEY)
    assert rig.docs.lost_since(KEY, rig.monotonic.t)
    assert not rig.docs.lost_since(KEY, rig.monotonic.t + 0.001)


def test_a_race_lost_at_the_instant_of_the_confirmation_leaves_it_current(rig: Rig) -> None:
    """The 412's re-read confirms the version at the same clock reading as the loss: the
    confirmation came after it."""
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.rival.commit(KEY, CODEC, Add("y"))
    rig.docs.commit(KEY, CODEC, Add("x"))  # the clock does not move: lost and re-read at once
    assert rig.docs.stats.conflicts == 1
    assert rig.docs.likely_current(KEY)


def test_a_forgotten_version_is_not_likely_current(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.docs.forget(KEY)
    assert not rig.docs.likely_current(KEY)


def test_with_fresh_seconds_0_nothing_is_likely_current() -> None:
    rig = make_rig(CasPolicy(fresh_seconds=0.0))
    rig.docs.commit(KEY, CODEC, Add("x"))
    assert not rig.docs.likely_current(KEY)


# -- lost races -----------------------------------------------------------------------------


def test_a_commit_on_a_stale_cache_rereads_at_once_and_keeps_both_changes(rig: Rig) -> None:
    """The first try on the cached version was never validated: losing it says only that the
    cache is old, so the loop re-reads without sleeping."""
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.rival.commit(KEY, CODEC, Add("y"))
    rig.forget_calls()
    command = Add("x")

    assert rig.docs.commit(KEY, CODEC, command) == 2
    assert command.seen == [1, 2]
    assert rig.calls == {"put": 2, "get": 1}
    assert rig.sleeps == []
    assert rig.docs.stats == Stats(commits=2, conflicts=1, reads=2)
    assert rig.peek() == Tally({"x": 2, "y": 1}, when(3), 3, (cid(1, 1), rival_id(1), cid(2, 2)))
    assert rig.events[1:] == [event(cid(2, 2), 3, 3, moved("x", 1, 2))]


def test_a_lost_race_on_a_fresh_read_sleeps_the_backoff_then_retries(rig: Rig) -> None:
    rig.rival.commit(KEY, CODEC, Add("x"))
    rig.before("put", rig.rival_adds("y"))
    command = Add("x")

    assert rig.docs.commit(KEY, CODEC, command) == 2
    assert command.seen == [1, 2]
    assert rig.calls == {"get": 2, "put": 2}
    assert rig.sleeps == [backoff(1)]
    assert rig.sleeps == pytest.approx([0.02 * RAND], rel=1e-12)
    assert rig.docs.stats == Stats(commits=1, conflicts=1, reads=2)
    assert rig.peek() == Tally({"x": 2, "y": 1}, when(2), 3, (rival_id(1), rival_id(2), cid(1, 2)))
    assert rig.events == [event(cid(1, 2), 2, 3, moved("x", 1, 2))]


def test_an_event_says_how_long_its_commit_took_from_its_call_lost_races_included() -> None:
    now = [100.0]  # the runtime's monotonic clock, moved by hand
    rig = make_rig(monotonic=lambda: now[0])
    rig.rival.commit(KEY, CODEC, Add("x"))

    def slow_rival() -> None:  # each lost race takes 2.5 s
        now[0] += 2.5
        rig.rival.commit(KEY, CODEC, Add("y"))

    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.before("put", slow_rival, times=2)
    rig.docs.commit(KEY, CODEC, Add("x"))
    assert [e.seconds for e in rig.events] == [0.0, 5.0]
    assert rig.docs.stats.conflicts == 2
    assert rig.events[-1] == replace(rig.events[-1], seconds=0.0)  # not part of equality


def test_each_lost_race_after_a_fresh_read_sleeps_longer(rig: Rig) -> None:
    rig.rival.commit(KEY, CODEC, Add("x"))
    rig.before("put", rig.rival_adds("y"), times=3)
    command = Add("x")

    assert rig.docs.commit(KEY, CODEC, command) == 2
    assert command.seen == [1, 2, 3, 4]
    assert rig.sleeps == [backoff(1), backoff(2), backoff(3)]
    assert rig.sleeps == pytest.approx([0.0075, 0.015, 0.03], rel=1e-12)
    assert rig.docs.stats == Stats(commits=1, conflicts=3, reads=4)
    assert rig.peek() == Tally(
        {"x": 2, "y": 3}, when(4), 5, (rival_id(2), rival_id(3), rival_id(4), cid(1, 4))
    )
    assert rig.events == [event(cid(1, 4), 4, 5, moved("x", 1, 2))]


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_max_attempts_lost_races_give_up_with_nothing_changed(max_attempts: int) -> None:
    rig = make_rig(CasPolicy(max_attempts=max_attempts))
    rig.rival.commit(KEY, CODEC, Add("x"))
    rig.before("put", rig.rival_adds("y"), times=1000)

    with pytest.raises(
        ConflictRetriesExhausted,
        match=re.escape(
            f"gave up changing memory://{rig.store.bucket}/p/{KEY} after {max_attempts} lost "
            "races; nothing was changed by this call. Retry later, or spread the work over "
            "more stages."
        ),
    ):
        rig.docs.commit(KEY, CODEC, Add("x"))

    assert rig.calls == {"get": 1 + max_attempts, "put": max_attempts}
    assert rig.sleeps == [backoff(a) for a in range(1, max_attempts + 1)]
    assert rig.docs.stats == Stats(conflicts=max_attempts, reads=1 + max_attempts)
    stored = rig.peek()
    assert stored is not None
    assert stored.counts == {"x": 1, "y": max_attempts}
    assert not any(c.startswith(op(1)) for c in stored.commits)
    assert rig.events == []


# -- lost answers ---------------------------------------------------------------------------


def test_a_write_whose_answer_was_lost_is_recognised_by_its_commit_id(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.store.faults.add("put", key=KEY, effect="lose")
    rig.forget_calls()

    assert rig.docs.commit(KEY, CODEC, Add("x")) == 2
    assert rig.calls == {"put": 1, "get": 1}
    assert rig.sleeps == []
    assert rig.docs.stats.lost_responses == 1
    assert (rig.docs.stats.conflicts, rig.docs.stats.reads) == (0, 2)
    assert rig.peek() == Tally({"x": 2}, when(2), 2, (cid(1, 1), cid(2, 1)))
    assert rig.events[1:] == [event(cid(2, 1), 2, 2, moved("x", 1, 2))]

    rig.forget_calls()  # the version read back is cached: the next commit is one PUT
    assert rig.docs.commit(KEY, CODEC, Add("x")) == 3
    assert rig.calls == {"put": 1}

    rig.store.faults.add("put", key=KEY, effect="lose")
    assert rig.docs.commit(KEY, CODEC, Add("x")) == 4
    assert rig.docs.stats.lost_responses == 2
    assert [e.commit_id for e in rig.events] == [cid(1, 1), cid(2, 1), cid(3, 1), cid(4, 1)]


def test_a_lost_answer_is_recognised_under_another_writers_commit(rig: Rig) -> None:
    """The write landed, then someone else committed on top of it before the re-read: the
    id is still in the window, the change is not applied again, and the event is the one of
    the attempt that landed (its version, its time, its transitions)."""
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.store.faults.add("put", key=KEY, effect="lose")
    rig.before("get", rig.rival_adds("x"))
    command = Add("x", 5)

    assert rig.docs.commit(KEY, CODEC, command) == 6
    assert command.seen == [1]
    assert rig.peek() == Tally({"x": 7}, when(-1), 3, (cid(1, 1), cid(2, 1), rival_id(1)))
    assert rig.events[1:] == [event(cid(2, 1), 2, 2, moved("x", 1, 6))]
    assert rig.docs.stats == Stats(commits=2, reads=2, lost_responses=1)


def test_an_answer_lost_before_the_write_landed_is_retried_without_sleeping(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))

    def lost() -> None:
        raise OutcomeUnknown("the connection broke before the request was sent")

    rig.before("put", lost)
    rig.forget_calls()
    command = Add("x")

    assert rig.docs.commit(KEY, CODEC, command) == 2
    assert command.seen == [1, 1]
    assert len(rig.store.puts) == 2  # sent; the first broke off before the store saw it
    assert rig.calls == {"put": 1, "get": 1}
    assert rig.sleeps == []
    assert rig.docs.stats == Stats(commits=2, reads=2, not_modified=1, lost_responses=1)
    assert rig.peek() == Tally({"x": 2}, when(3), 2, (cid(1, 1), cid(2, 2)))
    assert rig.events[1:] == [event(cid(2, 2), 3, 2, moved("x", 1, 2))]


def test_a_lost_answer_then_another_writer_is_retried_and_its_next_loss_sleeps(
    rig: Rig,
) -> None:
    """The write did not land and someone else's did: the re-read (a fresh, validated
    version) shows no id of ours, so the change is applied again; losing the race after that
    fresh read sleeps the backoff of attempt 2."""
    rig.docs.commit(KEY, CODEC, Add("x"))
    plan = iter(["lost", "race"])

    def hook() -> None:
        step = next(plan, None)
        if step is not None:
            rig.rival_adds("y")()
        if step == "lost":
            raise OutcomeUnknown("no answer")

    rig.before("put", hook, times=2)
    rig.forget_calls()
    command = Add("x")

    assert rig.docs.commit(KEY, CODEC, command) == 2
    assert command.seen == [1, 2, 3]
    assert len(rig.store.puts) == 3  # sent; the first broke off before the store saw it
    assert rig.calls == {"put": 2, "get": 2}
    assert rig.sleeps == [backoff(2)]
    assert rig.docs.stats == Stats(commits=2, conflicts=1, reads=3, lost_responses=1)
    assert rig.peek() == Tally(
        {"x": 2, "y": 2}, when(4), 4, (cid(1, 1), rival_id(1), rival_id(2), cid(2, 3))
    )
    assert rig.events[1:] == [event(cid(2, 3), 4, 4, moved("x", 1, 2))]


def test_a_put_that_fails_changes_nothing_and_a_retry_lands(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.store.faults.add("put", key=KEY, effect="fail")
    rig.forget_calls()

    with pytest.raises(StoreError, match=re.escape(f"could not put {rig.store.describe(KEY)}")):
        rig.docs.commit(KEY, CODEC, Add("x"))
    assert rig.peek() == Tally({"x": 1}, when(1), 1, (cid(1, 1),))
    assert rig.events[1:] == []

    assert rig.docs.commit(KEY, CODEC, Add("x")) == 2
    assert rig.calls == {"put": 2}
    assert rig.peek() == Tally({"x": 2}, when(3), 2, (cid(1, 1), cid(3, 1)))
    assert rig.events[1:] == [event(cid(3, 1), 3, 2, moved("x", 1, 2))]


@pytest.mark.parametrize("cached", [True, False])
def test_a_412_that_met_our_own_write_is_recognised_as_landed(rig: Rig, cached: bool) -> None:
    """A client retry of a PUT that had landed meets its own write and is answered 412: the
    re-read finds the attempt's commit id, so the change is not applied twice. After a
    fresh read the loop took it for a lost race and slept first."""
    rig.docs.commit(KEY, CODEC, Add("x"))
    if not cached:
        rig.docs.forget(KEY)
    rig.store.echoes = 1
    rig.forget_calls()
    command = Add("x", 3)

    assert rig.docs.commit(KEY, CODEC, command) == 4
    assert command.seen == [1]
    assert rig.calls == {"put": 1, "get": 1 if cached else 2}
    assert rig.sleeps == ([] if cached else [backoff(1)])
    assert rig.docs.stats.conflicts == 1
    assert rig.peek() == Tally({"x": 4}, when(2), 2, (cid(1, 1), cid(2, 1)))
    assert rig.events[1:] == [event(cid(2, 1), 2, 2, moved("x", 1, 4))]


def test_every_commit_that_lands_is_counted(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.store.faults.add("put", key=KEY, effect="lose")
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.store.echoes = 1
    rig.docs.commit(KEY, CODEC, Add("x"))
    assert len(rig.events) == 3
    assert rig.docs.stats.commits == 3


# -- refusals and nothing to write ----------------------------------------------------------


def test_a_refusal_on_a_fresh_read_is_raised_at_once(rig: Rig) -> None:
    rig.rival.commit(KEY, CODEC, Add("x"))
    command = Take("x", 2)

    with pytest.raises(NotEnough, match=r"^x holds 1, fewer than 2$"):
        rig.docs.commit(KEY, CODEC, command)
    assert command.seen == [1]
    assert rig.calls == {"get": 1}
    assert rig.docs.stats == Stats(reads=1)
    assert rig.events == []


def test_a_refusal_on_the_cached_version_is_checked_on_a_fresh_read(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.rival.commit(KEY, CODEC, Add("x"))
    rig.forget_calls()
    command = Take("x", 2)

    assert rig.docs.commit(KEY, CODEC, command) == 0
    assert command.seen == [1, 2]
    assert rig.calls == {"get": 1, "put": 1}
    assert rig.sleeps == []
    assert rig.docs.stats == Stats(commits=2, reads=2)
    assert rig.peek() == Tally({"x": 0}, when(3), 3, (cid(1, 1), rival_id(1), cid(2, 1)))
    assert rig.events[1:] == [event(cid(2, 1), 3, 3, moved("x", 2, 0), command="take", actor="bob")]


def test_a_refusal_that_still_holds_on_a_fresh_read_is_raised(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.forget_calls()
    command = Take("x", 2)

    with pytest.raises(NotEnough, match=r"^x holds 1, fewer than 2$"):
        rig.docs.commit(KEY, CODEC, command)
    assert command.seen == [1, 1]
    assert rig.calls == {"get": 1}
    assert rig.docs.stats == Stats(commits=1, reads=2, not_modified=1)
    assert rig.events[1:] == []


def test_nothing_to_write_on_a_fresh_read_returns_without_a_write(rig: Rig) -> None:
    rig.rival.commit(KEY, CODEC, Add("x"))
    command = AtLeast("x", 1)

    assert rig.docs.commit(KEY, CODEC, command) == 1
    assert command.seen == [1]
    assert rig.calls == {"get": 1}
    assert rig.docs.stats == Stats(reads=1)
    assert rig.events == []


def test_nothing_to_write_on_the_cached_version_is_checked_on_a_fresh_read(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x", 2))
    rig.rival.commit(KEY, CODEC, Take("x", 2))
    rig.forget_calls()
    command = AtLeast("x", 1)

    assert rig.docs.commit(KEY, CODEC, command) == 1
    assert command.seen == [1, 2]
    assert rig.calls == {"get": 1, "put": 1}
    assert rig.peek() == Tally({"x": 1}, when(3), 3, (cid(1, 1), rival_id(1), cid(2, 1)))
    assert rig.events[1:] == [
        event(cid(2, 1), 3, 3, moved("x", 0, 1), command="at_least", actor="cat")
    ]


def test_nothing_to_write_that_still_holds_on_a_fresh_read_is_returned(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x", 2))
    rig.forget_calls()
    command = AtLeast("x", 1)

    assert rig.docs.commit(KEY, CODEC, command) == 2
    assert command.seen == [1, 1]
    assert rig.calls == {"get": 1}
    assert rig.docs.stats == Stats(commits=1, reads=2, not_modified=1)
    assert rig.events[1:] == []


def test_a_corrupt_object_is_refused_and_left_as_it_is(rig: Rig) -> None:
    MemoryStore(rig.store.bucket, "p").put(KEY, b"{not json")

    where = rig.store.describe(KEY)  # the full address, and what to do about it
    with pytest.raises(
        CorruptShard, match=re.escape(f"manifest object {where} is corrupt")
    ) as caught:
        rig.docs.commit(KEY, CODEC, Add("x"))
    assert (caught.value.key, caught.value.address) == (KEY, where)
    assert str(caught.value).endswith("otherwise write the tally again.")
    assert rig.calls == {"get": 1}
    assert MemoryStore(rig.store.bucket, "p").open(KEY).read() == b"{not json"


# -- replacing a corrupt version (repair's ``over=``) ----------------------------------------


def corrupt(rig: Rig, body: bytes = b"{broken") -> str:
    """Put bytes that do not parse behind every cache; their ETag."""
    MemoryStore(rig.store.bucket, "p").put(KEY, body)
    return rig.etag()


def test_a_commit_over_a_corrupt_version_drops_the_cache_and_sees_an_empty_object(
    rig: Rig,
) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))  # cached, then damaged behind the cache
    damaged = corrupt(rig)
    rig.forget_calls()
    command = Add("y", 2)

    assert rig.docs.commit(KEY, CODEC, command, over=damaged) == 2
    assert command.seen == [0]  # never the cached version
    assert rig.calls == {"get": 1, "put": 1}
    assert rig.store.puts == [Put(KEY, PutMode.update(damaged), "application/json")]
    assert rig.docs.stats == Stats(commits=2, reads=2)  # one for the first commit
    assert rig.peek() == Tally({"y": 2}, when(2), 1, (cid(2, 1),))
    assert rig.events[1:] == [event(cid(2, 1), 2, 1, moved("y", None, 2))]


def test_a_lost_answer_over_a_corrupt_version_that_did_not_land_is_retried_over_it(
    rig: Rig,
) -> None:
    damaged = corrupt(rig)

    def lost() -> None:
        raise OutcomeUnknown("the connection broke before the request was sent")

    rig.before("put", lost)
    command = Add("y")

    assert rig.docs.commit(KEY, CODEC, command, over=damaged) == 1
    assert command.seen == [0, 0]
    assert rig.calls == {"get": 2, "put": 1}
    assert rig.store.puts == [Put(KEY, PutMode.update(damaged), "application/json")] * 2
    assert rig.sleeps == []
    assert rig.docs.stats == Stats(commits=1, reads=2, lost_responses=1)
    assert rig.peek() == Tally({"y": 1}, when(2), 1, (cid(1, 2),))


def test_a_409_over_a_corrupt_version_that_is_still_there_is_retried_over_it(rig: Rig) -> None:
    """S3 answers 409 ConditionalRequestConflict to a conditional write that met another in
    flight: nothing landed, the corrupt version is still there and may still be replaced."""
    damaged = corrupt(rig)

    def conflict() -> None:
        raise PreconditionFailed("409 ConditionalRequestConflict")

    rig.before("put", conflict)
    command = Add("y")

    assert rig.docs.commit(KEY, CODEC, command, over=damaged) == 1
    assert command.seen == [0, 0]
    assert rig.calls == {"get": 2, "put": 1}
    assert rig.sleeps == [backoff(1)]
    assert rig.docs.stats == Stats(commits=1, conflicts=1, reads=2)
    assert rig.peek() == Tally({"y": 1}, when(2), 1, (cid(1, 2),))


def test_a_commit_over_a_corrupt_version_rereads_in_full_after_every_lost_race(
    rig: Rig,
) -> None:
    """Another repair replaced the corrupt version first, then a 409: each re-read of a
    commit over a corrupt version is a full GET (none is answered from the cache)."""
    damaged = corrupt(rig)
    plan = iter(["rival", "409"])

    def hook() -> None:
        if next(plan) == "rival":
            rig.rival.commit(KEY, CODEC, Add("x", actor="rex"), over=damaged)
        else:
            raise PreconditionFailed("409 ConditionalRequestConflict")

    rig.before("put", hook, times=2)
    command = Add("y")

    assert rig.docs.commit(KEY, CODEC, command, over=damaged) == 1
    assert command.seen == [0, 1, 1]
    assert rig.calls == {"get": 3, "put": 2}
    assert rig.sleeps == [backoff(1), backoff(2)]
    assert rig.docs.stats == Stats(commits=1, conflicts=2, reads=3)
    assert rig.peek() == Tally({"x": 1, "y": 1}, when(3), 2, (rival_id(1), cid(1, 3)))


class NewerTallyCodec(TallyCodec):
    """A tally written by a newer objmanifest."""

    def decode(self, key: str, body: bytes) -> Tally:
        raise UnsupportedSchema(key, 9, 1)


def test_an_object_of_a_newer_schema_is_refused_by_its_full_address(rig: Rig) -> None:
    MemoryStore(rig.store.bucket, "p").put(KEY, b'{"schema_version": 9}')
    where = rig.store.describe(KEY)
    with pytest.raises(
        UnsupportedSchema, match=re.escape(f"{where} has schema_version 9")
    ) as caught:
        rig.docs.commit(KEY, NewerTallyCodec(), Add("x"))
    assert (caught.value.key, caught.value.address, caught.value.version) == (KEY, where, 9)
    assert MemoryStore(rig.store.bucket, "p").open(KEY).read() == b'{"schema_version": 9}'


# -- reads and the cache --------------------------------------------------------------------


def test_a_read_of_an_unchanged_object_is_a_304_that_returns_the_cached_doc(rig: Rig) -> None:
    rig.rival.commit(KEY, CODEC, Add("x"))
    first = rig.docs.read(KEY, CODEC)
    assert first == Tally({"x": 1}, when(-1), 1, (rival_id(1),))

    assert rig.docs.read(KEY, CODEC) is first
    assert rig.docs.stats == Stats(reads=2, not_modified=1)
    assert rig.docs.read(KEY, CODEC) is first
    assert rig.docs.stats == Stats(reads=3, not_modified=2)

    rig.rival.commit(KEY, CODEC, Add("x"))
    second = rig.docs.read(KEY, CODEC)
    assert second == Tally({"x": 2}, when(-1), 2, (rival_id(1), rival_id(2)))
    assert rig.docs.stats == Stats(reads=4, not_modified=2)
    assert rig.calls == {"get": 4}


def test_cached_reads_only_when_nothing_is_cached(rig: Rig) -> None:
    rig.rival.commit(KEY, CODEC, Add("x"))
    first = rig.docs.cached(KEY, CODEC)
    assert first == Tally({"x": 1}, when(-1), 1, (rival_id(1),))
    rig.rival.commit(KEY, CODEC, Add("x"))

    assert rig.docs.cached(KEY, CODEC) is first
    assert rig.calls == {"get": 1}
    assert rig.docs.stats == Stats(reads=1)


def test_an_object_deleted_behind_the_cache_reads_as_empty(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))
    MemoryStore(rig.store.bucket, "p").delete(KEY)

    assert rig.docs.read(KEY, CODEC) == Tally()
    rig.forget_calls()
    assert rig.docs.cached(KEY, CODEC) == Tally()
    assert rig.calls == {"get": 1}  # nothing was cached: cached() had to read
    assert rig.docs.stats == Stats(commits=1, reads=3)

    assert rig.docs.commit(KEY, CODEC, Add("y")) == 1
    assert [p.mode for p in rig.store.puts] == [CREATE]
    assert rig.peek() == Tally({"y": 1}, when(2), 1, (cid(2, 1),))
    assert rig.events[1:] == [event(cid(2, 1), 2, 1, moved("y", None, 1))]


def test_a_commit_on_the_cache_of_a_deleted_object_creates_it_again(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))
    MemoryStore(rig.store.bucket, "p").delete(KEY)
    rig.forget_calls()

    assert rig.docs.commit(KEY, CODEC, Add("x")) == 1
    assert [p.mode.kind for p in rig.store.puts] == ["update", "create"]
    assert rig.calls == {"put": 2, "get": 1}
    assert rig.sleeps == []
    assert rig.peek() == Tally({"x": 1}, when(3), 1, (cid(2, 2),))


def test_forget_drops_the_cached_version_of_one_key_only(rig: Rig) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.docs.commit(OTHER, CODEC, Add("x"))
    rig.docs.forget(KEY)
    rig.forget_calls()

    rig.docs.commit(OTHER, CODEC, Add("x"))
    assert rig.calls == {"put": 1}
    rig.docs.commit(KEY, CODEC, Add("x"))
    assert rig.calls == {"put": 2, "get": 1}
    assert rig.docs.stats.not_modified == 0


def test_forgetting_a_key_that_is_not_cached_does_nothing(rig: Rig) -> None:
    rig.docs.forget(KEY)
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.docs.forget(KEY)
    rig.docs.forget(KEY)
    assert rig.calls == {"get": 1, "put": 1}
    assert rig.docs.read(KEY, CODEC) == Tally({"x": 1}, when(1), 1, (cid(1, 1),))
    assert rig.docs.stats == Stats(commits=1, reads=2)


def test_a_detached_view_shares_store_policy_stats_and_observers_not_the_cache(
    rig: Rig,
) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))
    view = rig.docs.detached()
    assert view.store is rig.docs.store
    assert view.policy is rig.docs.policy
    assert view.stats is rig.docs.stats
    assert view.observers is rig.docs.observers
    rig.forget_calls()

    assert view.commit(KEY, CODEC, Add("x")) == 2  # its own, empty cache: it reads first
    assert rig.calls == {"get": 1, "put": 1}
    assert rig.events[1:] == [event(cid(2, 1), 2, 2, moved("x", 1, 2))]
    assert rig.docs.stats == Stats(commits=2, reads=2)

    assert rig.docs.commit(KEY, CODEC, Add("x")) == 3  # ours is stale now: a lost race
    assert rig.docs.stats == Stats(commits=3, conflicts=1, reads=3)
    assert rig.sleeps == []


# -- observers ------------------------------------------------------------------------------


def test_an_observer_that_raises_neither_undoes_nor_fails_the_commit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = make_rig()
    seen: list[CommitEvent] = []

    def broken(event: CommitEvent) -> None:
        raise RuntimeError("observer broke")

    rig.docs.observers.subscribe(broken)
    rig.docs.observers.subscribe(seen.append)
    caplog.set_level(logging.ERROR, logger="objmanifest.core.commit_events")

    assert rig.docs.commit(KEY, CODEC, Add("x")) == 1
    assert rig.peek() == Tally({"x": 1}, when(1), 1, (cid(1, 1),))
    assert seen == rig.events == [event(cid(1, 1), 1, 1, moved("x", None, 1))]
    assert [r.getMessage() for r in caplog.records] == [f"an observer of {KEY} failed on add"]
    rig.forget_calls()
    assert rig.docs.commit(KEY, CODEC, Add("x")) == 2  # the cache holds the landed version
    assert rig.calls == {"put": 1}


# -- locks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("call", ["read", "cached", "forget", "commit other"])
def test_a_write_in_flight_holds_back_a_forget_of_its_key_only(rig: Rig, call: str) -> None:
    """While a commit of KEY is stalled in its PUT, a forget of KEY waits for it to finish;
    a read or cached read of KEY returns the version before it at once, and a commit of
    another key does not wait at all."""
    rig.docs.commit(KEY, CODEC, Add("x"))
    stalled, release = threading.Event(), threading.Event()

    def stall(name: str, key: str) -> None:
        if name == "put" and key == KEY and threading.current_thread().name == "slow":
            stalled.set()
            release.wait(60)

    rig.store.faults.hooks.append(stall)
    slow = threading.Thread(target=rig.docs.commit, args=(KEY, CODEC, Add("x")), name="slow")
    got: list[Any] = []
    actions: dict[str, Callable[[], Any]] = {
        "read": lambda: rig.docs.read(KEY, CODEC),
        "cached": lambda: rig.docs.cached(KEY, CODEC),
        "forget": lambda: rig.docs.forget(KEY),
        "commit other": lambda: rig.docs.commit(OTHER, CODEC, Add("y")),
    }
    other = threading.Thread(target=lambda: got.append(actions[call]()))
    try:
        slow.start()
        assert stalled.wait(WAIT)
        other.start()
        other.join(0.2 if call == "forget" else WAIT)
        assert other.is_alive() is (call == "forget")
        if call in ("read", "cached"):
            assert got == [Tally({"x": 1}, when(1), 1, (cid(1, 1),))]
    finally:
        release.set()
        slow.join(WAIT)
        other.join(WAIT)
    assert not slow.is_alive() and not other.is_alive()
    rig.forget_calls()
    rig.docs.commit(KEY, CODEC, Add("x"))
    assert rig.calls == ({"get": 1, "put": 1} if call == "forget" else {"put": 1})


# -- backoff --------------------------------------------------------------------------------


def test_the_default_policy() -> None:
    assert CasPolicy() == CasPolicy(max_attempts=100, base_delay=0.01, max_delay=1.0)


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        ("max_attempts", 0),
        ("max_attempts", -3),
        ("max_attempts", 2.5),
        ("max_attempts", True),
        ("max_attempts", "5"),
        ("max_group", 0),
        ("max_group", GROUP_MAX + 1),
        ("max_group", 1.0),
        ("base_delay", -0.01),
        ("max_delay", math.inf),
        ("fresh_seconds", math.nan),
        ("fresh_seconds", -1),
        ("contended_seconds", -0.1),
        ("contended_seconds", True),
        ("base_delay", "0.1"),
    ],
)
def test_a_policy_with_a_bad_number_is_refused_naming_the_field(
    field_name: str, value: object
) -> None:
    with pytest.raises(
        InvalidInput, match=rf"^CasPolicy\.{field_name} must be .*{re.escape(repr(value))}"
    ):
        CasPolicy(**{field_name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_attempts": 1},
        {"max_group": 1},
        {"max_group": GROUP_MAX},
        {"base_delay": 0, "max_delay": 0},
        {"fresh_seconds": 0.0, "contended_seconds": 0},
        {"base_delay": 2.0, "max_delay": 0.5},
    ],
)
def test_edge_values_of_a_policy_are_accepted(overrides: dict[str, float]) -> None:
    policy = CasPolicy(**overrides)  # type: ignore[arg-type]
    assert all(getattr(policy, name) == value for name, value in overrides.items())


@pytest.mark.parametrize(
    ("attempt", "rand", "pause"),
    [
        (0, 1.0, 1.0),
        (1, 1.0, 2.0),
        (3, 1.0, 8.0),
        (3, 0.25, 2.0),
        (3, 0.0, 0.0),
        (15, 1.0, 32768.0),
        (16, 1.0, 65536.0),
        (17, 1.0, 65536.0),
        (1000, 0.5, 32768.0),
    ],
)
def test_backoff_doubles_with_each_attempt_up_to_attempt_16(
    attempt: int, rand: float, pause: float
) -> None:
    assert CasPolicy(base_delay=1.0, max_delay=1e9).backoff(attempt, rand) == pause


@pytest.mark.parametrize(
    ("attempt", "rand", "pause"),
    [(1, 0.5, 0.01), (6, 1.0, 0.64), (7, 1.0, 1.0), (7, 0.5, 0.5), (40, 0.25, 0.25)],
)
def test_backoff_is_capped_by_max_delay(attempt: int, rand: float, pause: float) -> None:
    assert CasPolicy().backoff(attempt, rand) == pytest.approx(pause, rel=1e-12)


def test_backoff_stays_between_zero_and_its_cap() -> None:
    policy = CasPolicy(base_delay=0.01, max_delay=0.3)
    for attempt in range(40):
        cap = min(0.3, 0.01 * 2 ** min(attempt, 16))
        for rand in (0.0, 0.1, 0.5, 0.999):
            assert 0.0 <= policy.backoff(attempt, rand) <= cap
            assert policy.backoff(attempt, rand) == pytest.approx(rand * cap, rel=1e-12)


def test_peek_is_the_cached_version_without_a_request(rig: Rig) -> None:
    assert rig.docs.peek(KEY) is None
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.forget_calls()
    assert rig.docs.peek(KEY) == rig.peek()
    assert rig.docs.peek("other") is None
    assert rig.calls == {}
