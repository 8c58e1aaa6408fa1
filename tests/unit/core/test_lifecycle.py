"""The lifecycle table against the pure changes: refusals of ``next_state``, and properties
over random sequences of changes (the table is never violated, a stale or foreign claim
never changes an entry, at most one claim holds an entry)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from objmanifest.core import changes
from objmanifest.core.changes import Rules
from objmanifest.core.model import Claim, Entry, Shard
from objmanifest.core.states import TABLE, Event, InvalidTransition, State, next_state
from objmanifest.errors import LeaseLost, ObjManifestError

from ..make import RULES, STAGE, T0, at, claim_on, entry, exactly, lookup, shard

# -- next_state -----------------------------------------------------------------------------


def test_an_invalid_transition_names_the_state_and_the_event() -> None:
    with pytest.raises(InvalidTransition, match=exactly("no transition from 'dead' on 'claim'")):
        next_state(State.dead, Event.claim)
    with pytest.raises(InvalidTransition, match=r"^no transition from 'ready'") as info:
        next_state(State.ready, Event.finish)
    assert (info.value.state, info.value.event) == (State.ready, Event.finish)
    assert info.value.args == ("no transition from 'ready' on 'finish'",)


def test_next_state_defaults_count_no_retry_allow_none_and_mark_nothing_complete() -> None:
    # defaults: retry_count=0, max_retries=0, all_consumed=False
    assert next_state(State.writing, Event.fail) is State.failed
    assert next_state(State.writing, Event.fail, retry_count=1) is State.dead
    assert next_state(State.writing, Event.fail, max_retries=1, retry_count=1) is State.failed
    assert next_state(State.ready, Event.consume) is State.ready
    assert next_state(State.pending, Event.claim) is State.writing


# -- properties over random sequences of changes -------------------------------------------

RULES1 = Rules(task_id="job", lease_seconds=30, max_retries=1)
"""One retry, so random sequences reach ``dead`` often."""
FILES = ("a", "b", "c")
AGENTS = ("ann", "bob")
ROLES = ("r1", "r2")
DECLARED = {
    "a": entry("a"),
    "b": entry("b", depends_on=("a",), consumers=ROLES),
    "c": entry("c", depends_on=("a", "b")),
}


@dataclass
class World:
    """A stage of three entries, the store's clock, and every claim ever handed out."""

    shard: Shard = field(default_factory=lambda: shard(*DECLARED.values()))
    now: datetime = T0
    claims: list[Claim] = field(default_factory=list)

    def lookup(self, dep: str) -> Entry | None:
        return self.shard.entries.get(dep)


Step = Callable[[World], "tuple[Shard | None, object]"]


def steps() -> st.SearchStrategy[tuple[str, Step | None]]:
    """Labelled changes; ``None`` for "the clock moves on" by the seconds in the label."""
    fid = st.sampled_from(FILES)
    agent = st.sampled_from(AGENTS)
    pick = st.integers(0, 3)  # which claim: 0 the newest, 1 the one before, ...

    def nth(w: World, i: int) -> Claim:
        return w.claims[-1 - i % len(w.claims)]

    def stored(w: World, f: str) -> tuple[str, str]:
        e = w.shard.entries[f]
        return (e.key or "", e.checksum or "")

    def finish(w: World, i: int) -> tuple[Shard | None, object]:
        c = nth(w, i)
        return changes.finish(w.shard, c, f"{c.file_id}@{c.epoch}", "sum", 5, w.now)

    advance = st.sampled_from([1, 10, 31, 33, 100]).map(lambda n: (f"advance {n}", None))
    claim = st.tuples(fid, agent).map(
        lambda t: (
            f"claim {t}",
            lambda w: changes.claim(w.shard, t[0], t[1], w.now, RULES1, w.lookup),
        )
    )
    claim_any = st.tuples(agent, st.integers(1, 3)).map(
        lambda t: (
            f"claim_any {t}",
            lambda w: changes.claim_any(w.shard, t[0], t[1], w.now, RULES1, w.lookup),
        )
    )
    renew = pick.map(
        lambda i: (f"renew #{i}", lambda w: changes.renew(w.shard, nth(w, i), w.now, RULES1))
    )
    finished = pick.map(lambda i: (f"finish #{i}", lambda w: finish(w, i)))
    fail = pick.map(
        lambda i: (f"fail #{i}", lambda w: changes.fail(w.shard, nth(w, i), "x", w.now, RULES1))
    )
    consume = st.tuples(fid, st.sampled_from((*ROLES, *AGENTS))).map(
        lambda t: (
            f"consume {t}",
            lambda w: changes.consume(w.shard, t[0], t[1], *stored(w, t[0]), w.now),
        )
    )
    mismatch = fid.map(
        lambda f: (
            f"mismatch {f}",
            lambda w: changes.mismatch(w.shard, f, *stored(w, f), "bad", w.now, RULES1),
        )
    )
    reap = st.just(("reap", lambda w: changes.reap(w.shard, w.now, RULES1)))
    # repeated to be drawn more often: they need an entry to be ready first
    return st.one_of(
        advance, claim, claim_any, renew, finished, finished, fail,
        consume, consume, consume, mismatch, mismatch, reap,
    )  # fmt: skip


MOVES = {
    # (from, to) for every move the table allows
    (s, t)
    for (s, _event), targets in TABLE.items()
    for t in targets
}


def check_move(before: Entry, after: Entry) -> None:
    """One change of one entry obeys the lifecycle and the fencing rules."""
    terminal = (State.consumed, State.dead)
    assert before.state not in terminal, f"{before.state} is terminal but changed"
    if after.state is not before.state:
        assert (before.state, after.state) in MOVES, (before.state, after.state)
    assert after.retry_count in (before.retry_count, before.retry_count + 1)
    if after.retry_count > before.retry_count:
        assert after.error
    assert after.epoch in (before.epoch, before.epoch + 1)
    if after.epoch == before.epoch + 1:  # a new holder
        assert after.state is State.writing and after.owner is not None
        assert after.lease_expires_at is not None
    elif after.state is State.writing and before.state is State.writing:
        assert after.owner == before.owner  # the same holder renewed
    if after.state is State.writing:
        assert after.owner is not None
    if after.state is State.dead:
        assert after.retry_count > RULES1.max_retries
    else:
        assert after.retry_count <= RULES1.max_retries
    if after.state in (State.ready, State.consumed):
        assert after.key == f"{after.file_id}@{after.epoch}"
        assert after.lease_expires_at is None


@settings(max_examples=300)
@given(st.booleans(), st.lists(steps(), min_size=5, max_size=60))
def test_random_changes_never_break_the_lifecycle_or_fencing(
    a_ready: bool, script: list[tuple[str, Step | None]]
) -> None:
    w = World()
    if a_ready:  # start further on: what depends on "a" can be claimed at once
        a = w.shard.entries["a"].model_copy(
            update={"state": State.ready, "epoch": 1, "owner": "ann", "key": "a@1", "checksum": "s"}
        )
        w.shard = w.shard.with_entries({"a": a})
    for label, step in script:
        if step is None:
            w.now += timedelta(seconds=int(label.split()[1]))
            continue
        if "#" in label and not w.claims:
            continue
        before = w.shard
        try:
            new, result = step(w)
        except ObjManifestError:
            continue  # refused: a pure change has nothing to undo
        except InvalidTransition as e:  # pragma: no cover - the property failing
            raise AssertionError(f"{label}: {e}") from None
        if isinstance(result, Claim):
            w.claims.append(result)
        elif isinstance(result, list):
            w.claims.extend(c for c in result if isinstance(c, Claim))
        if new is None:
            continue
        assert new.entries.keys() == before.entries.keys()
        for fid, after in new.entries.items():
            if after != before.entries[fid]:
                check_move(before.entries[fid], after)
                assert after.updated_at == w.now
        w.shard = new
        # at most one claim ever handed out still holds each entry
        for fid in FILES:
            holders = {
                (c.agent, c.epoch) for c in w.claims if c.file_id == fid and holds(w.shard, c)
            }
            assert len(holders) <= 1, (fid, holders)


def holds(sh: Shard, c: Claim) -> bool:
    try:
        changes.renew(sh, c, at(0), RULES1)
    except LeaseLost:
        return False
    return True


# -- fencing, for any entry and any claim -----------------------------------------------------

HOLDER_CHANGES: dict[str, Callable[[Shard, Claim], object]] = {
    "renew": lambda sh, c: changes.renew(sh, c, at(1), RULES),
    "finish": lambda sh, c: changes.finish(sh, c, "k-new", "c-new", 9, at(1)),
    "fail": lambda sh, c: changes.fail(sh, c, "x", at(1), RULES),
}


@given(
    state=st.sampled_from(State),
    epoch=st.integers(0, 5),
    owner=st.sampled_from([None, *AGENTS]),
    claim_epoch=st.integers(0, 5),
    claim_agent=st.sampled_from(AGENTS),
    change=st.sampled_from(sorted(HOLDER_CHANGES)),
)
def test_only_the_current_holder_changes_an_entry(
    state: State, epoch: int, owner: str | None, claim_epoch: int, claim_agent: str, change: str
) -> None:
    e = entry(
        "a", state=state, epoch=epoch, owner=owner, lease_expires_at=at(30), key="k", checksum="c"
    )
    c = claim_on(e, agent=claim_agent, epoch=claim_epoch)
    is_holder = state is State.writing and epoch == claim_epoch and owner == claim_agent
    if not is_holder:
        with pytest.raises(LeaseLost, match=r"^lease on 'a' \(epoch \d, agent \w+\) is lost: "):
            HOLDER_CHANGES[change](shard(e), c)
        return
    new, _ = HOLDER_CHANGES[change](shard(e), c)
    after = new.entries["a"]
    assert after.epoch == epoch
    assert after.state in TABLE[(State.writing, Event[change])]


def test_dependency_lookups_see_other_stages() -> None:
    # the lookup may answer from any shard: a ready entry of another stage unblocks
    dep = entry("x", stage="other", state=State.ready)
    e = entry("a", depends_on=("x",))
    new, result = changes.claim(shard(e), "a", "ann", T0, RULES, lookup(dep))
    assert isinstance(result, Claim)
    assert (result.stage, result.epoch) == (STAGE, 1)
    assert new is not None
