"""Group commits: commits of one object from threads of one process, queued behind a write
in flight, go out together in the next conditional PUT (``cas.Documents.commit``).

The rig is the one of ``test_cas.py`` (a tally on ``MemoryStore``, numbered ids, a clock
one second later at each reading, a rival writer with its own cache). ``Group`` holds a
commit's PUT in flight (its thread is called "leader") and starts each further commit in a
thread of its own, waiting until it is queued before the next one starts, so the members of
the next write queue in a known order. Then the write is let go, and each test states which
calls reached the store, what each caller got, which thread published which event, and what
the object holds.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import pytest

from objmanifest.cas.loop import Documents, _Lane, _Member
from objmanifest.cas.policy import GROUP_MAX, CasPolicy, Stats
from objmanifest.core.commit_events import CommitEvent
from objmanifest.errors import ConflictRetriesExhausted, StoreError
from objmanifest.store import MemoryStore
from objmanifest.store.errors import OutcomeUnknown

from ..make import at
from .test_cas import (
    CODEC,
    KEY,
    OTHER,
    WAIT,
    Add,
    AtLeast,
    NotEnough,
    Rig,
    Take,
    Tally,
    TallyCodec,
    backoff,
    cid,
    corrupt,
    event,
    make_rig,
    moved,
    rival_id,
    when,
)


@pytest.fixture
def rig() -> Rig:
    return make_rig()


def until(condition: Callable[[], bool]) -> None:
    """Wait (at most ``WAIT`` seconds) until ``condition`` holds."""
    for _ in range(int(WAIT * 1000)):
        if condition():
            return
        time.sleep(0.001)
    raise AssertionError("gave up waiting")


class Group:
    """A write held in flight, and the commits queued behind it, each in its own thread."""

    def __init__(self, rig: Rig, key: str = KEY) -> None:
        self.rig, self.key = rig, key
        self.lane = rig.docs._lane(key)
        self.stalled, self.released = threading.Event(), threading.Event()
        self.threads: list[threading.Thread] = []
        self.outcomes: dict[int, Any] = {}
        self.published: list[tuple[str, CommitEvent]] = []
        rig.docs.observers.subscribe(
            lambda e: self.published.append((threading.current_thread().name, e))
        )

        def stall(name: str, key: str) -> None:
            leader = threading.current_thread().name == "leader"
            if name == "put" and key == self.key and leader and not self.stalled.is_set():
                self.stalled.set()
                assert self.released.wait(60)

        rig.store.faults.hooks.append(stall)

    def _start(self, name: str, call: Callable[[], Any]) -> None:
        n = len(self.threads)

        def run() -> None:
            try:
                self.outcomes[n] = call()
            except BaseException as e:
                self.outcomes[n] = e

        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def hold(self, command: Any, codec: Any = CODEC) -> None:
        """Start a commit whose PUT stalls until ``go``."""
        self._start("leader", lambda: self.rig.docs.commit(self.key, codec, command))
        assert self.stalled.wait(WAIT)

    def queue(self, command: Any, codec: Any = CODEC, over: str | None = None) -> None:
        """Start a commit and return once it is queued behind the write in flight."""
        before = len(self.lane.queue)
        name = f"m{len(self.threads)}"
        self._start(name, lambda: self.rig.docs.commit(self.key, codec, command, over=over))
        until(lambda: len(self.lane.queue) == before + 1)

    def go(self) -> list[Any]:
        """Let the write finish; every caller's result or exception, in the order started."""
        self.released.set()
        for thread in self.threads:
            thread.join(WAIT)
        assert not any(t.is_alive() for t in self.threads)
        return [self.outcomes[n] for n in range(len(self.threads))]

    def events(self) -> list[tuple[str, CommitEvent]]:
        """(the thread that published it, the event) of each event, by version."""
        return sorted(self.published, key=lambda p: p[1].version or 0)


def warm(rig: Rig) -> Group:
    """The tally holds x=1 (version 1, cached); then a group rig with nothing counted yet."""
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.forget_calls()
    rig.events.clear()
    return Group(rig)


def on_put(rig: Rig, number: int, action: Callable[[], None]) -> None:
    """Run ``action`` just before our store's ``number``-th PUT of KEY from now on (a write
    held in flight is past its hooks already)."""
    seen = [0]

    def hook(name: str, key: str) -> None:
        if name == "put" and key == KEY:
            seen[0] += 1
            if seen[0] == number:
                action()

    rig.store.faults.hooks.append(hook)


# -- one write for the commits queued behind another ---------------------------------------


def test_commits_queued_behind_a_write_go_out_together_in_the_next_put(rig: Rig) -> None:
    g = warm(rig)
    g.hold(Add("x"))
    members = [Add("x", 2, actor="a1"), Add("y", actor="a2"), Add("x", 3, actor="a3")]
    for command in members:
        g.queue(command)

    assert g.go() == [2, 4, 1, 7]
    assert rig.calls == {"put": 2}  # the group is tried on the version the leader wrote
    assert [m.seen for m in members] == [[2], [3], [4]]  # each on the one before's result
    assert rig.peek() == Tally({"x": 7, "y": 1}, when(3), 5, (cid(1, 1), cid(2, 1), cid(3, 1)))
    assert g.events() == [
        ("leader", event(cid(2, 1), 2, 2, moved("x", 1, 2))),
        ("m1", event(cid(3, 1), 3, 3, moved("x", 2, 4), actor="a1")),
        ("m2", event(cid(3, 1), 3, 4, moved("y", None, 1), actor="a2")),
        ("m3", event(cid(3, 1), 3, 5, moved("x", 4, 7), actor="a3")),
    ]
    assert rig.docs.stats == Stats(commits=5, grouped=2, reads=1)
    assert rig.docs.stats.writes == 3
    rig.forget_calls()
    assert rig.docs.commit(KEY, CODEC, Add("y")) == 2  # the group's version is cached
    assert rig.calls == {"put": 1}


def test_a_refused_member_is_left_out_and_the_others_land(rig: Rig) -> None:
    """The refusal was decided on the cached version, and believed without a re-read: the
    write conditional on that version landed, so it was current."""
    g = warm(rig)
    g.hold(Add("x"))
    take, floor, add = Take("x", 10), AtLeast("x", 1), Add("y")
    for command in (Add("x", actor="a1"), take, floor, add):
        g.queue(command)

    leader, first, refused, nothing, last = g.go()
    assert (leader, first, nothing, last) == (2, 3, 3, 1)
    assert isinstance(refused, NotEnough) and str(refused) == "x holds 3, fewer than 10"
    assert [take.seen, floor.seen, add.seen] == [[3], [3], [3]]
    assert rig.calls == {"put": 2}
    assert rig.peek() == Tally({"x": 3, "y": 1}, when(3), 4, (cid(1, 1), cid(2, 1), cid(3, 1)))
    assert [(name, e.version, e.actor) for name, e in g.events()] == [
        ("leader", 2, "ann"),
        ("m1", 3, "a1"),
        ("m4", 4, "ann"),
    ]
    assert rig.docs.stats == Stats(commits=4, grouped=1, reads=1)


def test_a_broken_command_fails_its_own_caller_only(rig: Rig) -> None:
    @dataclass(frozen=True)
    class Broken:
        name: str = "broken"
        actor: str = "bug"
        seen: list[int] = field(default_factory=list)

        def apply(self, doc: Tally, now: datetime) -> tuple[Tally | None, int]:
            self.seen.append(doc.version)
            raise RuntimeError("a bug in a command")

    g = warm(rig)
    g.hold(Add("x"))
    broken = Broken()
    g.queue(broken)
    g.queue(Add("y"))

    leader, failed, added = g.go()
    assert (leader, added) == (2, 1)
    assert isinstance(failed, RuntimeError) and str(failed) == "a bug in a command"
    assert broken.seen == [2]
    assert rig.peek() == Tally({"x": 2, "y": 1}, when(3), 3, (cid(1, 1), cid(2, 1), cid(3, 1)))


@pytest.mark.parametrize("rival", [False, True])
def test_refusals_and_nothing_to_write_on_the_cached_version_are_checked_on_a_fresh_read(
    rig: Rig, rival: bool
) -> None:
    """Nobody in the group writes on the version in the cache: it is read again (a 304 when
    nothing changed) and every member applied again on what it holds, before any refusal or
    "nothing to write" is believed."""
    g = warm(rig)
    g.hold(Add("x"))
    if rival:  # another writer adds behind our cache just before it is read again
        rig.before("get", lambda: rig.rival.commit(KEY, CODEC, Add("x", 20, actor="rex")))
    take, floor = Take("x", 10), AtLeast("x", 2)
    g.queue(take)
    g.queue(floor)

    leader, taken, floored = g.go()
    assert leader == 2
    if rival:
        assert (taken, floored) == (12, 12)
        assert [take.seen, floor.seen] == [[2, 3], [2, 4]]
        assert rig.calls == {"put": 2, "get": 1}
        assert rig.peek() == Tally(
            {"x": 12}, when(4), 4, (cid(1, 1), cid(2, 1), rival_id(1), cid(3, 1))
        )
        assert rig.docs.stats == Stats(commits=3, reads=2)
    else:
        assert isinstance(taken, NotEnough) and str(taken) == "x holds 2, fewer than 10"
        assert floored == 2
        assert [take.seen, floor.seen] == [[2, 2], [2, 2]]
        assert rig.calls == {"put": 1, "get": 1}
        assert rig.docs.stats == Stats(commits=2, reads=2, not_modified=1)
    assert rig.sleeps == []


# -- lost races and lost answers of a group -----------------------------------------------


def test_a_group_that_loses_a_race_rereads_and_applies_every_member_again(rig: Rig) -> None:
    """The first loss was on the cached version (no sleep), the second after a fresh read
    (the backoff of attempt 2); each member is applied once per attempt, and lands once."""
    g = warm(rig)
    g.hold(Add("x"))
    on_put(rig, 1, rig.rival_adds("x"))
    on_put(rig, 2, rig.rival_adds("z"))
    members = [Add("x", 10, actor="a1"), Take("x", 2), Add("y", actor="a2")]
    for command in members:
        g.queue(command)

    assert g.go() == [2, 13, 11, 1]
    assert [m.seen for m in members] == [[2, 3, 4], [3, 4, 5], [4, 5, 6]]
    assert rig.calls == {"put": 4, "get": 2}
    assert rig.sleeps == [backoff(2)]
    assert rig.peek() == Tally(
        {"x": 11, "y": 1, "z": 1},
        when(5),
        7,
        (cid(2, 1), rival_id(1), rival_id(2), cid(3, 3)),
    )
    assert [(name, e.commit_id, e.version) for name, e in g.events()] == [
        ("leader", cid(2, 1), 2),
        ("m1", cid(3, 3), 5),
        ("m2", cid(3, 3), 6),
        ("m3", cid(3, 3), 7),
    ]
    assert rig.docs.stats == Stats(commits=5, grouped=2, conflicts=2, reads=3)


def test_a_group_whose_answer_was_lost_is_recognised_and_never_applied_twice(rig: Rig) -> None:
    g = warm(rig)
    g.hold(Add("x"))
    on_put(rig, 1, lambda: rig.store.faults.add("put", key=KEY, effect="lose"))
    rig.before("get", rig.rival_adds("z"))  # someone commits on top before the re-read
    take = Take("x", 10)
    members = [Add("x", actor="a1"), take, Add("y", actor="a2")]
    for command in members:
        g.queue(command)

    leader, first, refused, last = g.go()
    assert (leader, first, last) == (2, 3, 1)
    assert isinstance(refused, NotEnough)  # decided in the write that landed
    assert [m.seen for m in members] == [[2], [3], [3]]
    assert rig.calls == {"put": 2, "get": 1}
    assert rig.peek() == Tally(
        {"x": 3, "y": 1, "z": 1}, when(-1), 5, (cid(1, 1), cid(2, 1), cid(3, 1), rival_id(1))
    )
    assert [(name, e.commit_id, e.version, e.at) for name, e in g.events()] == [
        ("leader", cid(2, 1), 2, at(2)),
        ("m1", cid(3, 1), 3, at(3)),
        ("m3", cid(3, 1), 4, at(3)),
    ]
    assert rig.docs.stats == Stats(commits=4, grouped=1, reads=2, lost_responses=1)


def test_a_group_whose_answer_was_lost_before_it_landed_is_sent_again(rig: Rig) -> None:
    g = warm(rig)
    g.hold(Add("x"))

    def lost() -> None:
        raise OutcomeUnknown("the connection broke before the request was sent")

    on_put(rig, 1, lost)
    members = [Add("x", actor="a1"), Add("y", actor="a2")]
    for command in members:
        g.queue(command)

    assert g.go() == [2, 3, 1]
    assert [m.seen for m in members] == [[2, 2], [3, 3]]
    assert rig.calls == {"put": 2, "get": 1}
    assert rig.sleeps == []
    assert rig.peek() == Tally({"x": 3, "y": 1}, when(4), 4, (cid(1, 1), cid(2, 1), cid(3, 2)))
    assert rig.docs.stats == Stats(commits=4, grouped=1, reads=2, not_modified=1, lost_responses=1)


def test_a_store_error_fails_every_member_and_the_next_commit_lands(rig: Rig) -> None:
    g = warm(rig)
    g.hold(Add("x"))
    on_put(rig, 1, lambda: rig.store.faults.add("put", key=KEY, effect="fail"))
    g.queue(Add("x"))
    g.queue(Add("y"))

    leader, *failed = g.go()
    assert leader == 2
    assert [type(e) for e in failed] == [StoreError, StoreError]
    assert failed[0] is failed[1]
    assert rig.peek() == Tally({"x": 2}, when(2), 2, (cid(1, 1), cid(2, 1)))
    assert [name for name, _ in g.events()] == ["leader"]
    assert rig.docs.commit(KEY, CODEC, Add("y")) == 1


def test_a_group_that_runs_out_of_attempts_fails_every_member() -> None:
    rig = make_rig(CasPolicy(max_attempts=1))
    g = warm(rig)
    g.hold(Add("x"))
    on_put(rig, 1, rig.rival_adds("z"))
    g.queue(Add("x"))
    g.queue(Add("y"))

    leader, *failed = g.go()
    assert leader == 2
    assert [type(e) for e in failed] == [ConflictRetriesExhausted] * 2
    stored = rig.peek()
    assert stored is not None and stored.counts == {"x": 2, "z": 1}


class Interrupted(BaseException):
    """Not an ``Exception``: as ``KeyboardInterrupt``."""


@dataclass(frozen=True)
class Interrupts:
    name: str = "interrupts"
    actor: str = "ann"

    def apply(self, doc: Tally, now: datetime) -> tuple[Tally | None, int]:
        raise Interrupted()


def test_an_interrupt_in_a_write_reaches_every_member_and_frees_the_object(rig: Rig) -> None:
    g = warm(rig)
    g.hold(Add("x"))
    g.queue(Add("x"))
    g.queue(Interrupts())
    g.queue(Add("y"))

    leader, *interrupted = g.go()
    assert leader == 2
    assert [type(e) for e in interrupted] == [Interrupted] * 3
    assert rig.calls == {"put": 1}
    rig.forget_calls()
    assert rig.docs.commit(KEY, CODEC, Add("y")) == 1
    assert rig.calls == {"put": 1}


def test_a_caller_interrupted_while_queued_is_never_applied(rig: Rig) -> None:
    """The main thread waits behind a stalled write; a signal interrupts it there: its
    command leaves the queue, and the next write carries the others only."""
    g = warm(rig)
    g.hold(Add("x"))
    g.queue(Add("y"))
    main = threading.main_thread().ident
    assert main is not None and threading.current_thread().ident == main

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted()

    def send() -> None:
        until(lambda: len(g.lane.queue) == 2)
        signal.pthread_kill(main, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    sender = threading.Thread(target=send, daemon=True)
    try:
        sender.start()
        with pytest.raises(Interrupted):
            rig.docs.commit(KEY, CODEC, Add("z"))
    finally:
        sender.join(WAIT)
        signal.signal(signal.SIGUSR1, previous)
    assert [m.command for m in g.lane.queue] == [Add("y")]

    assert g.go() == [2, 1]
    assert rig.peek() == Tally({"x": 2, "y": 1}, when(3), 3, (cid(1, 1), cid(2, 1), cid(3, 1)))


# -- what goes together, and what does not ------------------------------------------------


def test_a_write_carries_at_most_max_group_commands() -> None:
    rig = make_rig(CasPolicy(max_group=2))
    g = warm(rig)
    g.hold(Add("x"))
    for item in ("a", "b", "c"):
        g.queue(Add(item))

    assert g.go() == [2, 1, 1, 1]
    assert rig.calls == {"put": 3}
    stored = rig.peek()
    assert stored is not None and stored.counts == {"x": 2, "a": 1, "b": 1, "c": 1}
    assert stored.version == 5 and len(stored.commits) == 4
    assert rig.docs.stats == Stats(commits=5, grouped=1, reads=1)


def test_the_default_group_bound() -> None:
    assert GROUP_MAX == 256
    assert CasPolicy().max_group == GROUP_MAX
    assert Documents(make_rig().store)._lane(KEY).max_group == GROUP_MAX
    docs = Documents(make_rig().store, CasPolicy(max_group=3))
    assert docs._lane(KEY).max_group == 3
    assert docs._lane(KEY) is docs._lane(KEY)
    assert docs._lane(OTHER) is not docs._lane(KEY)


def test_commits_of_another_codec_or_over_a_corrupt_version_go_alone(rig: Rig) -> None:
    g = warm(rig)
    g.hold(Add("x"))
    g.queue(Add("a"))
    g.queue(Add("b"), codec=TallyCodec())  # another codec: another write
    g.queue(Add("c"), over='"not-this"')  # a repair's commit: alone, after a full read
    g.queue(Add("d"))

    assert g.go() == [2, 1, 1, 1, 1]
    assert rig.calls == {"put": 4, "get": 1}
    stored = rig.peek()
    assert stored is not None and stored.counts == {"x": 2, "a": 1, "b": 1, "c": 1, "d": 1}
    assert rig.docs.stats == Stats(commits=6, grouped=1, reads=2)
    by_version = [e for _, e in g.events()]
    a, d = (next(e for e in by_version if e.transitions[0].item == i) for i in "ad")
    assert (a.commit_id, d.version) == (d.commit_id, a.version + 1)


def test_a_commit_over_a_version_repaired_meanwhile_leaves_the_repaired_one_cached(
    rig: Rig,
) -> None:
    """Another repair replaced the corrupt version first: ours has nothing to write, and the
    version it read in full (not the one cached before the damage) is the one cached."""
    rig.docs.commit(KEY, CODEC, Add("x"))
    damaged = corrupt(rig)
    rig.rival.commit(KEY, CODEC, Add("y", actor="rex"), over=damaged)

    assert rig.docs.commit(KEY, CODEC, AtLeast("y", 1), over=damaged) == 1
    rig.forget_calls()
    assert rig.docs.commit(KEY, CODEC, Add("z")) == 1
    assert rig.calls == {"put": 1}
    assert rig.peek() == Tally({"y": 1, "z": 1}, when(3), 2, (rival_id(1), cid(3, 1)))


def test_a_commit_over_a_corrupt_version_reads_afresh_whatever_was_cached_meanwhile(
    rig: Rig,
) -> None:
    """A read (of another thread: reads do not wait for writes) caches a version just as
    the commit starts; the commit still begins with a full read of its own."""
    damaged = corrupt(rig)
    rig.rival.commit(KEY, CODEC, Add("y", actor="rex"), over=damaged)  # repaired meanwhile
    ids = rig.store.runtime.new_id

    def new_id() -> str:
        rig.docs.read(KEY, CODEC)
        return ids()

    rig.store.runtime = replace(rig.store.runtime, new_id=new_id)
    rig.forget_calls()
    assert rig.docs.commit(KEY, CODEC, Add("y"), over=damaged) == 2
    assert rig.calls == {"get": 2, "put": 1}
    assert rig.docs.stats == Stats(commits=1, reads=2)


def test_a_commit_from_within_the_write_in_flight_goes_alone_first(rig: Rig) -> None:
    """A store call of the write (here a hook of the store) commits to the same object from
    the writing thread: it does not wait for itself; the outer write then loses the race
    and applies its change again on the inner one's result."""
    rig.docs.commit(KEY, CODEC, Add("x"))
    rig.forget_calls()
    inner_got: list[int] = []
    rig.before("put", lambda: inner_got.append(rig.docs.commit(KEY, CODEC, Add("y"))))
    outer = Add("x")
    got: list[int] = []
    thread = threading.Thread(
        target=lambda: got.append(rig.docs.commit(KEY, CODEC, outer)), daemon=True
    )
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive()

    assert (inner_got, got) == ([1], [2])
    assert outer.seen == [1, 2]
    assert rig.calls == {"put": 3, "get": 1}
    assert rig.peek() == Tally({"x": 2, "y": 1}, when(4), 3, (cid(1, 1), cid(3, 1), cid(2, 2)))
    assert [e.commit_id for e in rig.events] == [cid(1, 1), cid(3, 1), cid(2, 2)]


# -- the queue itself ---------------------------------------------------------------------


def members(*names: str, codec: Any = CODEC, over: str | None = None) -> list[_Member[Any, Any]]:
    return [_Member(Add(n), codec, over) for n in names]


def test_a_leader_takes_its_own_and_the_queued_of_its_codec_in_order() -> None:
    lane = _Lane(max_group=3)
    a, b = members("a", "b")
    (odd,) = members("odd", codec=TallyCodec())
    (fix,) = members("fix", over='"e"')
    c, d = members("c", "d")
    for m in (a, odd, b, fix, c, d):
        lane.join(m)

    assert lane.lead(b) == [a, b, c]
    assert lane.leader == threading.get_ident()
    assert lane.queue == [odd, fix, d]
    lane.release()
    assert lane.leader is None
    assert lane.lead(fix) == [fix]
    assert lane.queue == [odd, d]
    lane.release()
    assert lane.lead(odd) == [odd]
    lane.release()
    assert lane.lead(d) == [d]
    assert lane.queue == []


def test_a_leader_beyond_the_bound_goes_with_those_before_it() -> None:
    lane = _Lane(max_group=3)
    a, b, c, d, e = members("a", "b", "c", "d", "e")
    for m in (a, b, c, d, e):
        lane.join(m)
    assert lane.lead(e) == [a, b, e]
    assert lane.queue == [c, d]


def test_a_settled_member_does_not_lead_and_a_withdrawn_one_is_not_taken() -> None:
    lane = _Lane(max_group=5)
    a, b, c = members("a", "b", "c")
    for m in (a, b, c):
        lane.join(m)
    a.settle(1, None)
    assert lane.lead(a) is None
    assert lane.leader is None
    lane.withdraw(b)
    lane.withdraw(b)
    assert lane.queue == [a, c]
    assert lane.lead(c) == [a, c]


def test_a_member_publishes_its_event_then_raises_or_returns() -> None:
    rig = make_rig()
    (m,) = members("a")
    e = event(cid(1, 1), 1, 1, moved("a", None, 1))
    m.event = e
    m.settle(7, None)
    assert m.outcome(rig.docs.observers) == 7
    assert rig.events == [e]
    (n,) = members("b")
    n.settle(None, NotEnough("no"))
    with pytest.raises(NotEnough, match=r"^no$"):
        n.outcome(rig.docs.observers)
    assert rig.events == [e]


# -- reads beside a write -----------------------------------------------------------------


def stall_after_get(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """Our store's GETs from a thread called "reader" wait, once answered, until let go."""
    answered, go = threading.Event(), threading.Event()
    original = rig.store.get

    def get(key: str, if_none_match: str | None = None) -> Any:
        try:
            return original(key, if_none_match=if_none_match)
        finally:
            if threading.current_thread().name == "reader":
                answered.set()
                assert go.wait(WAIT)

    monkeypatch.setattr(rig.store, "get", get)
    return answered, go


@pytest.mark.parametrize("deleted", [False, True])
def test_a_read_answered_before_a_write_does_not_replace_the_written_version_in_the_cache(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, deleted: bool
) -> None:
    rig.docs.commit(KEY, CODEC, Add("x"))
    if deleted:
        MemoryStore(rig.store.bucket, "p").delete(KEY)
    else:
        rig.rival.commit(KEY, CODEC, Add("r", actor="rex"))
    answered, go = stall_after_get(rig, monkeypatch)
    got: list[Any] = []
    reader = threading.Thread(
        target=lambda: got.append(rig.docs.read(KEY, CODEC)), name="reader", daemon=True
    )
    reader.start()
    assert answered.wait(WAIT)
    assert rig.docs.commit(KEY, CODEC, Add("x")) == (1 if deleted else 2)  # lands meanwhile
    go.set()
    reader.join(WAIT)
    assert not reader.is_alive()
    assert got == [
        Tally() if deleted else Tally({"x": 1, "r": 1}, when(-1), 2, (cid(1, 1), rival_id(1)))
    ]

    rig.forget_calls()
    rig.docs.commit(KEY, CODEC, Add("x"))  # on the version the write cached: one PUT
    assert rig.calls == {"put": 1}
