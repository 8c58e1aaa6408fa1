"""The entry lifecycle as one table, so every move the code makes is checked against it.

    pending -> writing -> ready -> consumed
                 |  ^       |
                 v  |       v   (checksum mismatch found by a consumer)
                failed  <---+
                 |
                 v  once retry_count > max_retries
                dead

Operators' verbs have a table of their own (``VERBS``), so what agents' events can do stays
as above (``consumed`` and ``dead`` have no way out by any agent's event): ``release`` gives
a writing entry back (pending, or failed if it has failed before) without counting a retry;
``revive`` turns a dead entry into ``failed`` with its retries reset.

A failure (``fail``, a takeover of an expired lease, a reaped lease, a checksum mismatch)
counts one retry; the entry then becomes ``failed``, or ``dead`` when the count passes
``max_retries``. So ``max_retries=3`` allows four attempts.
"""

from __future__ import annotations

from enum import Enum

from .errors import InvalidTransition


class State(str, Enum):
    """Where an entry is in its lifecycle; the table below says its allowed moves."""

    pending = "pending"
    writing = "writing"
    ready = "ready"
    consumed = "consumed"
    failed = "failed"
    dead = "dead"

    def __str__(self) -> str:
        return self.value


class Event(str, Enum):
    claim = "claim"  # an agent takes a pending or failed entry
    takeover = "takeover"  # an agent takes a writing entry whose lease expired
    renew = "renew"  # the holder extends its lease
    finish = "finish"  # the holder's data is stored and verified
    fail = "fail"  # the holder gives up
    expire = "expire"  # the reaper releases an expired lease
    consume = "consume"  # a consumer marks it (the last needed mark makes it consumed)
    mismatch = "mismatch"  # a consumer found the data differs from its checksum

    def __str__(self) -> str:
        return self.value


# (state, event) -> the states it may lead to. Which one is picked by the arguments of
# `next_state`: failures pick failed or dead by the retry count, a consume mark picks
# ready or consumed by whether every consumer has marked.
TABLE: dict[tuple[State, Event], frozenset[State]] = {
    (State.pending, Event.claim): frozenset({State.writing}),
    (State.failed, Event.claim): frozenset({State.writing}),
    (State.writing, Event.takeover): frozenset({State.writing, State.dead}),
    (State.writing, Event.renew): frozenset({State.writing}),
    (State.writing, Event.finish): frozenset({State.ready}),
    (State.writing, Event.fail): frozenset({State.failed, State.dead}),
    (State.writing, Event.expire): frozenset({State.failed, State.dead}),
    (State.ready, Event.consume): frozenset({State.ready, State.consumed}),
    (State.ready, Event.mismatch): frozenset({State.failed, State.dead}),
}

FAILURES = frozenset({Event.takeover, Event.fail, Event.expire, Event.mismatch})
"""Events that count one retry."""


class Verb(str, Enum):
    """What an operator (or a holder giving up its claim) does outside the agents' events."""

    release = "release"  # the holder gives its claim back, no retry spent
    revive = "revive"  # an operator gives a dead entry its retries back

    def __str__(self) -> str:
        return self.value


VERBS: dict[tuple[State, Verb], frozenset[State]] = {
    (State.writing, Verb.release): frozenset({State.pending, State.failed}),
    (State.dead, Verb.revive): frozenset({State.failed}),
}
"""The operators' verbs: (state, verb) -> the states it may lead to."""

__all__ = [
    "FAILURES",
    "TABLE",
    "VERBS",
    "Event",
    "InvalidTransition",
    "Verb",
    "next_state",
    "verb_state",
]


def next_state(
    state: State,
    event: Event,
    *,
    retry_count: int = 0,
    max_retries: int = 0,
    all_consumed: bool = False,
) -> State:
    """The state after ``event``; ``retry_count`` is the count after this event's retry."""
    targets = TABLE.get((state, event))
    if targets is None:
        raise InvalidTransition(state, event)
    if event in FAILURES:
        if retry_count > max_retries:
            return State.dead
        return State.writing if event is Event.takeover else State.failed
    if event is Event.consume:
        return State.consumed if all_consumed else State.ready
    (only,) = targets
    return only


def verb_state(state: State, verb: Verb, *, retry_count: int = 0) -> State:
    """The state after an operator's ``verb``; a release picks failed over pending when the
    entry has failed before (``retry_count`` is unchanged by it)."""
    if (state, verb) not in VERBS:
        raise InvalidTransition(state, verb)
    if verb is Verb.release:
        return State.failed if retry_count else State.pending
    return State.failed


UNTIL = {"ready": (State.ready, State.consumed), "consumed": (State.consumed,)}
"""What ``wait(until=...)`` accepts as done: ``ready`` counts consumed entries too."""


def outstanding(states: dict[str, State], until: str) -> tuple[list[str], list[str]]:
    """Of these entries (file id -> state), those not yet at least ``until`` and those
    dead (never will be), each sorted."""
    done = UNTIL[until]
    dead = sorted(fid for fid, state in states.items() if state is State.dead)
    waiting = sorted(
        fid for fid, state in states.items() if state not in done and state is not State.dead
    )
    return waiting, dead
