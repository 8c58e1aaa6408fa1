"""The behaviour suite: every promise of the core API, run against every backend."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import re
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import objmanifest as om
from objmanifest.data import transfer
from objmanifest.engine import consuming
from objmanifest.engine.commands import DeclareInIndex
from objmanifest.errors import DataChanged, ReadBrokeOff
from objmanifest.store import make_client
from tests.support.internals import engine
from tests.support.rawstore import delete as raw_delete
from tests.support.rawstore import get as raw_get
from tests.support.rawstore import put as raw_put
from tests.support.rawstore import requests as requests

pytestmark = pytest.mark.behaviour

ROOT = Path(__file__).resolve().parent.parent


def wait_expired(task: om.Task, claim: om.Claim) -> None:
    """Sleep until the store's clock is past the lease and its margin."""
    while task.store.now() <= claim.lease_expires_at + timedelta(seconds=2.2):
        time.sleep(0.25)


def short_task(store: om.ObjectStore, lease: float = 1, retries: int = 3) -> om.Task:
    return om.Task.create(
        store, "short", stages=["collect", "write"], lease_seconds=lease, max_retries=retries
    )


# -- errors ----------------------------------------------------------------------------


def documented_names(text: str, opening: str, end: str = "\n\n") -> list[str]:
    """The names in backquotes after ``opening``, up to ``end``."""
    start = text.index(opening) + len(opening)
    return re.findall(r"`(?:om\.)?([A-Za-z]+)`", text[start : text.index(end, start)])


def test_every_public_error_derives_from_objmanifest_error() -> None:
    exported = {name: getattr(om, name) for name in om.__all__}
    errors = {
        name: obj
        for name, obj in exported.items()
        if isinstance(obj, type) and issubclass(obj, BaseException)
    }
    assert len(errors) >= 16, sorted(errors)
    assert [n for n, cls in errors.items() if not issubclass(cls, om.ObjManifestError)] == []

    # The lists of errors in the README and on the API page: each one is exported, and
    # derives from the base.
    for page in ("README.md", "docs/api.md"):
        text = (ROOT / page).read_text()
        listed = documented_names(text, "Every error derives from `om.ObjManifestError`:")
        assert len(listed) >= 15, (page, listed)
        assert [n for n in listed if n not in errors] == [], page
        assert set(errors) == {*listed, "ObjManifestError"}, f"{page} and om.__all__ disagree"
    assert issubclass(om.DependencyCycle, om.DeclarationConflict)
    assert issubclass(om.InvalidFileId, ValueError)

    # The errors docs/cli.md says `--json` reports: ours, the command line's, or Python's.
    from objmanifest.wire import exits

    cli_doc = (ROOT / "docs" / "cli.md").read_text()
    named = documented_names(cli_doc, "`error` is the exception class (", ")")
    assert len(named) >= 20, named
    unknown = [
        n
        for n in named
        if n not in errors
        and not isinstance(getattr(exits, n, None), type)
        and not isinstance(getattr(builtins, n, None), type)
    ]
    assert unknown == []
    assert {"NothingClaimable", "UsageError"} <= set(named)


# -- tasks -----------------------------------------------------------------------------


def test_create_open_and_exists(store: om.ObjectStore) -> None:
    task = om.Task.create(
        store, "report-0001", stages=["collect", "write", "check"], lease_seconds=300, max_retries=3
    )
    opened = om.Task.open(store, "report-0001")
    assert opened.stages == ("collect", "write", "check")
    assert (opened.lease_seconds, opened.max_retries) == (300, 3)
    with pytest.raises(om.AlreadyExists, match="report-0001"):
        om.Task.create(store, "report-0001", stages=["other"])
    assert om.Task.open(store, "report-0001").stages == task.stages  # not overwritten
    with pytest.raises(om.NotFound, match="nope"):
        om.Task.open(store, "nope")


@pytest.mark.parametrize(
    ("stages", "why"),
    [
        ([], "a task needs at least one stage"),
        (["a", "a"], r"stages must be distinct: \['a', 'a'\]"),
        (["bad/stage"], "invalid stage 'bad/stage': use 1-128 letters"),
        ([""], "invalid stage '': use 1-128 letters"),
    ],
    ids=["none", "dup", "slash", "empty"],
)
def test_create_refuses_bad_stages(store: om.ObjectStore, stages: list[str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        om.Task.create(store, "bad", stages=stages)
    with pytest.raises(om.NotFound, match="task 'bad' does not exist"):
        om.Task.open(store, "bad")


# -- declare ---------------------------------------------------------------------------


def test_declare_is_idempotent_and_sets_compare(task: om.Task) -> None:
    first = task.declare("d/x", stage="write", depends_on=["a", "b"], consumers=["r1", "r2"])
    version = task.shard("write").version
    again = task.declare("d/x", stage="write", depends_on=["b", "a", "a"], consumers=["r2", "r1"])
    assert again == first
    assert task.shard("write").version == version  # nothing written


@pytest.mark.parametrize(
    ("change", "word"),
    [
        ({"stage": "check"}, "stage"),
        ({"depends_on": ["a"]}, "depends_on"),
        ({"consumers": ["r1"]}, "consumers"),
    ],
)
def test_declare_conflict_says_what_differs(
    task: om.Task, change: dict[str, Any], word: str
) -> None:
    task.declare("d/x", stage="write", depends_on=["a", "b"], consumers=["r1", "r2"])
    decl = {
        "file_id": "d/x",
        "stage": "write",
        "depends_on": ["a", "b"],
        "consumers": ["r1", "r2"],
        **change,
    }
    with pytest.raises(om.DeclarationConflict, match=word):
        task.declare(**decl)
    assert task.entry("d/x").depends_on == ("a", "b")


@pytest.mark.stage_layout
def test_declare_many_one_commit_per_shard(task: om.Task) -> None:
    before = {s: task.shard(s).version for s in task.stages}
    index_before = task.index().version
    entries = task.declare_many(
        [{"file_id": f"raw/{i}", "stage": "collect"} for i in range(20)]
        + [("draft/0", "write", ["raw/0", "raw/1"])]
        + [om.Declaration(file_id="check/0", stage="check", depends_on=("draft/0",))]
    )
    assert [e.file_id for e in entries][:2] == ["raw/0", "raw/1"]
    assert len(entries) == 22
    after = {s: task.shard(s).version for s in task.stages}
    assert {s: after[s] - before[s] for s in task.stages} == {"collect": 1, "write": 1, "check": 1}
    assert task.index().version == index_before + 1


def test_declare_refuses_cycles_across_shards(task: om.Task) -> None:
    task.declare("a", stage="collect", depends_on=["c"])
    task.declare("b", stage="write", depends_on=["a"])
    with pytest.raises(om.DependencyCycle, match="dependency cycle: c -> b -> a -> c"):
        task.declare("c", stage="check", depends_on=["b"])
    with pytest.raises(om.DependencyCycle, match=r"self -> self \(an entry may not depend"):
        task.declare("self", stage="check", depends_on=["self"])
    with pytest.raises(om.NotFound, match="'c' is not declared in task 'job'"):
        task.entry("c")
    assert om.DependencyCycle.__mro__[1] is om.DeclarationConflict


def test_declare_unknown_stage_is_refused(task: om.Task) -> None:
    with pytest.raises(om.NotFound, match="collect, write, check"):
        task.declare("a", stage="publish")


@pytest.mark.parametrize(
    "file_id", ["", "/abs", "a/../b", "..", "a//b", "a/./b", "tab\there", "nul\x00", "a\\b", "a/"]
)
def test_bad_file_ids_are_refused(task: om.Task, file_id: str) -> None:
    named = re.escape(f"invalid file id {file_id!r}: ")
    with pytest.raises(om.InvalidFileId, match=named):
        task.declare(file_id, stage="collect")
    with pytest.raises(om.InvalidFileId, match=named):
        task.declare("ok", stage="write", depends_on=[file_id])
    assert task.shard("collect").entries == {}


def test_interrupted_declare_is_finished_by_declaring_again(task: om.Task) -> None:
    # A crash after the index commit, before the shard commit: simulate the index part only.
    half = om.Declaration(file_id="half", stage="collect")
    engine(task).docs.commit(
        engine(task).index_key, engine(task).index_codec, DeclareInIndex([half])
    )
    with pytest.raises(om.NotFound, match="declare it again"):
        task.entry("half")
    task.declare("half", stage="collect")
    assert task.entry("half").state is om.State.pending


# -- claim, put, fail, renew ------------------------------------------------------------


def test_claim_put_consume_round_trip(task: om.Task, tmp_path: Path) -> None:
    task.declare("raw/a.json", stage="collect")
    agent = task.agent("collector-1", role="collector")
    claim = agent.claim("raw/a.json")
    assert claim is not None
    assert (claim.file_id, claim.stage, claim.epoch, claim.agent) == (
        "raw/a.json",
        "collect",
        1,
        "collector-1",
    )
    entry = task.entry("raw/a.json")
    assert (entry.state, entry.owner, entry.epoch) == (om.State.writing, "collector-1", 1)

    src = tmp_path / "a.json"
    src.write_bytes(b'{"a": 1}')
    ready = agent.put(claim, src)
    assert ready.state is om.State.ready
    assert ready.size == 8 and ready.checksum and ready.checksum.startswith("xxh3-128:")
    assert ready.key == "job/data/collect/raw/a.json@1"
    assert raw_get(task.store, ready.key) == b'{"a": 1}'
    assert task.agent("reader").consume("raw/a.json") == b'{"a": 1}'
    assert task.entry("raw/a.json").state is om.State.consumed


def test_put_accepts_bytes_path_and_binary_file(task: om.Task, tmp_path: Path) -> None:
    task.declare_many([(f"f{i}", "collect") for i in range(3)])
    agent = task.agent("p")
    path = tmp_path / "x.bin"
    path.write_bytes(b"from a path")
    sources: list[Any] = [b"from bytes", str(path), io.BytesIO(b"from a file")]
    for i, src in enumerate(sources):
        claim = agent.claim(f"f{i}")
        assert claim is not None
        agent.put(claim, src)
    got = [task.agent("c").consume(f"f{i}") for i in range(3)]
    assert got == [b"from bytes", b"from a path", b"from a file"]
    claim_text = task.declare("f-text", stage="collect")
    assert claim_text.state is om.State.pending
    c = agent.claim("f-text")
    assert c is not None
    with pytest.raises(TypeError, match="binary"):
        agent.put(c, io.StringIO("text"))


@pytest.mark.stage_layout
def test_claim_by_stage_and_claim_many(task: om.Task) -> None:
    task.declare_many([(f"raw/{i}", "collect") for i in range(5)])
    agent = task.agent("a")
    version = task.shard("collect").version
    claims = agent.claim_many(stage="collect", limit=3)
    assert [c.file_id for c in claims] == ["raw/0", "raw/1", "raw/2"]
    assert task.shard("collect").version == version + 1  # one commit for the batch
    one = agent.claim(stage="collect")
    assert one is not None and one.file_id == "raw/3"
    agent.claim(stage="collect")
    assert agent.claim(stage="collect") is None
    assert agent.claim_many(stage="collect") == []


def test_not_claimable_reasons(task: om.Task) -> None:
    task.declare("a", stage="collect")
    task.declare("b", stage="write", depends_on=["a", "later"])
    holder = task.agent("holder")
    claim = holder.claim("a")
    assert claim is not None
    with pytest.raises(om.NotClaimable, match="'a' is not claimable: state writing") as held:
        task.agent("other").claim("a")
    assert "holder" in held.value.reason and "writing" in held.value.reason
    with pytest.raises(om.NotClaimable, match="'b' is not claimable: waiting for") as waiting:
        task.agent("w").claim("b")
    assert "a (writing)" in waiting.value.reason
    assert "later (not declared)" in waiting.value.reason
    holder.put(claim, b"x")
    with pytest.raises(om.NotClaimable, match="'a' is not claimable: state ready") as done:
        task.agent("other").claim("a")
    assert "ready" in done.value.reason
    with pytest.raises(om.NotFound, match="'missing' is not declared in task 'job'"):
        task.agent("other").claim("missing")


def test_dependency_declared_later_then_met(task: om.Task) -> None:
    task.declare("report", stage="write", depends_on=["raw/late"])
    assert task.agent("w").claim(stage="write") is None
    task.declare("raw/late", stage="collect")
    producer = task.agent("c")
    c = producer.claim("raw/late")
    assert c is not None
    assert task.agent("w").claim(stage="write") is None  # writing is not ready
    producer.put(c, b"late")
    got = task.agent("w").claim(stage="write")
    assert got is not None and got.file_id == "report"


def test_consumed_dependency_counts_as_met(task: om.Task) -> None:
    task.declare("a", stage="collect")
    task.declare("b", stage="write", depends_on=["a"])
    p = task.agent("p")
    c = p.claim("a")
    assert c is not None
    p.put(c, b"a")
    task.agent("q").consume("a")
    assert task.entry("a").state is om.State.consumed
    assert task.agent("w").claim("b") is not None


def test_fail_then_dead_after_max_retries_and_blocked_dependents(store: om.ObjectStore) -> None:
    task = om.Task.create(
        store, "retry", stages=["collect", "write"], lease_seconds=30, max_retries=2
    )
    task.declare("a", stage="collect")
    task.declare("b", stage="write", depends_on=["a"])
    agent = task.agent("p")
    states = []
    for attempt in range(3):  # max_retries=2 allows three attempts
        claim = agent.claim("a")
        assert claim is not None and claim.epoch == attempt + 1
        entry = agent.fail(claim, f"boom {attempt}")
        states.append((entry.state, entry.retry_count))
    assert states == [(om.State.failed, 1), (om.State.failed, 2), (om.State.dead, 3)]
    assert task.entry("a").error == "boom 2"
    with pytest.raises(om.NotClaimable, match="'a' is not claimable: state dead after 3"):
        agent.claim("a")
    with pytest.raises(om.NotClaimable, match="depends on dead entries: a") as blocked:
        task.agent("w").claim("b")
    assert "dead" in blocked.value.reason and "a" in blocked.value.reason
    status = task.status()
    assert [(n.file_id, "dead" in n.reason) for n in status.blocked] == [("b", True)]
    assert [n.file_id for n in status.dead] == ["a"]
    assert status.stages["collect"]["dead"] == 1
    assert status.totals["pending"] == 1


def test_stale_epoch_is_fenced_and_changes_nothing(store: om.ObjectStore) -> None:
    task = short_task(store)
    task.declare("x", stage="collect")
    zombie, winner = task.agent("zombie"), task.agent("winner")
    old = zombie.claim("x")
    assert old is not None
    wait_expired(task, old)
    new = winner.claim("x")
    assert new is not None
    assert new.epoch == old.epoch + 1
    entry = task.entry("x")
    assert (entry.owner, entry.retry_count) == ("winner", 1)
    assert "expired" in (entry.error or "")
    winner.put(new, b"winner's bytes")
    version = task.shard("collect").version
    for act in (
        lambda: zombie.put(old, b"zombie's bytes"),
        lambda: zombie.renew(old),
        lambda: zombie.fail(old, "late"),
    ):
        with pytest.raises(om.LeaseLost, match=r"lease on 'x' \(epoch 1, agent zombie\) is lost"):
            act()
    assert task.shard("collect").version == version
    assert task.agent("reader").consume("x") == b"winner's bytes"
    keys = list(task.store.list_keys("short/data/"))
    assert keys == ["short/data/collect/x@2"]  # the zombie's bytes are not left behind


def test_expired_lease_nobody_took_is_still_valid(store: om.ObjectStore) -> None:
    task = short_task(store)
    task.declare("x", stage="collect")
    agent = task.agent("slow")
    claim = agent.claim("x")
    assert claim is not None
    wait_expired(task, claim)
    renewed = agent.renew(claim)
    assert renewed.lease_expires_at > claim.lease_expires_at
    assert agent.put(claim, b"late but fine").state is om.State.ready


def test_expired_lease_nobody_took_is_still_valid_for_fail(store: om.ObjectStore) -> None:
    task = short_task(store, retries=3)
    task.declare("x", stage="collect")
    agent = task.agent("slow")
    claim = agent.claim("x")
    assert claim is not None
    wait_expired(task, claim)
    failed = agent.fail(claim, "gave up late")
    assert (failed.state, failed.epoch, failed.retry_count) == (om.State.failed, claim.epoch, 1)
    assert (failed.owner, failed.error) == (None, "gave up late")
    again = task.agent("next").claim("x")  # claimable again, as a plain retry
    assert again is not None and again.epoch == claim.epoch + 1
    assert task.entry("x").retry_count == 1  # the fail counted once, the expiry not at all


def test_takeover_and_reap_count_failures(store: om.ObjectStore) -> None:
    task = short_task(store, retries=1)
    task.declare_many([("a", "collect"), ("b", "collect")])
    agent = task.agent("first")
    ca, cb = agent.claim("a"), agent.claim("b")
    assert ca is not None and cb is not None
    wait_expired(task, cb)
    reaped = task.reap()
    assert sorted((e.file_id, e.state, e.retry_count) for e in reaped) == [
        ("a", om.State.failed, 1),
        ("b", om.State.failed, 1),
    ]
    assert task.reap() == []  # nothing left to release
    with pytest.raises(om.LeaseLost, match=r"lease on 'a' \(epoch 1, agent first\) is lost"):
        agent.put(ca, b"too late")
    again = task.agent("second").claim("a")
    assert again is not None and again.epoch == 2
    wait_expired(task, again)
    with pytest.raises(om.NotClaimable, match="'a' is not claimable: state dead after 2"):
        task.agent("third").claim("a")  # takeover is the 2nd failure: past max_retries=1
    assert task.entry("a").state is om.State.dead


def test_put_renews_lease_while_writing(store: om.ObjectStore) -> None:
    task = short_task(store, lease=1.5)
    task.declare("big", stage="collect")
    agent = task.agent("writer")
    claim = agent.claim("big")
    assert claim is not None
    rivals: list[str] = []

    class SlowFile(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def read(self, size: int = -1) -> bytes:
            # Four times the lease, on the store's runtime (ten times faster on memory).
            clock = store.runtime
            deadline = clock.monotonic() + 6
            while clock.monotonic() < deadline:
                try:
                    task.agent("rival").claim("big")
                    rivals.append("took it")
                except om.NotClaimable:
                    rivals.append("refused")
                clock.sleep(1)
            return b"slow bytes"

    entry = agent.put(claim, SlowFile())  # type: ignore[arg-type]
    assert entry.state is om.State.ready and entry.epoch == claim.epoch
    assert rivals and set(rivals) == {"refused"}


# -- consume ---------------------------------------------------------------------------


def produce(task: om.Task, file_id: str, data: bytes) -> om.Entry:
    agent = task.agent("producer")
    claim = agent.claim(file_id)
    assert claim is not None
    return agent.put(claim, data)


def test_queue_consume_once(task: om.Task, tmp_path: Path) -> None:
    task.declare("q", stage="collect")
    with pytest.raises(om.NotReady, match="pending"):
        task.agent("c1").consume("q")
    produce(task, "q", b"payload")
    c1, c2 = task.agent("c1", role="reader"), task.agent("c2", role="reader")
    assert c1.consume("q") == b"payload"
    assert task.entry("q").consumed_by == ("c1",)
    assert c1.consume("q") == b"payload"  # idempotent retry
    with pytest.raises(om.AlreadyConsumed, match="c1"):
        c2.consume("q")
    entry = c1.consume("q", dest=tmp_path / "out" / "q.bin", parents=True)
    assert entry.state is om.State.consumed
    assert (tmp_path / "out" / "q.bin").read_bytes() == b"payload"


@pytest.mark.parametrize("kind", ["single", "chunked"])
def test_a_consume_refused_at_its_mark_leaves_dest_as_it_was(
    task: om.Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Two consumers of one queue entry at once: the one whose consumed mark loses
    (``AlreadyConsumed``) after it fetched and verified the data leaves its ``dest`` as it
    was (a file there before untouched, no temporary file beside it), since the mark comes
    before the bytes are put in place. The rival consumes while the loser's download runs."""
    data = bytes(range(256)) * (24 * 1024 if kind == "chunked" else 4)  # 6 MiB or 1 KiB
    task.declare("q", stage="collect")
    producer = task.agent("producer")
    claim = producer.claim("q")
    assert claim is not None
    producer.put(claim, data, threshold=5 * 1024 * 1024, part_size=5 * 1024 * 1024)
    assert task.entry("q").is_chunked is (kind == "chunked")
    rival, loser = task.agent("c1"), task.agent("c2")
    started: list[bool] = []
    raced: list[bytes] = []

    def rival_consumes() -> None:
        if not started:
            started.append(True)
            raced.append(rival.consume("q"))

    if kind == "single":
        real_open = transfer.open_data

        def open_as_the_rival_consumes(store: Any, key: str) -> Any:
            rival_consumes()
            return real_open(store, key)

        monkeypatch.setattr(transfer, "open_data", open_as_the_rival_consumes)
    dest = tmp_path / "out" / "q.bin"
    dest.parent.mkdir()
    dest.write_bytes(b"precious")
    with pytest.raises(om.AlreadyConsumed, match="c1"):
        loser.consume("q", dest=dest, progress=lambda done, total: rival_consumes())
    assert raced == [data]
    assert dest.read_bytes() == b"precious"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["q.bin"]
    assert task.entry("q").consumed_by == ("c1",)
    assert rival.consume("q", dest=tmp_path / "mine.bin").state is om.State.consumed
    assert (tmp_path / "mine.bin").read_bytes() == data  # the winner writes it again


def test_a_consume_whose_bytes_cannot_be_put_in_place_after_the_mark_says_so(
    task: om.Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark comes before the verified bytes are renamed into ``dest``; when that rename
    fails, the error keeps its type and errno, says the entry was marked and that consuming
    it again writes it, and leaves no temporary file; consuming again does."""
    task.declare("q", stage="collect")
    produce(task, "q", b"payload")
    dest = tmp_path / "out.bin"
    real_replace = os.replace

    def failing_replace(src: Any, dst: Any, **kwargs: Any) -> None:
        if os.fspath(dst) == os.fspath(dest):
            raise OSError(errno.EIO, os.strerror(errno.EIO), os.fspath(src), None, os.fspath(dst))
        real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", failing_replace)
    reader = task.agent("reader")
    with pytest.raises(OSError, match="marked consumed by 'reader' first") as failed:
        reader.consume("q", dest=dest)
    assert failed.value.errno == errno.EIO
    assert f"could not put the verified data at {os.fspath(dest)!r}" in str(failed.value)
    assert list(tmp_path.iterdir()) == []
    assert task.entry("q").consumed_by == ("reader",)
    monkeypatch.setattr(os, "replace", real_replace)
    assert reader.consume("q", dest=dest).state is om.State.consumed
    assert dest.read_bytes() == b"payload"


def test_a_device_that_took_data_produced_again_before_the_mark_is_told_so(
    task: om.Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device or FIFO takes the verified bytes before the mark (a stream cannot give them
    back); if the entry was produced again meanwhile, the consume stops there (another copy
    into the same stream would follow the first) and says so; nothing is marked. The error
    does not chain back to itself."""
    task.declare("d", stage="collect")
    produce(task, "d", b"first version")
    real_mark = consuming.mark

    def produced_again(*args: Any) -> om.Entry:
        raise DataChanged("d")

    monkeypatch.setattr(consuming, "mark", produced_again)
    sink = tmp_path / "sink"
    sink.symlink_to("/dev/null")
    with pytest.raises(om.NotReady, match=r"written into .*sink.*nothing was marked") as e:
        task.agent("reader").consume("d", dest=sink)
    seen, link = set(), e.value
    while link is not None:  # follow the chain: it ends
        assert id(link) not in seen
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    assert task.entry("d").state is om.State.ready
    monkeypatch.setattr(consuming, "mark", real_mark)
    assert task.agent("reader").consume("d", dest=sink).state is om.State.consumed


def test_broadcast_consume_each_role(task: om.Task) -> None:
    task.declare("b", stage="write", consumers=["checker", "archiver"])
    produce(task, "b", b"for all")
    checker = task.agent("checker-1", role="checker")
    assert checker.consume("b") == b"for all"
    assert task.entry("b").state is om.State.ready
    assert task.agent("checker-2", role="checker").consume("b") == b"for all"  # same role
    assert task.entry("b").consumed_by == ("checker",)
    with pytest.raises(om.NotAConsumer, match="outsider"):
        task.agent("x", role="outsider").consume("b")
    assert task.agent("archiver-1", role="archiver").consume("b") == b"for all"
    entry = task.entry("b")
    assert entry.state is om.State.consumed
    assert set(entry.consumed_by) == {"checker", "archiver"}


def test_tampered_data_is_caught_and_produced_again(task: om.Task, tmp_path: Path) -> None:
    task.declare("t", stage="collect")
    entry = produce(task, "t", b"original bytes")
    assert entry.key
    raw_put(task.store, entry.key, b"tampered bytes")
    dest = tmp_path / "t.out"
    with pytest.raises(
        om.ChecksumMismatch, match=r"^'t': .*/job/data/collect/t@1 holds 14 bytes with xxh3-128:"
    ):
        task.agent("c").consume("t", dest=dest)
    assert not dest.exists() and list(tmp_path.iterdir()) == []
    failed = task.entry("t")
    assert (failed.state, failed.retry_count) == (om.State.failed, 1)
    assert "manifest recorded" in (failed.error or "")
    again = task.agent("producer-2").claim("t")
    assert again is not None and again.epoch == 2
    task.agent("producer-2").put(again, b"fresh bytes")
    assert task.agent("c").consume("t") == b"fresh bytes"


def test_checksum_mismatch_past_max_retries_is_dead_and_blocks_dependents(
    store: om.ObjectStore,
) -> None:
    task = om.Task.create(
        store, "bad-data", stages=["collect", "write"], lease_seconds=30, max_retries=1
    )
    task.declare("t", stage="collect")
    task.declare("uses-t", stage="write", depends_on=["t"])
    reader = task.agent("reader")
    outcomes = []
    for attempt in (1, 2):  # max_retries=1: two productions, each read back wrong
        entry = produce(task, "t", f"attempt {attempt}".encode())
        assert entry.key and entry.epoch == attempt
        raw_put(task.store, entry.key, b"tampered in the store")
        with pytest.raises(om.ChecksumMismatch, match=r"'t'.*now (failed|dead)") as caught:
            reader.consume("t")
        after = task.entry("t")
        outcomes.append((after.state, after.retry_count, after.key))
    assert outcomes == [(om.State.failed, 1, None), (om.State.dead, 2, None)]
    assert "now dead" in str(caught.value)
    with pytest.raises(om.NotClaimable, match=r"state dead"):
        task.agent("producer").claim("t")
    with pytest.raises(om.NotReady, match=r"'t' is dead"):
        reader.consume("t")
    with pytest.raises(om.NotClaimable, match=r"depends on dead entries: t") as blocked:
        task.agent("writer").claim("uses-t")
    assert blocked.value.reason == "depends on dead entries: t"
    status = task.status()
    assert [(n.file_id, n.state) for n in status.dead] == [("t", om.State.dead)]
    assert [(n.file_id, n.reason) for n in status.blocked] == [
        ("uses-t", "depends on dead entries: t")
    ]


# -- bad objects, stores, clients --------------------------------------------------------


@pytest.mark.stage_layout
def test_corrupt_shard_is_reported_and_left_alone(task: om.Task) -> None:
    task.declare("a", stage="collect")
    key = engine(task).shard_key("collect")
    raw_put(task.store, key, b"{not json")
    fresh = om.Task.open(task.store, "job")
    for act in (
        lambda: fresh.entry("a"),
        lambda: fresh.declare("b", stage="collect"),
        lambda: fresh.agent("x").claim(stage="collect"),
    ):
        with pytest.raises(om.CorruptShard, match=r"shards/collect\.json"):
            act()
    # status names it (and counts the rest) rather than failing: it is where to look.
    status = fresh.status()
    assert [(d.key, d.kind) for d in status.damaged] == [(key, "shard")]
    assert status.damaged[0].problem.startswith("not JSON") and "repair" in status.damaged[0].fix
    assert [(n.file_id, n.reason) for n in status.unfinished] == [
        ("a", f"its shard {key} is damaged: run `objmanifest repair`")
    ]
    assert not status.finished and status.stages["write"]["pending"] == 0
    assert raw_get(task.store, key) == b"{not json"
    raw_put(task.store, key, json.dumps({"schema_version": 1, "entries": 5}).encode())
    where = re.escape(task.store.describe(key))  # the full address of the object
    with pytest.raises(om.CorruptShard, match=rf"{where} is corrupt \(does not match the shard"):
        fresh.entry("a")


@pytest.mark.stage_layout
def test_newer_schema_is_refused_and_left_alone(task: om.Task) -> None:
    task.declare("a", stage="collect")
    key = engine(task).shard_key("collect")
    body = json.loads(raw_get(task.store, key))
    body["schema_version"] = 99
    raw_put(task.store, key, json.dumps(body).encode())
    fresh = om.Task.open(task.store, "job")
    with pytest.raises(om.UnsupportedSchema, match="99"):
        fresh.declare("b", stage="collect")
    assert json.loads(raw_get(task.store, key))["schema_version"] == 99
    header = json.loads(raw_get(task.store, "job/task.json"))
    header["schema_version"] = 7
    raw_put(task.store, "job/task.json", json.dumps(header).encode())
    with pytest.raises(om.UnsupportedSchema, match="7"):
        om.Task.open(task.store, "job")
    raw_put(task.store, "job/task.json", b"garbage")
    with pytest.raises(om.CorruptShard, match=r"task\.json"):
        om.Task.open(task.store, "job")


@pytest.mark.parametrize("problem", ["corrupt", "newer-schema"])
@pytest.mark.stage_layout
def test_a_bad_index_is_reported_through_the_task_and_left_alone(
    task: om.Task, problem: str
) -> None:
    task.declare("a", stage="collect")
    key = engine(task).index_key
    if problem == "corrupt":
        bad = b'{"schema_version": 1, "stages": '
        error, match = om.CorruptShard, rf"{re.escape(task.store.describe(key))} is corrupt"
    else:
        body = json.loads(raw_get(task.store, key))
        body["schema_version"] = 99
        bad = json.dumps(body).encode()
        where = re.escape(task.store.describe(key))
        error, match = om.UnsupportedSchema, rf"{where} has schema_version 99"
    raw_put(task.store, key, bad)
    fresh = om.Task.open(task.store, "job")
    shards = {s: raw_get(task.store, engine(task).shard_key(s)) for s in ("collect",)}
    for act in (
        lambda: fresh.entry("a"),
        lambda: fresh.declare("b", stage="collect"),
        lambda: fresh.declare_many([("c", "write", ["a"])]),
        lambda: fresh.agent("x").claim("a"),
        lambda: fresh.agent("x").consume("a"),
    ):
        with pytest.raises(error, match=match) as caught:
            act()
        assert caught.value.key == key
        assert raw_get(task.store, key) == bad  # never overwritten
    assert {s: raw_get(task.store, engine(task).shard_key(s)) for s in shards} == shards
    assert [e.file_id for e in fresh.entries()] == ["a"]  # nothing declared past the index


@pytest.mark.stage_layout
def test_unknown_fields_survive_a_rewrite(task: om.Task) -> None:
    task.declare("a", stage="collect")
    key = engine(task).shard_key("collect")
    body = json.loads(raw_get(task.store, key))
    body["future_field"] = {"kept": True}
    body["entries"]["a"]["future_note"] = "kept too"
    raw_put(task.store, key, json.dumps(body).encode())
    task.agent("x").claim("a")
    after = json.loads(raw_get(task.store, key))
    assert after["future_field"] == {"kept": True}
    assert after["entries"]["a"]["future_note"] == "kept too"


def test_warm_commit_is_one_put_and_unchanged_read_is_304(task: om.Task) -> None:
    task.declare("a", stage="collect")
    agent = task.agent("a1")
    claim = agent.claim("a")
    assert claim is not None
    with requests(task.store) as seen:
        agent.renew(claim)
    assert seen == Counter({"PutObject": 1})
    reads_before = engine(task).docs.stats.not_modified
    with requests(task.store) as seen:
        task.entry("a")
    # The shard only, conditional: the index this process holds already says the stage.
    assert seen == Counter({"GetObject": 1})
    assert engine(task).docs.stats.not_modified == reads_before + 1


@pytest.mark.stage_layout
def test_stale_cache_costs_a_retry_not_a_wrong_answer(store: om.ObjectStore) -> None:
    one = om.Task.create(store, "two-views", stages=["s"], lease_seconds=30)
    one.declare_many([("a", "s"), ("b", "s")])
    mine = one.agent("one").claim("b")
    assert mine is not None
    two = om.Task.open(store, "two-views")
    theirs = two.agent("two").claim("a")  # `one` has a stale cache now
    assert theirs is not None
    conflicts = engine(one).docs.stats.conflicts
    renewed = one.agent("one").renew(mine)  # tried on the stale copy: 412, re-read, retry
    assert engine(one).docs.stats.conflicts == conflicts + 1
    assert renewed.epoch == mine.epoch
    entries = {e.file_id: e for e in one.entries("s")}
    assert (entries["a"].owner, entries["b"].owner) == ("two", "one")  # both changes kept
    with pytest.raises(om.NotClaimable, match="two"):
        one.agent("one").claim("a")
    assert one.agent("one").claim(stage="s") is None


@pytest.mark.s3_only
def test_client_settings_and_own_client(server: Any, prefix: str) -> None:
    store = om.connect(f"s3://objmanifest-test/{prefix}", endpoint_url=server.endpoint_url)
    config = store.client.meta.config
    assert config.s3 == {"addressing_style": "path"}
    assert config.request_checksum_calculation == "when_required"
    assert store.client.meta.region_name
    mine = make_client(server.endpoint_url)
    own = om.connect(f"s3://objmanifest-test/{prefix}", client=mine)
    assert own.client is mine
    om.Task.create(own, "t", stages=["a"])
    assert om.Task.open(store, "t").stages == ("a",)
    with pytest.raises(ValueError, match="s3://"):
        om.connect("http://bucket/x")


@pytest.mark.s3_only
def test_missing_bucket_is_a_clear_error(server: Any) -> None:
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    store = om.connect(f"s3://{bucket}/x", endpoint_url=server.endpoint_url)
    # Opening a task or listing what is under it: every store refuses a missing bucket.
    for act in (
        lambda: om.Task.open(store, "t"),
        lambda: list(store.list_keys("t/")),
    ):
        with pytest.raises(om.StoreError, match=rf"bucket '{bucket}' does not exist") as caught:
            act()
        assert "Traceback" not in str(caught.value) and "create it first" in str(caught.value)
    # Creating one: a clear error too, except on SeaweedFS, which makes the bucket on a
    # first write by its admin identity; then the task must really be there.
    try:
        om.Task.create(store, "t", stages=["a"])
    except om.ObjManifestError as e:
        assert server.name != "seaweedfs", repr(e)
        assert isinstance(e, om.StoreError), repr(e)
        assert f"bucket '{bucket}' does not exist" in str(e)
        assert "Traceback" not in str(e)
    else:
        assert server.name == "seaweedfs"
        assert om.Task.open(store, "t").stages == ("a",)
        assert list(store.list_keys("")) == ["t/task.json"]


def test_threads_race_at_the_store_and_each_entry_is_produced_once(task: om.Task) -> None:
    """Each thread opens the task itself (its own cache and locks), so nothing in the
    process serialises them: their commits race at the store, where only the ETag
    condition keeps two of them from taking one entry."""
    ids = [f"raw/{i}" for i in range(40)]
    task.declare_many([(f, "collect") for f in ids])
    threads_n = 8
    produced: list[tuple[str, str, int]] = []
    conflicts: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(threads_n)

    def work(n: int) -> None:
        mine = om.Task.open(task.store, task.task_id)  # its own cache and per-key locks
        mine.shard("collect")  # everyone starts from the same ETag
        agent = mine.agent(f"t{n}")
        try:
            start.wait(timeout=30)
            while (claim := agent.claim(stage="collect")) is not None:
                agent.put(claim, f"{claim.file_id} by t{n}".encode())
                with lock:
                    produced.append((claim.file_id, agent.name, claim.epoch))
        except BaseException as e:
            with lock:
                errors.append(e)
        finally:
            with lock:
                conflicts.append(engine(mine).docs.stats.conflicts)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    counts = Counter(f for f, _, _ in produced)
    assert [f for f, n in counts.items() if n > 1] == [], "an entry was produced twice"
    assert sorted(counts) == sorted(ids)
    assert len(conflicts) == threads_n
    assert sum(conflicts) > 0, "the threads never lost a race: the test proved nothing"
    reader = om.Task.open(task.store, task.task_id).agent("r")
    for file_id, name, epoch in produced:
        entry = task.entry(file_id)
        assert (entry.state, entry.owner, entry.epoch, entry.retry_count) == (
            om.State.ready,
            name,
            epoch,
            0,
        )
        assert epoch == 1
        assert reader.consume(file_id) == f"{file_id} by {name}".encode()


def test_stale_cache_does_not_hide_an_entry_with_a_foreign_dependency(
    store: om.ObjectStore,
) -> None:
    one = om.Task.create(store, "views", stages=["collect", "write"], lease_seconds=30)
    one.declare("raw", stage="collect")
    p = one.agent("p")
    c = p.claim("raw")
    assert c is not None
    p.put(c, b"raw")
    writer = one.agent("w")
    assert writer.claim(stage="write") is None  # caches an empty write shard
    two = om.Task.open(store, "views")  # another process declares the entry
    two.declare("draft", stage="write", depends_on=["raw"])
    got = writer.claim(stage="write")
    assert got is not None and got.file_id == "draft"


def test_reproduced_data_voids_earlier_marks(task: om.Task) -> None:
    task.declare("b", stage="write", consumers=["a", "b"])
    first = produce(task, "b", b"version 1")
    ra, rb = task.agent("ra", role="a"), task.agent("rb", role="b")
    assert ra.consume("b") == b"version 1"
    assert first.key
    raw_put(task.store, first.key, b"tampered!")
    with pytest.raises(om.ChecksumMismatch, match=r"^'b': .*/b@1 holds 9 bytes .* now failed"):
        rb.consume("b")
    failed = task.entry("b")
    assert failed.consumed_by == () and failed.key is None and failed.checksum is None
    with pytest.raises(om.NotReady, match="failed"):
        ra.consume("b")  # its mark was on data that is gone
    produce(task, "b", b"version 2")
    assert rb.consume("b") == b"version 2"
    assert task.entry("b").state is om.State.ready  # role a has not read version 2 yet
    assert ra.consume("b") == b"version 2"
    assert task.entry("b").state is om.State.consumed


@pytest.mark.parametrize("field", ["depends_on", "consumers"])
def test_a_string_is_not_taken_for_a_list(task: om.Task, field: str) -> None:
    with pytest.raises(ValueError, match=f"{field} must be a list"):
        task.declare("x", stage="write", **{field: "checker"})
    with pytest.raises(ValueError, match=field):
        task.declare_many([{"file_id": "y", "stage": "write", field: "abc"}])
    assert task.shard("write").entries == {}


def test_declare_many_conflict_writes_nothing(task: om.Task) -> None:
    task.declare("old", stage="write", consumers=["checker"])
    versions = {s: task.shard(s).version for s in task.stages}
    index = task.index()
    with pytest.raises(om.DeclarationConflict, match="consumers"):
        task.declare_many(
            [("new", "collect"), ("old", "write", (), ["someone-else"]), ("new2", "check")]
        )
    assert {s: task.shard(s).version for s in task.stages} == versions
    assert task.index() == index
    with pytest.raises(om.NotFound, match="'new' is not declared in task 'job'"):
        task.entry("new")


def test_missing_data_is_produced_again(task: om.Task) -> None:
    task.declare("gone", stage="collect")
    entry = produce(task, "gone", b"soon deleted")
    assert entry.key
    raw_delete(task.store, entry.key)
    with pytest.raises(om.ChecksumMismatch, match="does not exist"):
        task.agent("c").consume("gone")
    after = task.entry("gone")
    assert (after.state, after.retry_count) == (om.State.failed, 1)
    produce(task, "gone", b"made again")
    assert task.agent("c").consume("gone") == b"made again"


def test_a_read_that_breaks_off_is_a_store_error(
    task: om.Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    task.declare("cut", stage="collect")
    produce(task, "cut", b"0123456789")
    real_open = task.store.open

    class BreaksOff:
        """The object's stream, cut after five bytes as a dropped connection cuts it."""

        def __init__(self, stream: Any) -> None:
            self.stream, self.given = stream, 0

        def read(self, size: int = -1) -> bytes:
            if self.given >= 5:
                raise ReadBrokeOff("connection reset by peer")
            chunk: bytes = self.stream.read(5)
            self.given += len(chunk)
            return chunk

        def close(self) -> None:
            self.stream.close()

    monkeypatch.setattr(task.store, "open", lambda key, rng=None: BreaksOff(real_open(key, rng)))
    with pytest.raises(om.StoreError, match="broke off"):
        task.agent("c").consume("cut")
    assert task.entry("cut").state is om.State.ready  # nothing marked, nothing failed
    monkeypatch.undo()
    assert task.agent("c").consume("cut") == b"0123456789"


def test_a_claim_of_a_task_deleted_and_created_again_changes_nothing_of_the_new_one(
    task: om.Task, store: om.ObjectStore
) -> None:
    """A process that opened the task, claimed ``w``, and outlived a ``delete --force`` and
    a new task under the same id, where the same agent claimed ``w`` at the same epoch: its
    put is refused (it would have finished the new task's entry with the old run's bytes),
    and so is any read of the new task through the old object. The new task is as its own
    agents left it; opened again, the old process works on the new task."""
    task.declare("w", "collect")
    old = task.agent("P")
    held = old.claim("w")
    assert held is not None
    om.Task.open(store, "job").delete(force=True)
    new = om.Task.create(store, "job", stages=["collect"], lease_seconds=30)
    new.declare("w", "collect")
    mine = new.agent("P").claim("w")
    assert mine is not None and mine.epoch == held.epoch
    for call in (lambda: old.put(held, b"the old run's bytes"), lambda: task.entry("w")):
        with pytest.raises(om.NotFound, match="deleted and created again since this process"):
            call()
    entry = new.entry("w")
    assert (entry.state, entry.owner, entry.epoch, entry.key) == (
        om.State.writing,
        "P",
        held.epoch,
        None,
    )
    again = om.Task.open(store, "job")
    assert again.agent("P").put(mine, b"the new run's bytes").state is om.State.ready
    assert new.agent("c").consume("w") == b"the new run's bytes"
    # A declaration of the old process that would make a shard of the new task (whose
    # "write" stage has none yet) is refused before anything is written: made, the shard
    # would carry the old creation id and refuse the new task's own agents.
    om.Task.open(store, "job").delete(force=True)
    new = om.Task.create(store, "job", stages=["collect", "write"], lease_seconds=30)
    with pytest.raises(om.NotFound, match="deleted and created again since this process"):
        task.declare("late", "write")
    new.declare("x", "write")
    assert new.entry("x").state is om.State.pending
    with pytest.raises(om.NotFound):
        new.entry("late")
    om.Task.open(store, "job").delete(force=True)
    with pytest.raises(om.NotFound, match="was deleted since this process opened it"):
        task.declare("later", "check")
