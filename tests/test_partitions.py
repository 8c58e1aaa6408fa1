"""Shard layouts: a stage split into hash partitions, and one shard for the whole task.

A split stage is one stage to everyone who reads it (status, entries, claims by stage), and
many objects to the CAS loop: each entry lives in the partition a stable hash of its id
picks, claims by stage start at the agent's home partition (a random one at first, moved to
a random other after a lost race) and move on past those with nothing claimable, and every
commit goes to one partition. The single-shard layout is the baseline
the benchmarks compare against; it must still keep stages apart.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest

import objmanifest as om
from objmanifest.cas.codecs import load_json
from objmanifest.core import checksum
from objmanifest.core.layout import TaskLayout, partition_of
from objmanifest.core.model import READERS
from tests.support.internals import engine
from tests.support.rawstore import delete as raw_delete
from tests.support.rawstore import get as raw_get
from tests.support.stores import Server
from tests.test_cli import Cli, cli  # noqa: F401 (the fixture)
from tests.test_races import STAGE, TASK, Spawn, fresh, payload, spawn  # noqa: F401 (the fixture)

# -- routing (no store) ------------------------------------------------------------------


def test_a_file_id_goes_to_the_same_partition_on_every_machine_and_release() -> None:
    # Pinned values: changing the hash would strand every entry of a live split stage.
    assert [partition_of(f, 16) for f in ("a", "b", "item-00", "données/é")] == [15, 15, 11, 0]
    assert partition_of("x", 1000) == 425
    assert {partition_of(f"f{i}", 1) for i in range(50)} == {0}


def test_a_split_stage_has_one_numbered_shard_per_partition() -> None:
    layout = TaskLayout("t", {"collect": 12})
    names = layout.shards_of("collect")
    assert names == [f"collect~{n:02d}" for n in range(12)]
    assert layout.shards_of("write") == ["write"]
    for fid in ("a", "b", "item-00", "données/é"):
        assert layout.shard_of("collect", fid) == names[partition_of(fid, 12)]
        assert layout.shard_of("write", fid) == "write"
    assert {layout.stage_of_shard(n) for n in names} == {"collect"}
    parsed = layout.parse("t/shards/collect~07.json")
    assert (parsed.kind, parsed.stage, parsed.shard) == ("shard", "collect", "collect~07")
    data = layout.parse(layout.data("collect", "item-00", 3))
    assert (data.stage, data.shard, data.epoch) == (
        "collect",
        names[partition_of("item-00", 12)],
        3,
    )
    assert layout.all_shards(("collect", "write")) == [*names, "write"]
    assert TaskLayout("t", {"c": 10}).shards_of("c")[-1] == "c~9"


def test_a_partition_is_found_by_its_name_and_nothing_else_is() -> None:
    layout = TaskLayout("t", {"collect": 12})
    names = layout.stage_shards("collect")
    assert [layout.partition_number("collect", n) for n in names] == list(range(12))
    assert TaskLayout("u", {"collect": 12}).stage_shards("collect") is names  # made once
    for other in ("collect~12", "collect~7", "collect~-1", "collect", "write~01", "collect~0x"):
        assert layout.partition_number("collect", other) is None
    assert layout.partition_number("write", "write") == 0
    assert layout.partition_number("write", "collect~01") is None
    single = TaskLayout("t", single=True)
    assert single.partition_number("collect", "_task") == 0
    assert single.partition_number("collect", "collect") is None


def test_the_task_layout_has_one_shard_for_every_stage() -> None:
    layout = TaskLayout("t", single=True)
    assert layout.shards_of("collect") == layout.shards_of("write") == ["_task"]
    assert layout.shard_of("write", "x") == "_task"
    assert layout.all_shards(("collect", "write")) == ["_task"]
    assert layout.stage_of_shard("_task") is None
    assert layout.manifest_objects(("collect", "write")) == ["t/shards/_task.json", "t/index.json"]


# -- settings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"partitions": "collect"}, "partitions must map stage names to partition counts"),
        ({"partitions": ["collect"]}, "partitions must map stage names to partition counts"),
        ({"partitions": {"nope": 4}}, "partitions name 'nope', which is not a stage"),
        ({"partitions": {"collect": 0}}, "cannot have 0 partitions: use 1 to 1024"),
        (
            {"partitions": {"collect": 5000}, "spread": False},
            "cannot have 5000 partitions: use 1 to 1024",
        ),
        ({"partitions": {"collect": True}}, "partition count of 'collect' must be a whole number"),
        ({"partitions": {"collect": 2.5}}, "collect"),
        ({"layout": "stages"}, "unknown layout 'stages': use 'task'"),
        ({"layout": "task", "partitions": {"collect": 4}}, "cannot also split stages"),
    ],
)
def test_bad_layouts_are_refused_before_anything_is_written(
    options: dict[str, object], message: str
) -> None:
    store = om.connect(f"memory://layouts/{uuid.uuid4().hex}")
    with pytest.raises(om.InvalidInput, match=message):
        om.Task.create(store, "job", stages=["collect", "write"], **options)  # type: ignore[arg-type]
    assert list(store.list_keys("")) == []


# -- a split stage, on every backend -------------------------------------------------------


def produce_all(task: om.Task, stage: str, agent: str = "p") -> Counter[str]:
    """Claim and put every entry of ``stage``; how many claims came from each shard."""
    worker = task.agent(agent)
    shards: Counter[str] = Counter()
    while (claim := worker.claim(stage=stage)) is not None:
        shards[claim.shard] += 1
        worker.put(claim, claim.file_id.encode())
    return shards


@pytest.mark.behaviour
def test_a_split_stage_is_one_stage_to_its_readers(store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", stages=["collect", "write"], partitions={"collect": 4})
    ids = [f"item-{i:02d}" for i in range(40)]
    task.declare_many([(fid, "collect") for fid in ids])
    task.declare_many([(f"w-{fid}", "write", [fid]) for fid in ids])

    header = json.loads(raw_get(store, "job/task.json"))
    assert (header["schema_version"], header["requires"]) == (3, READERS[3])
    assert header["partitions"] == {"collect": 4}
    names = [f"collect~{n}" for n in range(4)]
    assert engine(task).layout.shards_of("collect") == names

    # Each entry lives in the partition its id hashes to, and only there.
    for name in names:
        held = set(engine(task).read_shard(name).entries)
        assert held == {f for f in ids if names[partition_of(f, 4)] == name}, name
    assert set(engine(task).read_shard("write").entries) == {f"w-{f}" for f in ids}

    claimed = produce_all(task, "collect")
    assert sum(claimed.values()) == 40 and set(claimed) == set(names)
    status = task.status()
    assert status.stages["collect"][om.State.ready] == 40
    assert status.stages["write"][om.State.pending] == 40
    assert sorted(e.file_id for e in task.entries("collect")) == ids
    view = task.shard("collect")
    assert view.stage == "collect" and sorted(view.entries) == ids

    # A dependency in another stage's partition is found: every write entry is claimable.
    writer = task.agent("w")
    claims = writer.claim_many("write", limit=100)
    assert sorted(c.file_id for c in claims) == sorted(f"w-{f}" for f in ids)

    # Another client opens the same layout from the header.
    other = om.Task.open(store, "job")
    assert engine(other).layout == engine(task).layout
    assert other.entry("item-07").state is om.State.ready
    with pytest.raises(om.InvalidInput, match="split into 4 partitions"):
        engine(task).shard_key("collect")
    assert (
        engine(task).shard_key("collect", "item-07")
        == f"job/shards/{names[partition_of('item-07', 4)]}.json"
    )


@pytest.mark.behaviour
def test_claims_by_stage_spread_over_partitions_and_find_the_last_entry(
    store: om.ObjectStore,
) -> None:
    task = om.Task.create(store, "job", stages=["collect"], partitions={"collect": 8})
    task.declare_many([(f"f{i}", "collect") for i in range(40)])
    # Each new agent starts at a random partition: 16 agents all starting at one of 8 would
    # happen about once in 10^14 runs.
    first = [task.agent(f"a{i}").claim(stage="collect") for i in range(16)]
    assert len({c.shard for c in first if c is not None}) > 1
    assert all(c is not None for c in first)
    agent = task.agent("a")
    more = [agent.claim(stage="collect") for _ in range(8)]
    assert all(c is not None for c in more)
    rest = agent.claim_many("collect", limit=100)  # moves on past drained partitions
    assert len(rest) == 16
    claimed = {c.file_id for c in [*first, *more, *rest] if c is not None}
    assert claimed == {f"f{i}" for i in range(40)}
    assert agent.claim(stage="collect") is None


@pytest.mark.behaviour
def test_put_many_over_partitions_commits_once_per_partition(store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", stages=["collect"], partitions={"collect": 4})
    ids = [f"f{i:02d}" for i in range(40)]
    task.declare_many([(fid, "collect") for fid in ids])
    agent = task.agent("w")
    claims = agent.claim_many("collect", limit=40)
    assert len(claims) == 40 and len({c.shard for c in claims}) == 4
    seen: list[om.CommitEvent] = []
    task.subscribe(seen.append)
    results = agent.put_many(claims, [c.file_id.encode() for c in claims])
    assert all(isinstance(r, om.Entry) and r.state is om.State.ready for r in results)
    finishes = Counter(e.key for e in seen if e.command == "finish_many")
    assert finishes == Counter({f"job/shards/collect~{n}.json": 1 for n in range(4)})
    reader = task.agent("r")
    assert [reader.consume(fid) for fid in ids] == [fid.encode() for fid in ids]


@pytest.mark.behaviour
def test_the_task_layout_keeps_stages_apart(store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", stages=["collect", "write"], layout="task")
    assert json.loads(raw_get(store, "job/task.json"))["layout"] == "task"
    task.declare_many([(f"c{i}", "collect") for i in range(5)])
    task.declare_many([(f"w{i}", "write", [f"c{i}"]) for i in range(5)])
    assert sorted(engine(task).read_shard("_task").entries) == sorted(
        [*(f"c{i}" for i in range(5)), *(f"w{i}" for i in range(5))]
    )
    agent = task.agent("a")
    assert agent.claim_many("write", limit=10) == []  # its dependencies are not ready
    claimed = produce_all(task, "collect")
    assert claimed == Counter({"_task": 5})
    writes = agent.claim_many("write", limit=10)
    assert sorted(c.file_id for c in writes) == [f"w{i}" for i in range(5)]
    assert {c.stage for c in writes} == {"write"}
    for c in writes:
        agent.put(c, b"w")
    status = task.status()
    assert status.stages["collect"][om.State.ready] == 5
    assert status.stages["write"][om.State.ready] == 5
    assert sorted(task.shard("write").entries) == [f"w{i}" for i in range(5)]
    for i in range(5):
        task.agent("r").consume(f"c{i}")
    report = task.archive(older_than=0)
    assert report.archived == {"collect": [f"c{i}" for i in range(5)], "write": []}
    assert task.entry("c3").state is om.State.consumed  # from its archive object


@pytest.mark.behaviour
def test_a_deleted_partition_is_rebuilt_from_its_journal(store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", stages=["collect"], partitions={"collect": 3})
    ids = [f"f{i}" for i in range(30)]
    task.declare_many([(fid, "collect") for fid in ids])
    produce_all(task, "collect")
    task.flush_journal()
    lost = engine(task).layout.shard_of("collect", "f0")
    held = set(engine(task).read_shard(lost).entries)
    raw_delete(store, f"job/shards/{lost}.json")

    report = om.Task.open(store, "job").repair()
    (rebuilt,) = report.objects
    assert rebuilt.key == f"job/shards/{lost}.json" and rebuilt.action == "rebuilt"
    again = om.Task.open(store, "job")
    assert set(engine(again).read_shard(lost).entries) == held
    # The other partitions are as they were; the rebuilt one's entries are ready or, where
    # their last records were in the lost object, claimable again: nothing is lost.
    states = {fid: again.entry(fid).state for fid in ids}
    assert {states[f] for f in ids if f not in held} == {om.State.ready}
    assert {states[f] for f in held} <= {om.State.ready, om.State.pending, om.State.failed}
    produce_all(again, "collect", agent="q")
    for fid in ids:
        assert again.agent("r").consume(fid) == fid.encode()


@pytest.mark.behaviour
def test_a_spread_stage_keeps_each_partition_under_prefixes_of_its_own(
    store: om.ObjectStore,
) -> None:
    """S3 serves a rate of requests per key prefix: a spread stage's shards and data are
    under as many prefixes as it has partitions, and the rest of the task works on them."""
    task = om.Task.create(
        store, "job", stages=["collect", "write"], partitions={"collect": "auto"}, agents=40
    )
    assert (task.header.partitions, task.header.spread) == ({"collect": 128}, True)
    header = json.loads(raw_get(store, "job/task.json"))
    assert (header["schema_version"], header["requires"], header["spread"]) == (4, READERS[4], True)
    ids = [f"item/{i:02d}" for i in range(40)]
    task.declare_many([(fid, "collect") for fid in ids] + [("w", "write")])
    produce_all(task, "collect")
    produce_all(task, "write")
    keys = [row.key for row in store.list("job/")]
    shards = {k for k in keys if k.startswith("job/shards/")}
    data = {k for k in keys if k.startswith("job/data/")}
    used = {engine(task).layout.shard_of("collect", fid) for fid in ids}
    assert shards == {f"job/shards/{name}/shard.json" for name in used} | {"job/shards/write.json"}
    assert data == {f"job/data/{engine(task).layout.shard_of('collect', f)}/{f}@1" for f in ids} | {
        "job/data/write/w@1"
    }
    assert len({k.rpartition("/")[0] for k in shards}) == len(used) + 1
    assert task.status().stages["collect"][om.State.ready] == 40
    assert task.agent("r").consume(ids[0]) == ids[0].encode()
    assert task.gc(dry_run=True).removed == []
    task.flush_journal()
    lost = engine(task).layout.shard_of("collect", ids[1])
    held = set(engine(task).read_shard(lost).entries)
    raw_delete(store, f"job/shards/{lost}/shard.json")
    (rebuilt,) = om.Task.open(store, "job").repair().objects
    assert (rebuilt.key, rebuilt.action) == (f"job/shards/{lost}/shard.json", "rebuilt")
    again = om.Task.open(store, "job")
    assert set(engine(again).read_shard(lost).entries) == held
    # Its records were all in the object (no block yet): claimable again, nothing lost.
    assert again.entry(ids[1]).state in (om.State.ready, om.State.pending, om.State.failed)
    produce_all(again, "collect", agent="q")
    assert again.agent("r").consume(ids[1]) == ids[1].encode()


def test_a_spread_task_is_refused_by_a_release_that_reads_flat_keys() -> None:
    """0.3.0 reads headers up to schema 3: it refuses a spread task and names the release
    that reads it, rather than look for its shards at the flat keys."""
    store = om.connect(f"memory://spread-{uuid.uuid4().hex[:8]}")
    om.Task.create(store, "job", stages=["collect"], partitions={"collect": 64})
    blob = store.get("job/task.json")
    assert blob is not None
    with pytest.raises(om.UnsupportedSchema, match=r"0\.4\.0"):
        load_json("job/task.json", blob.body, 3)
    flat = om.Task.create(store, "flat", stages=["collect"], partitions={"collect": 63})
    assert (flat.header.schema_version, flat.header.spread) == (3, None)
    kept = om.Task.create(
        store, "kept", stages=["collect"], partitions={"collect": 512}, spread=False
    )
    assert (kept.header.schema_version, engine(kept).layout.shard("collect~007")) == (
        3,
        "kept/shards/collect~007.json",
    )


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"partitions": {"collect": "auto"}}, "say how many agents you expect"),
        ({"partitions": {"collect": "many"}, "agents": 3}, "a whole number or 'auto'"),
        ({"partitions": {"collect": "auto"}, "agents": 0}, "agents must be a whole number"),
        ({"partitions": {"collect": "auto"}, "agents": True}, "agents must be a whole number"),
        ({"partitions": {"collect": 2000}, "spread": False}, "up to 16384 in a spread task"),
        ({"partitions": {"collect": 20000}}, "use 1 to 16384"),
        ({"layout": "task", "spread": True}, "cannot be spread"),
        ({"partitions": {"collect": 4}, "spread": "yes"}, "spread must be True, False or None"),
    ],
)
def test_bad_spread_and_auto_settings_are_refused_before_anything_is_written(
    options: dict[str, object], says: str
) -> None:
    store = om.connect(f"memory://spread-{uuid.uuid4().hex[:8]}")
    with pytest.raises(om.InvalidInput, match=says):
        om.Task.create(store, "job", stages=["collect"], **options)  # type: ignore[arg-type]
    assert list(store.list("")) == []


# -- real processes --------------------------------------------------------------------------


@pytest.mark.one_server  # the layout, not the server, is under test
@pytest.mark.heavy
def test_producer_processes_on_a_split_stage_make_each_entry_ready_exactly_once(
    server: Server,
    store: om.ObjectStore,
    spawn: Spawn,  # noqa: F811
) -> None:
    task = om.Task.create(store, TASK, stages=[STAGE], lease_seconds=30, partitions={STAGE: 4})
    ids = [f"item-{i:02d}" for i in range(48)]
    task.declare_many([(fid, STAGE) for fid in ids])
    workers = [spawn(f"producer-{i}", "produce", "--stage", STAGE, wait_go=True) for i in range(4)]
    for w in workers:
        w.next("waiting", timeout=30)
    for w in workers:
        w.send("go")
    produced: list[tuple[str, str, int, str]] = []
    for w in workers:
        out = w.finish(timeout=90)
        assert [x for x in out if x["event"] == "error"] == [], w.name
        produced += [
            (w.name, x["file_id"], x["epoch"], x["key"]) for x in out if x["event"] == "produced"
        ]
    assert sorted(fid for _, fid, _, _ in produced) == ids, "each entry produced once"
    now = fresh(server, store)
    for name, fid, epoch, key in produced:
        entry = now.entry(fid)
        data = payload(fid, name, epoch)
        assert (entry.state, entry.owner, entry.epoch, entry.key) == (om.State.ready, name, 1, key)
        assert entry.checksum == checksum.of_bytes(data)
        assert fid in engine(now).read_shard(engine(now).layout.shard_of(STAGE, fid)).entries
        assert now.agent("reader").consume(fid) == data


# -- the command line ----------------------------------------------------------------------


@pytest.mark.one_server  # the layout, not the server, is under test
def test_init_splits_stages_and_says_so(cli: Cli) -> None:  # noqa: F811
    made = cli.json("init", "collect", "write", "--partitions", "collect=8")
    assert made["partitions"] == {"collect": 8} and made["schema_version"] == 3
    text = cli.run("init", "collect", "write", "--partitions", "collect=8", "--exist-ok").text
    assert "collect in 8 partitions" in text
    clash = cli.json("init", "collect", "write", "--exist-ok", code=9)
    assert "another shard layout" in clash["message"], clash
    cli.run("declare", "a", "--stage", "collect")
    assert cli.json("status")["stages"]["collect"]["pending"] == 1


@pytest.mark.one_server  # the layout, not the server, is under test
def test_init_chooses_partitions_from_the_agents_expected_and_spreads_them(cli: Cli) -> None:  # noqa: F811
    made = cli.json("init", "collect", "write", "--partitions", "collect=auto", "--agents", "40")
    assert (made["partitions"], made["spread"], made["schema_version"]) == (
        {"collect": 128},
        True,
        4,
    )
    again = cli.run(
        "init", "collect", "write", "--partitions", "collect=auto", "--agents", "40", "--exist-ok"
    ).text
    assert "collect in 128 partitions, each under key prefixes of its own" in again
    cli.run("declare", "a", "--stage", "collect")
    assert cli.json("status")["stages"]["collect"]["pending"] == 1
    flat = cli.json(
        "--task", "flat", "init", "c", "--partitions", "c=auto", "--agents", "40", "--no-spread"
    )
    assert (flat["partitions"], flat.get("spread"), flat["schema_version"]) == ({"c": 128}, None, 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--partitions", "collect"], "write STAGE=N or STAGE=auto (like collect=16)"),
        (["--partitions", "collect=auto"], "say how many agents you expect"),
        (["--partitions", "collect=auto", "--agents", "0"], "agents must be a whole number"),
        (["--partitions", "nope=4"], "partitions name 'nope', which is not a stage"),
        (["--partitions", "collect=0"], "cannot have 0 partitions"),
        (["--partitions", "collect=2", "--partitions", "collect=3"], "gives stage 'collect' twice"),
        (["--layout", "task", "--partitions", "collect=4"], "cannot also split stages"),
        (["--layout", "stages"], "invalid choice: 'stages'"),
    ],
)
@pytest.mark.one_server  # the layout, not the server, is under test
def test_init_refuses_a_bad_layout_and_writes_nothing(
    cli: Cli,  # noqa: F811
    args: list[str],
    message: str,
) -> None:
    result = cli.run("init", "collect", "write", *args, code=2)
    assert message in result.stderr, result
    cli.run("status", code=8)  # no task was made
