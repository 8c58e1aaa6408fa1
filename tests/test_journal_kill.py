"""No journal record is lost when writers die: real agent processes are SIGKILLed at each
point of the journal's sequence, then every version of the stage shard and the index must
have exactly one record.

A version's record travels inside the version itself; once an object carries a whole block
of records, its committer writes them to a write-once block in the background, and its next
commit drops them from the object. Each worker below is killed at one point of that: before
a shard commit reaches the store, after it is applied but before its answer, before and
after a block write, before and after the first commit that follows a block write, and
after an index commit. The next worker carries on from whatever state the last one left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import objmanifest as om
from tests.support.faults import FaultProxy
from tests.support.internals import engine
from tests.support.stores import Server

WORKER = Path(__file__).parent / "workers" / "journal.py"

KILL_POINTS = [
    # (method, path contains, nth, phase, counted only after a request containing ...)
    ("PUT", "/shards/s.json", 5, "before", None),
    ("PUT", "/shards/s.json", 7, "after", None),
    ("PUT", "/journal/", 1, "before", None),
    ("PUT", "/journal/", 1, "after", None),
    ("PUT", "/shards/s.json", 1, "before", "/journal/"),
    ("PUT", "/shards/s.json", 1, "after", "/journal/"),
    ("PUT", "/index.json", 3, "after", None),
]
COUNT = 40
"""Entries a worker produces if nobody kills it: 120 shard commits, 40 index commits."""


def run_worker(
    server: Server,
    store: om.ObjectStore,
    endpoint: str,
    name: str,
    proxy: FaultProxy | None = None,
    point: tuple[str, str, int, str, str | None] | None = None,
) -> tuple[int, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            "--endpoint",
            endpoint,
            "--bucket",
            store.bucket,
            "--prefix",
            store.prefix,
            "--name",
            name,
            "--count",
            str(COUNT),
        ],
        env={**os.environ, **server.env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if proxy is not None and point is not None:
        method, path, nth, phase, after_seen = point
        proxy.kill_client(proc.pid, method, path, nth, phase, after_seen)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out + err


@pytest.mark.one_server  # the kills are the proxy's, not the server's
def test_writers_killed_at_every_point_of_the_sequence_lose_no_record(
    server: Server, store: om.ObjectStore
) -> None:
    om.Task.create(store, "job", stages=["s"], lease_seconds=60)
    for n, point in enumerate(KILL_POINTS):
        with FaultProxy(server.endpoint_url) as proxy:
            code, output = run_worker(
                server, store, proxy.endpoint_url, f"w{n}", proxy=proxy, point=point
            )
            assert proxy.killed == 1, f"kill point {point} was never reached: {output}"
        assert code == -9, f"worker at {point} was not killed: {output}"
    code, output = run_worker(server, store, server.endpoint_url, "last")
    assert code == 0 and output.endswith("done\n"), output

    reader = om.Task.open(store, "job")
    for key, codec in [
        (engine(reader).shard_key("s"), engine(reader).codec("s")),
        (engine(reader).index_key, engine(reader).index_codec),
    ]:
        records = engine(reader).journal.records(key, codec)
        doc = engine(reader).docs.read(key, codec)
        newest = codec.version(doc)
        assert [r.version for r in records] == list(range(1, newest + 1)), key
        ids = list(codec.commit_ids(doc))
        assert [r.commit_id for r in records[-len(ids) :]] == ids
        assert newest > 32, key  # blocks were written and records left the object
        assert list(store.list(engine(reader).layout.journal_of(key)))
        carried = codec.journal(doc)
        assert carried is not None and len(carried[1]) <= 2 * 32
    # Every entry a worker saw ready has its making in the journal.
    shard = reader.shard("s")
    for file_id, entry in shard.entries.items():
        if entry.state is om.State.ready:
            steps = reader.history(file_id)
            assert [t.to_state for t in steps][-2:] == ["writing", "ready"], file_id
