"""The web status page's views and JSON API, with Starlette's test client, against a real
task on every backend (memory, moto, SeaweedFS): what each view says matches what the
store holds, an idle page costs conditional GETs answered 304 and nothing else, hostile
ids and names come back exact in JSON and escaped in HTML, the token is checked on every
request, and no response carries a credential."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

import objmanifest as om
from objmanifest.cas.blocks import BLOCK
from objmanifest.web import pages
from objmanifest.web.app import create_app
from objmanifest.web.graph import layered
from objmanifest.web.security import (
    check_binding,
    cookie_value,
    host_name,
    is_loopback,
    shown_endpoint,
)
from objmanifest.web.views import Site
from tests.support import rawstore
from tests.support.internals import engine
from tests.support.rawstore import requests as requests

LOCAL = "http://127.0.0.1"
TOKEN = "a-web-token-of-some-length-0123"

HOSTILE_IDS = [
    "<script>alert(1)</script>",
    "q/\"double\" and 'single' quotes.txt",
    "ünï/cødé ✓ 文件.txt",
    "odd/a%2Fb?x=1#frag&y=<b>.bin",
    "sp ace/<img src=x onerror=alert(2)>",
]
HOSTILE_AGENT = '<img src=x onerror=alert(3)> "agent"'
HOSTILE_ERROR = "</script><script>alert(4)</script> & 'done'"
RAW_MARKUP = ("<script>alert", "<img src=x", "</script><script>")


def client_for(site: Site, **kw: Any) -> TestClient:
    return TestClient(create_app(site, **kw), base_url=LOCAL)


def api_path(task_id: str, file_id: str) -> str:
    return f"/api/tasks/{pages.segment(task_id)}/entries/{pages.file_path(file_id)}"


def wait_for(what: str, check: Any, timeout: float = 60.0) -> None:
    """Poll ``check`` until true (a wait for the store's clock to pass a lease, bounded)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not seen within {timeout:g}s"
        time.sleep(0.05)


def scripted(store: om.ObjectStore) -> om.Task:
    """A task in which each state and each kind of attention occurs: ``raw/a`` consumed,
    ``raw/e`` ready, ``raw/c`` dead, ``raw/f`` held by bob with its lease expired, and two
    write entries blocked (one by the dead entry, one waiting for the writing one)."""
    task = om.Task.create(
        store,
        "job",
        stages=["collect", "write"],
        lease_seconds=1,
        max_retries=0,
        partitions={"collect": 2},
    )
    ids = ["raw/a.json", "raw/c.json", "raw/e.json", "raw/f.json"]  # two in each partition
    task.declare_many([{"file_id": f, "stage": "collect"} for f in ids])
    task.declare("out/r.md", stage="write", depends_on=ids)
    task.declare("out/s.md", stage="write", depends_on=["raw/f.json"])
    alice, bob = task.agent("alice"), task.agent("bob")
    for fid in ("raw/a.json", "raw/e.json"):
        claim = alice.claim(fid)
        assert claim is not None
        alice.put(claim, f"data of {fid}".encode())
    claim = bob.claim("raw/c.json")
    assert claim is not None
    bob.fail(claim, "no route to host")
    assert bob.claim("raw/f.json") is not None  # left to expire
    task.agent("reader").consume("raw/a.json")
    wait_for("raw/f.json overdue", lambda: task.status().overdue)
    return task


@pytest.fixture
def job(store: om.ObjectStore) -> om.Task:
    return scripted(store)


pytestmark = pytest.mark.behaviour


# -- the board -----------------------------------------------------------------------------


def test_the_board_counts_each_stage_and_partition_as_the_shards_hold_them(job: om.Task) -> None:
    site = Site(job.store, "job", interval=0)
    board = client_for(site).get("/api/tasks/job").json()
    status = job.status()
    assert board["task_id"] == "job"
    assert [s["stage"] for s in board["stages"]] == ["collect", "write"]
    for row in board["stages"]:
        assert row["counts"] == status.stages[row["stage"]]
        assert row["total"] == sum(status.stages[row["stage"]].values())
    collect = board["stages"][0]
    assert collect["counts"] == {
        "pending": 0,
        "writing": 1,
        "ready": 1,
        "consumed": 1,
        "failed": 0,
        "dead": 1,
    }
    # Each partition counts the entries routed to it, and together they make the stage.
    assert [p["shard"] for p in collect["partitions"]] == engine(job).layout.shards_of("collect")
    for part in collect["partitions"]:
        mine = [
            e
            for e in job.entries("collect")
            if engine(job).layout.shard_of("collect", e.file_id) == part["shard"]
        ]
        assert part["total"] == len(mine)
        assert part["counts"]["ready"] == sum(e.state is om.State.ready for e in mine)
    assert sum(p["total"] for p in collect["partitions"]) == collect["total"] == 4
    assert board["stages"][1]["partitions"] == []
    assert board["totals"] == status.totals
    assert board["finished"] is False


def test_the_board_names_what_needs_attention_as_status_does(job: om.Task) -> None:
    site = Site(job.store, "job", interval=0)
    board = client_for(site).get("/api/tasks/job").json()
    attention = board["attention"]
    assert [n["file_id"] for n in attention["dead"]] == ["raw/c.json"]
    assert attention["dead"][0]["reason"] == "no route to host"
    assert [n["file_id"] for n in attention["overdue"]] == ["raw/f.json"]
    assert "lease of bob expired" in attention["overdue"][0]["reason"]
    blocked = {n["file_id"]: n["reason"] for n in attention["blocked"]}
    assert set(blocked) == {"out/r.md", "out/s.md"}
    assert "dead" in blocked["out/r.md"] and "raw/c.json" in blocked["out/r.md"]
    status = job.status()
    for kind in ("dead", "overdue", "blocked"):
        assert attention[kind] == [n.model_dump(mode="json") for n in getattr(status, kind)]


def test_the_board_counts_throughput_from_the_journal(job: om.Task) -> None:
    site = Site(job.store, "job", interval=0)
    client = client_for(site)
    flow = client.get("/api/tasks/job").json()["stages"][0]["throughput"]
    assert (sum(flow["ready"]), sum(flow["consumed"]), sum(flow["failed"])) == (2, 1, 1)
    # What is committed later counts too, read incrementally from the shards.
    job.declare("raw/g.json", stage="collect")
    claim = job.agent("carol").claim("raw/g.json")
    assert claim is not None
    job.agent("carol").put(claim, b"e")
    board = client.get("/api/tasks/job").json()
    flow = board["stages"][0]["throughput"]
    assert sum(flow["ready"]) == 3
    assert sum(board["throughput"]["total"]["ready"]) == 3
    assert len(flow["ready"]) == board["throughput"]["buckets"] == 10


# -- a stage's entries ---------------------------------------------------------------------


def test_backoff_and_deadline_times_are_shown_as_status_gives_them(store: om.ObjectStore) -> None:
    task = om.Task.create(
        store, "timed", stages=["collect"], retry_backoff=3600, deadlines={"collect": 3600}
    )
    task.declare_many([{"file_id": f, "stage": "collect"} for f in ("done", "broke")])
    agent = task.agent("ann")
    claim = agent.claim("done")
    assert claim is not None
    agent.put(claim, b"data")
    claim = agent.claim("broke")
    assert claim is not None
    agent.fail(claim, "boom")
    client = client_for(Site(store, "timed", interval=0))
    board = client.get("/api/tasks/timed").json()
    status = task.status()
    assert board["attention"]["backing_off"] == [
        n.model_dump(mode="json") for n in status.backing_off
    ]
    assert [n["file_id"] for n in board["attention"]["backing_off"]] == ["broke"]
    rows = {
        r["file_id"]: r for r in client.get("/api/tasks/timed/stages/collect").json()["entries"]
    }
    for fid, row in rows.items():
        entry = task.entry(fid)
        for name in ("claimed_at", "ready_at", "retry_at"):
            value = getattr(entry, name)
            assert row[name] == (value.isoformat() if value is not None else None), (fid, name)
    assert rows["broke"]["retry_at"] is not None and rows["done"]["ready_at"] is not None
    tasks = client_for(Site(store, None, interval=0)).get("/api/tasks").json()["tasks"]
    assert [t["attention"] for t in tasks if t["task_id"] == "timed"] == [1]


def test_a_stages_entries_show_holder_epoch_lease_retries_size_and_checksum(job: om.Task) -> None:
    client = client_for(Site(job.store, "job", interval=0))
    view = client.get("/api/tasks/job/stages/collect").json()
    rows = {r["file_id"]: r for r in view["entries"]}
    assert list(rows) == sorted(rows) == ["raw/a.json", "raw/c.json", "raw/e.json", "raw/f.json"]
    assert view["matched"] == view["total"] == 4
    for fid, row in rows.items():
        entry = job.entry(fid)
        assert row["state"] == entry.state.value
        assert row["holder"] == entry.owner
        assert row["epoch"] == entry.epoch
        assert row["retries"] == entry.retry_count
        assert row["size"] == entry.size
        assert row["checksum"] == entry.checksum
        assert row["partition"] == engine(job).layout.shard_of("collect", fid)
    assert rows["raw/e.json"]["size"] == len(b"data of raw/e.json")
    assert rows["raw/e.json"]["checksum"].startswith("xxh3-128:")
    d = rows["raw/f.json"]
    assert (d["state"], d["holder"], d["epoch"]) == ("writing", "bob", 1)
    assert d["lease_expires_at"] is not None
    assert rows["raw/c.json"]["error"] == "no route to host"
    assert view["counts"]["dead"] == 1 and view["max_retries"] == 0


def test_entries_filter_by_state_and_by_holder(job: om.Task) -> None:
    client = client_for(Site(job.store, "job", interval=0))
    ready = client.get("/api/tasks/job/stages/collect", params={"state": "ready"}).json()
    assert [r["file_id"] for r in ready["entries"]] == ["raw/e.json"]
    assert ready["matched"] == 1 and ready["total"] == 4
    bobs = client.get("/api/tasks/job/stages/collect", params={"agent": "bob"}).json()
    expected = sorted(e.file_id for e in job.entries("collect") if e.owner == "bob")
    assert [r["file_id"] for r in bobs["entries"]] == expected
    assert "raw/f.json" in expected
    assert set(bobs["agents"]) == {e.owner for e in job.entries("collect") if e.owner}
    both = client.get(
        "/api/tasks/job/stages/collect", params={"agent": "bob", "state": "writing"}
    ).json()
    assert [r["file_id"] for r in both["entries"]] == ["raw/f.json"]
    page = client.get("/api/tasks/job/stages/collect", params={"limit": 2, "offset": 2}).json()
    assert [r["file_id"] for r in page["entries"]] == ["raw/e.json", "raw/f.json"]
    assert page["matched"] == 4


def test_bad_filters_and_unknown_names_are_clear_errors(job: om.Task) -> None:
    client = client_for(Site(job.store, "job", interval=0))
    bad = client.get("/api/tasks/job/stages/collect", params={"state": "done"})
    assert bad.status_code == 400
    assert bad.json()["error"] == "InvalidInput" and "pending" in bad.json()["message"]
    assert bad.json()["exit_code"] == 2  # as the command line and the MCP server name it
    assert client.get("/api/tasks/job/stages/collect", params={"limit": "x"}).status_code == 400
    assert client.get("/api/tasks/job/stages/collect", params={"limit": 0}).status_code == 400
    nostage = client.get("/api/tasks/job/stages/nope")
    assert nostage.status_code == 404 and "collect, write" in nostage.json()["message"]
    assert client.get("/api/tasks/other").status_code == 404
    assert client.get("/tasks/other").status_code == 404
    assert client.get("/api/tasks/bad%20id").status_code == 400
    assert client.get(api_path("job", "raw/zzz.json")).status_code == 404
    assert client.get("/api/tasks/job/entries/a/../b").status_code in (400, 404)


def test_a_damaged_shard_is_named_by_the_board_the_stage_and_the_task_list(
    store: om.ObjectStore,
) -> None:
    """A shard that does not parse: the board lists it under damage, the stage's API shows
    the entries of its sound partitions and names the damaged one (never a 500), and the
    task list counts it as needing attention."""
    task = om.Task.create(store, "dmg", stages=["collect", "write"])
    ids = [f"f{n}" for n in range(12)]
    task.declare_many([(f, "collect") for f in ids])
    key = engine(task).shard_key("collect", "f0")
    rawstore.put(store, key, b"{ not json")
    address = store.describe(key)
    hidden = {f for f in ids if engine(task).shard_key("collect", f) == key}
    client = client_for(Site(store, "dmg", interval=0))
    board = client.get("/api/tasks/dmg")
    assert board.status_code == 200, board.text
    objects = board.json()["damage"]["objects"]
    assert [(o["key"], o["kind"]) for o in objects] == [(key, "shard")]
    stage = client.get("/api/tasks/dmg/stages/collect")
    assert stage.status_code == 200, stage.text
    damaged = stage.json()["damaged"]
    assert [(d["key"], d["address"]) for d in damaged] == [(key, address)]
    assert "not JSON" in damaged[0]["problem"]
    assert {e["file_id"] for e in stage.json()["entries"]} == set(ids) - hidden
    listed = client_for(Site(store, None, interval=0)).get("/api/tasks").json()["tasks"]
    row = next(r for r in listed if r["task_id"] == "dmg")
    assert row["damaged"] == 1 and row["attention"] >= 1
    assert rawstore.get(store, key) == b"{ not json"  # the page only looks


# -- an entry ------------------------------------------------------------------------------


def test_an_entry_has_its_history_and_its_lineage_laid_out_in_layers(job: om.Task) -> None:
    client = client_for(Site(job.store, "job", interval=0))
    view = client.get(api_path("job", "raw/c.json")).json()
    assert view["entry"]["state"] == "dead"
    assert view["history"] == [t.to_dict() for t in job.history("raw/c.json")]
    assert [(t["from_state"], t["to_state"]) for t in view["history"]] == [
        (None, "pending"),
        ("pending", "writing"),
        ("writing", "dead"),
    ]
    assert view["history"][-1]["actor"] == "bob"
    root = client.get(api_path("job", "out/r.md")).json()
    lineage = job.lineage("out/r.md")
    assert root["lineage"] == lineage.to_dict()
    graph = root["graph"]
    layer = {n["id"]: n["layer"] for n in graph["nodes"]}
    assert layer == {
        "out/r.md": 0,
        **{f"raw/{x}.json": 1 for x in "acef"},
    }
    x = {n["id"]: n["x"] for n in graph["nodes"]}
    assert all(x["out/r.md"] > x[f"raw/{c}.json"] for c in "acef")  # upstream on the left
    assert sorted((e["from"], e["to"]) for e in graph["edges"]) == sorted(
        (dep, down) for down, dep in lineage.edges
    )
    assert graph["hidden"] == 0


def test_an_entry_page_follows_new_transitions(job: om.Task) -> None:
    client = client_for(Site(job.store, "job", interval=0))
    first = client.get(api_path("job", "raw/e.json"))
    again = client.get(
        api_path("job", "raw/e.json"), headers={"if-none-match": first.headers["etag"]}
    )
    assert again.status_code == 304
    job.agent("reader").consume("raw/e.json")
    after = client.get(
        api_path("job", "raw/e.json"), headers={"if-none-match": first.headers["etag"]}
    )
    assert after.status_code == 200
    assert after.json()["entry"]["state"] == "consumed"
    assert after.json()["history"][-1]["to_state"] == "consumed"


# -- cost: an idle page ----------------------------------------------------------------------


def test_an_idle_board_costs_one_conditional_get_per_shard_the_index_and_the_header(
    job: om.Task,
) -> None:
    # Rebuilt on every request, the worst case; one throughput bucket whose edge is years
    # away, so the board changes only when the shards do, not when a minute turns.
    site = Site(job.store, "job", interval=0, bucket_seconds=1e9, buckets=1)
    client = client_for(site)
    etag = client.get("/api/tasks/job").headers["etag"]  # warm: the journal is read once
    client.get("/api/tasks/job/stages/collect")
    client.get(api_path("job", "out/r.md"))
    stats = engine(site.task("job")).docs.stats
    reads, not_modified = stats.reads, stats.not_modified
    names = engine(job).layout.all_shards(job.stages)
    # A partition nothing was routed to does not exist: each refresh meets its 404 twice.
    missing = sum(1 for n in names if not engine(job).read_shard(n).version)
    # The retention marker of each shard and of the index (a 404 until a trim writes one):
    # status names one that does not decode.
    markers = len(names) + 1
    polls = 5
    with requests(job.store) as seen:
        for _ in range(polls):
            answer = client.get("/api/tasks/job", headers={"if-none-match": etag})
            assert answer.status_code == 304
    # The header too (is it still this task?): a 304 of a raw read, not counted by the stats.
    assert dict(seen) == {"GetObject": polls * (len(names) + 1 + missing + markers + 1)}
    assert stats.reads - reads == polls * (len(names) + 1 + missing + markers)
    assert stats.not_modified - not_modified == polls * (len(names) + 1 - missing)
    with requests(job.store) as seen:
        for _ in range(polls):
            client.get(api_path("job", "out/r.md"))
            client.get("/api/tasks/job/stages/collect")
    assert set(seen) == {"GetObject"}  # no listing, no journal block: 304s only
    answered = seen["GetObject"] - polls * (2 * missing + markers)
    assert stats.not_modified - not_modified >= answered - polls * (len(names) + 1 - missing)


@pytest.mark.stage_layout
def test_a_busy_shard_costs_only_its_new_journal_blocks(store: om.ObjectStore) -> None:
    task = om.Task.create(store, "busy", stages=["collect"])
    for i in range(2 * BLOCK):  # two blocks' worth before the first look
        task.declare(f"f{i:03d}", stage="collect")
    task.flush_journal()
    client = client_for(Site(store, "busy", interval=0))
    client.get("/api/tasks/busy")
    before = blocks(store)
    assert len(before) >= 1
    for i in range(2 * BLOCK, 4 * BLOCK):  # more records than the shard carries
        claim = task.agent("a").claim(f"f{i - 2 * BLOCK:03d}")
        assert claim is not None
    task.flush_journal()
    new = [k for k in blocks(store) if k not in before]
    assert new
    with requests(store) as seen:
        board = client.get("/api/tasks/busy").json()
    # The shard and the index (304 or not), their retention markers (404s), the shard again
    # for its journal, one listing of its journal blocks, and the new blocks only: never
    # the old ones again.
    assert seen["ListObjectsV2"] == 1
    assert seen["GetObject"] == 2 + 2 + 1 + len(new) + 1  # and the header (still this task?)
    flow = board["stages"][0]["throughput"]
    assert sum(flow["ready"]) == 0 and board["totals"]["writing"] == 2 * BLOCK


def blocks(store: om.ObjectStore) -> list[str]:
    return [k for k in rawstore.keys(store, "busy/journal/") if "retention" not in k]


def test_one_snapshot_serves_every_client_within_the_interval(job: om.Task) -> None:
    now = [0.0]
    site = Site(job.store, "job", interval=2.0, monotonic=lambda: now[0])
    clients = [client_for(site) for _ in range(3)]
    clients[0].get("/api/tasks/job")
    with requests(job.store) as seen:
        for client in clients:
            assert client.get("/api/tasks/job").status_code == 200
    assert sum(seen.values()) == 0
    now[0] = 2.5
    with requests(job.store) as seen:
        for client in clients:
            client.get("/api/tasks/job")
    # Once, for all: each shard, the index, their retention markers, and the header (is it
    # still this task?).
    assert seen["GetObject"] == 2 * (len(engine(job).layout.all_shards(job.stages)) + 1) + 1


# -- without a task: the tasks under the URL -------------------------------------------------


def test_without_a_task_the_root_lists_the_tasks_under_the_url(job: om.Task) -> None:
    om.Task.create(job.store, "other", stages=["only"])
    site = Site(job.store, None, interval=0)
    client = client_for(site)
    listing = client.get("/api/tasks").json()
    assert [t["task_id"] for t in listing["tasks"]] == ["job", "other"]
    first = listing["tasks"][0]
    assert first["stages"] == ["collect", "write"]
    assert first["totals"] == job.status().totals
    assert first["attention"] == 4
    assert listing["url"] == job.store.url
    page = client.get("/")
    assert page.status_code == 200 and 'data-view="tasks"' in page.text
    fixed = client_for(Site(job.store, "job", interval=0)).get("/")
    assert 'data-view="board"' in fixed.text and 'data-api="/api/tasks/job"' in fixed.text


# -- hostile names ---------------------------------------------------------------------------


def test_hostile_ids_names_and_errors_are_exact_in_json_and_escaped_in_html(
    store: om.ObjectStore,
) -> None:
    task = om.Task.create(store, "hostile", stages=["in", "out"], max_retries=1)
    task.declare_many([{"file_id": f, "stage": "in"} for f in HOSTILE_IDS])
    task.declare("result", stage="out", depends_on=HOSTILE_IDS)
    agent = task.agent(HOSTILE_AGENT)
    for fid in HOSTILE_IDS[:2]:
        claim = agent.claim(fid)
        assert claim is not None
        agent.put(claim, b"x")
    claim = agent.claim(HOSTILE_IDS[2])
    assert claim is not None
    agent.fail(claim, HOSTILE_ERROR)
    assert agent.claim(HOSTILE_IDS[3]) is not None
    client = client_for(Site(store, None, interval=0))
    entries = client.get("/api/tasks/hostile/stages/in").json()
    assert sorted(r["file_id"] for r in entries["entries"]) == sorted(HOSTILE_IDS)
    assert HOSTILE_AGENT in entries["agents"]
    held = client.get(
        "/api/tasks/hostile/stages/in", params={"agent": HOSTILE_AGENT, "state": "writing"}
    ).json()
    assert [r["file_id"] for r in held["entries"]] == [HOSTILE_IDS[3]]
    for fid in HOSTILE_IDS:
        view = client.get(api_path("hostile", fid))
        assert view.status_code == 200, fid
        assert view.json()["entry"]["file_id"] == fid
        page = client.get(pages.entry_url("hostile", fid))
        assert page.status_code == 200, fid
        for raw in RAW_MARKUP:
            assert raw not in page.text, (fid, raw)
        assert f'data-file="{_attr(fid)}"' in page.text
    failed = client.get(api_path("hostile", HOSTILE_IDS[2])).json()
    assert failed["entry"]["error"] == HOSTILE_ERROR
    assert failed["history"][-1]["error"] == HOSTILE_ERROR
    assert failed["history"][-1]["actor"] == HOSTILE_AGENT
    # A task may be called "entries" or "tasks": the id is still read from the right place.
    named = om.Task.create(store, "entries", stages=["tasks"])
    named.declare("entries/tasks", stage="tasks")
    view = client.get(api_path("entries", "entries/tasks"))
    assert view.status_code == 200 and view.json()["entry"]["file_id"] == "entries/tasks"
    graph = client.get(api_path("hostile", "result")).json()["graph"]
    assert {n["id"] for n in graph["nodes"]} == {"result", *HOSTILE_IDS}
    for path in ("/", "/tasks/hostile", "/tasks/hostile/stages/in", "/api/tasks"):
        body = client.get(path).text
        for raw in RAW_MARKUP:
            assert raw not in body, (path, raw)
    # A 404 page names the id it could not find, escaped too.
    missing = client.get("/tasks/" + quote("<script>x", safe=""))
    assert missing.status_code == 400 and "<script>x" not in missing.text


def _attr(text: str) -> str:
    return (
        text.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
        .replace("'", "&#x27;")
    )


# -- /metrics -------------------------------------------------------------------------------


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of a Prometheus exposition; None if it has none."""
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return float(found.value)
    return None


def test_metrics_give_the_served_tasks_entries_per_stage_and_state(job: om.Task) -> None:
    answer = client_for(Site(job.store, "job", interval=0)).get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    assert answer.headers["cache-control"] == "no-store"
    text = answer.text
    status = job.status()
    for stage, counts in status.stages.items():
        for state, n in counts.items():
            labels = {"task": "job", "stage": stage, "state": state}
            assert sample(text, "objmanifest_entries", **labels) == n, (stage, state)
    assert sample(text, "objmanifest_attention_entries", task="job", stage="collect", kind="dead")
    assert sample(text, "objmanifest_cas_reads_total", task="job")  # what the server read
    # The server commits nothing: its commit counters have no samples.
    assert "# TYPE objmanifest_commits_total counter" in text
    assert "objmanifest_commits_total{" not in text
    assert "objmanifest_commit_seconds_count{" not in text


def test_metrics_without_a_task_cover_every_task_each_family_once(job: om.Task) -> None:
    other = om.Task.create(job.store, "other", stages=["only"])
    other.declare("x", stage="only")
    text = client_for(Site(job.store, None, interval=0)).get("/metrics").text
    assert text.count("# TYPE objmanifest_entries gauge") == 1
    assert sample(text, "objmanifest_entries", task="other", stage="only", state="pending") == 1
    assert sample(text, "objmanifest_entries", task="job", stage="collect", state="ready") == 1


def test_metrics_need_the_token_once_one_is_set(job: om.Task) -> None:
    client = client_for(Site(job.store, "job", interval=0), token=TOKEN)
    refused = client.get("/metrics")
    assert refused.status_code == 401 and "objmanifest_" not in refused.text
    assert client.get("/metrics", headers={"authorization": "Bearer wrong"}).status_code == 401
    ok = client.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and "objmanifest_entries{" in ok.text


# -- who may look ----------------------------------------------------------------------------


def test_every_request_needs_the_token_once_one_is_set(job: om.Task) -> None:
    client = client_for(Site(job.store, "job", interval=0), token=TOKEN)
    for path in ("/", "/api/tasks/job", "/static/app.js", "/api", "/metrics", "/nope"):
        refused = client.get(path)
        assert refused.status_code == 401, path
        assert "?token=" in refused.text
    assert (
        client.get("/api/tasks/job", headers={"authorization": "Bearer wrong"}).status_code == 401
    )
    assert client.get("/api/tasks/job", params={"token": TOKEN[:-1]}).status_code == 401
    ok = client.get("/api/tasks/job", headers={"authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json()["task_id"] == "job"
    # ?token= once: a cookie (a digest of the token, not the token) and the URL without it.
    opened = client.get(
        "/tasks/job/stages/collect",
        params={"token": TOKEN, "state": "ready"},
        follow_redirects=False,
    )
    assert opened.status_code == 303
    assert opened.headers["location"] == "/tasks/job/stages/collect?state=ready"
    cookie = opened.headers["set-cookie"]
    assert TOKEN not in cookie and cookie_value(TOKEN) in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert client.get("/api/tasks/job").status_code == 200  # the client keeps the cookie
    hostile = pages.entry_url("job", "ünï/a%2Fb c.txt")
    again = client.get(hostile, params={"token": TOKEN}, follow_redirects=False)
    assert again.status_code == 303 and again.headers["location"] == hostile
    client.cookies.clear()
    client.cookies.set("objmanifest_web", cookie_value("another token of enough length"))
    assert client.get("/api/tasks/job").status_code == 401


def test_it_is_read_only_and_answers_only_loopback_names_without_a_token(job: om.Task) -> None:
    site = Site(job.store, "job", interval=0)
    client = client_for(site)
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        answer = client.request(method, "/api/tasks/job")
        assert answer.status_code == 405 and answer.headers["allow"] == "GET, HEAD"
    assert client.head("/api/tasks/job").status_code == 200
    for host in ("localhost:8321", "127.0.0.1", "[::1]:80"):
        assert client.get("/api", headers={"host": host}).status_code == 200, host
    for host in ("evil.example", "evil.example:8321", "127.0.0.1.evil.example"):
        assert client.get("/api", headers={"host": host}).status_code == 421, host
    page = client.get("/")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in csp
    # With a token, any Host will do (a reverse proxy's name): the token guards it.
    guarded = client_for(site, token=TOKEN)
    answer = guarded.get(
        "/api", headers={"host": "status.example", "authorization": f"Bearer {TOKEN}"}
    )
    assert answer.status_code == 200


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch, server: Any) -> Iterator[list[str]]:
    """The credentials in the environment (on memory, planted ones), and the account key of
    an Azure store's connection string.

    A placeholder credential shorter than 8 characters (LocalStack's ``test``)
    is a word the page shows anyway (``objmanifest-test``, the bucket); such a
    server's environment gets planted distinctive ones in its place.
    """
    names = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
    short = any(0 < len(os.environ.get(k, "")) < 8 for k in names)
    if not server.s3 or short:
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "planted-SECRET-1b9d")
        monkeypatch.setenv("AWS_SESSION_TOKEN", "planted-SESSION-77ac")
    found = [os.environ[k] for k in names if len(os.environ.get(k, "")) >= 8]
    connection = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
    found += re.findall(r"AccountKey=([^;]{8,})", connection)
    assert found
    yield [*found, TOKEN]


def test_no_response_carries_a_credential(job: om.Task, secrets: list[str]) -> None:
    site = Site(job.store, None, interval=0)
    paths = [
        "/",
        "/api",
        "/api/tasks",
        "/tasks/job",
        "/api/tasks/job",
        "/tasks/job/stages/collect",
        "/api/tasks/job/stages/collect?state=dead",
        pages.entry_url("job", "out/r.md"),
        api_path("job", "out/r.md"),
        "/static/app.js",
        "/static/style.css",
        "/metrics",
        "/tasks/nothing",
        "/api/tasks/job/stages/nope",
    ]
    seen = []
    for token in (None, TOKEN):
        client = client_for(site, token=token)
        for path in paths:
            for headers in ({}, {"authorization": f"Bearer {TOKEN}"}):
                answer = client.get(path, headers=headers, follow_redirects=False)
                seen.append(answer)
        seen.append(client.get("/tasks/job", params={"token": TOKEN}, follow_redirects=False))
    assert {a.status_code for a in seen} >= {200, 303, 401, 404}
    for answer in seen:
        text = answer.text + "".join(f"{k}: {v}\n" for k, v in answer.headers.items())
        for secret in secrets:
            assert secret not in text, (answer.request.url, secret)
    info = client_for(site).get("/api").json()
    assert info["url"] == job.store.url
    assert info["endpoint"] is None or "@" not in info["endpoint"]


# -- the pieces, on their own (no store) -----------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.10", False),
        ("example.com", False),
        ("localhost.example.com", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_non_loopback_host_needs_a_token_of_some_length() -> None:
    assert check_binding("127.0.0.1", None) is None
    assert check_binding("127.0.0.1", "") is None
    assert check_binding("0.0.0.0", TOKEN) == TOKEN
    with pytest.raises(om.InvalidInput, match="OBJMANIFEST_WEB_TOKEN"):
        check_binding("0.0.0.0", None)
    with pytest.raises(om.InvalidInput, match="at least 16"):
        check_binding("0.0.0.0", "short")
    with pytest.raises(om.InvalidInput, match="without spaces"):
        check_binding("127.0.0.1", "a token with spaces in it")


def test_hosts_and_endpoints_as_shown() -> None:
    assert host_name("localhost:8321") == "localhost"
    assert host_name("[::1]:8321") == "::1"
    assert host_name("Example.COM") == "example.com"
    assert host_name(None) is None
    assert shown_endpoint("http://user:pass@127.0.0.1:9000/path?X-Amz-Signature=s") == (
        "http://127.0.0.1:9000"
    )
    assert shown_endpoint("https://s3.amazonaws.com") == "https://s3.amazonaws.com"
    assert shown_endpoint(None) is None
    assert cookie_value(TOKEN) != TOKEN and len(cookie_value(TOKEN)) == 64


def test_file_ids_in_urls_are_quoted_segment_by_segment() -> None:
    assert pages.entry_url("job", "raw/a b?.json") == "/tasks/job/entries/raw/a%20b%3F.json"
    assert pages.entry_url("job", "x/%2F#") == "/tasks/job/entries/x/%252F%23"
    assert pages.stage_url("job", "collect") == "/tasks/job/stages/collect"


def test_a_lineage_is_laid_out_in_columns_by_longest_path() -> None:
    # r <- m <- a, r <- a: a is two steps up by its longest path, so it sits left of m.
    nodes = {k: {"state": "ready", "stage": "s"} for k in ("r", "m", "a", "b")}
    edges = [("r", "m"), ("r", "a"), ("m", "a"), ("m", "b")]
    graph = layered("r", nodes, edges)
    layer = {n["id"]: n["layer"] for n in graph["nodes"]}
    assert layer == {"r": 0, "m": 1, "a": 2, "b": 2}
    x = {n["id"]: n["x"] for n in graph["nodes"]}
    assert x["a"] == x["b"] < x["m"] < x["r"]
    ys = [(n["x"], n["y"]) for n in graph["nodes"]]
    assert len(set(ys)) == len(ys)  # no two nodes in one place
    assert sorted((e["from"], e["to"]) for e in graph["edges"]) == [
        ("a", "m"),
        ("a", "r"),
        ("b", "m"),
        ("m", "r"),
    ]
    assert graph["width"] > 0 and graph["height"] > 0 and graph["hidden"] == 0


def test_a_large_lineage_draws_the_nearest_nodes_and_counts_the_rest() -> None:
    edges = [("r", f"d{i}") for i in range(300)]
    nodes = {"r": {}, **{f"d{i}": {} for i in range(300)}}
    graph = layered("r", nodes, edges, max_nodes=50)
    assert len(graph["nodes"]) == 50 and graph["hidden"] == 251
    assert len(graph["edges"]) == 49


# -- a task deleted or created anew while the page is open -------------------------------------


def test_a_task_deleted_or_created_anew_is_seen_within_an_interval(store: om.ObjectStore) -> None:
    now = [0.0]
    site = Site(store, interval=2.0, monotonic=lambda: now[0])
    client = client_for(site)
    task = om.Task.create(store, "job", stages=["collect", "write"])
    task.declare("a", stage="collect")
    assert client.get("/api/tasks/job").json()["totals"]["pending"] == 1
    assert client.get(api_path("job", "a")).status_code == 200
    task.delete(force=True)
    now[0] += 2.5
    assert client.get("/api/tasks/job").status_code == 404
    assert client.get(api_path("job", "a")).status_code == 404
    fresh = om.Task.create(store, "job", stages=["fetch", "build", "test"])
    fresh.declare("b", stage="build")
    now[0] += 2.5
    board = client.get("/api/tasks/job").json()
    assert board["settings"]["stages"] == ["fetch", "build", "test"]
    assert board["totals"]["pending"] == 1
    assert client.get(api_path("job", "b")).json()["entry"]["stage"] == "build"
    assert client.get(api_path("job", "a")).status_code == 404
    assert client.get("/api/tasks/job/stages/collect").status_code == 404
