"""A rolling upgrade from objmanifest 0.1.0 (schema 1, before the journal) to this release.

``tests/data/task-0.1.0/`` holds every object of a task 0.1.0 wrote and left mid-pipeline
(made by ``tests/data/make_task_0_1_0.py``), and ``tests/data/objmanifest-0.1.0.tar.gz`` is
0.1.0's own source, run in subprocesses (``tests/workers/upgrade.py``) so that both releases
work on one task at once, as they do while agents are upgraded machine by machine. Needs a
real S3 server (the two releases are different processes), so never runs on memory.

The sequence: the new code works on the task at schema 1 and writes nothing 0.1.0 cannot read
(no journal); 0.1.0 still works on it; ``migrate``; the new code finishes the pipeline with a
journal; 0.1.0 is then refused (``UnsupportedSchema``) at every verb and changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

import objmanifest as om
from objmanifest.core import checksum
from objmanifest.core.model import READERS
from tests.support.stores import BUCKET, Server

DATA = Path(__file__).with_name("data")
DUMP = DATA / "task-0.1.0"
RELEASE = DATA / "objmanifest-0.1.0.tar.gz"
WORKER = Path(__file__).parent / "workers" / "upgrade.py"
TASK_ID = "legacy"

pytestmark = [pytest.mark.behaviour, pytest.mark.s3_only]


def load(server: Server, prefix: str) -> None:
    """Every object of the 0.1.0 task, byte for byte, under ``prefix``."""
    client = server.client()
    for path in sorted(DUMP.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(DUMP).as_posix()}"
            client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())


def snapshot(server: Server, prefix: str) -> dict[str, tuple[str, bytes]]:
    """Every object under ``prefix``: its ETag and bytes."""
    client = server.client()
    found: dict[str, tuple[str, bytes]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix=f"{prefix}/"
    ):
        for obj in page.get("Contents", []):
            body = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
            found[obj["Key"]] = (obj["ETag"], body)
    return found


def manifest_objects(snap: dict[str, tuple[str, bytes]]) -> dict[str, dict[str, Any]]:
    """The JSON manifest objects (header, index, shards, upload states) of a snapshot."""
    return {
        key: json.loads(body)
        for key, (_, body) in snap.items()
        if key.endswith(".json") and "/data/" not in key
    }


def old(server: Server, release: Path, *args: str) -> Any:
    """Run tests/workers/upgrade.py under objmanifest 0.1.0; its JSON answer."""
    env = {**os.environ, **server.env, "PYTHONPATH": str(release)}
    env.pop("AWS_ENDPOINT_URL", None)
    done = subprocess.run(
        [sys.executable, str(WORKER), *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def old_cli(server: Server, release: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``objmanifest ARGS`` of release 0.1.0."""
    env = {**os.environ, **server.env, "PYTHONPATH": str(release)}
    env.pop("AWS_ENDPOINT_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "objmanifest", *args],
        cwd=release,  # `-m` puts the working directory first on the path
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def release(tmp_path: Path) -> Path:
    """objmanifest 0.1.0, extracted from the tarball checked into tests/data."""
    where = tmp_path / "objmanifest-0.1.0"
    with tarfile.open(RELEASE) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tar.extractall(where, filter="data")
        else:
            tar.extractall(where)  # the project's own release, checked in
    return where


def test_rolling_upgrade_from_0_1_0(server: Server, prefix: str, release: Path) -> None:
    load(server, prefix)
    url = f"s3://{BUCKET}/{prefix}"
    store = server.connect(prefix)
    before = snapshot(server, prefix)
    header_key = f"{prefix}/{TASK_ID}/task.json"
    assert json.loads(before[header_key][1])["schema_version"] == 1

    # 1. New code on a schema-1 task: it reads and writes at 1, with no journal.
    task = om.Task.open(store, TASK_ID)
    held = task.entry("text-2")
    assert held.lease_expires_at is not None and held.lease_expires_at < store.now(), (
        "the dump's lease of text-2 runs for 60 s after make_task_0_1_0.py: run the test later"
    )
    parser = task.agent("new-parser")
    claim = parser.claim("text-2")  # held by 0.1.0's parser-1, whose lease ran out: a takeover
    assert claim is not None and claim.epoch > 1
    parser.consume("page-2")
    assert parser.put(claim, b"words of page 2, by the new release").state == om.State.ready
    fetcher = task.agent("new-fetcher")
    claim = fetcher.claim("page-4")  # failed once under 0.1.0
    assert claim is not None
    fetcher.put(claim, b"<html>page 4</html>")
    assert task.entry("page-5").state == om.State.dead
    at_one = snapshot(server, prefix)
    assert not [k for k in at_one if "/journal/" in k]
    for key, doc in manifest_objects(at_one).items():
        assert doc["schema_version"] == 1, key
        assert doc.get("journal") is None and doc.get("journal_id") is None, key
    assert at_one[header_key] == before[header_key]
    assert task.history("text-2") == [] and task.log() == []  # no journal below schema 2

    # 2. 0.1.0 still works on the task while it is at 1, and reads what the new code wrote.
    answer = old(server, release, "work", url, server.endpoint_url, TASK_ID)
    assert answer["version"] == "0.1.0"
    assert answer["status"]["stages"]["fetch"] == {
        "pending": 0, "writing": 0, "ready": 1, "consumed": 4, "failed": 0, "dead": 1
    }  # fmt: skip
    assert task.entry("text-3").state == om.State.ready
    assert task.entry("late").state == om.State.ready
    assert task.entry("extra").state == om.State.pending

    # 3. migrate (every agent runs the new code now): the header first, then every object.
    straggler = om.Task.open(store, TASK_ID)  # a new-code agent that opened the task at 1
    moved = task.migrate()
    assert f"{TASK_ID}/task.json" in moved
    assert task.migrate() == []
    migrated = manifest_objects(snapshot(server, prefix))
    header = migrated[header_key]
    assert header["schema_version"] == 2 and header["requires"] == READERS[2] == "0.2.0"
    assert all(doc["schema_version"] == 2 for doc in migrated.values())

    # 4. The new code finishes the pipeline; history and the log cover it from migration on.
    reporter = task.agent("new-reporter")
    claim = reporter.claim("summary")
    assert claim is not None
    reporter.put(claim, b"two pages summarised")
    for file_id in ("page-4", "text-0", "text-1", "text-2", "text-3", "late"):
        assert reporter.consume(file_id)
    assert task.agent("mailer").consume("summary") == b"two pages summarised"
    late_comer = straggler.agent("new-straggler")  # its commits keep the objects at 2
    claim = late_comer.claim("extra")
    assert claim is not None
    late_comer.put(claim, b"extra")
    late_comer.consume("extra")
    assert all(
        d["schema_version"] == 2 for d in manifest_objects(snapshot(server, prefix)).values()
    )
    assert [t.actor for t in task.history("extra")][-3:] == ["new-straggler"] * 3
    status = task.status()
    for stage, counts in status.stages.items():
        assert {s for s, n in counts.items() if n} <= {"consumed", "dead"}, (stage, counts)
    steps = [(t.from_state, t.to_state) for t in task.history("summary")]
    assert steps[-3:] == [
        (om.State.pending, om.State.writing),
        (om.State.writing, om.State.ready),
        (om.State.ready, om.State.consumed),
    ]
    assert [r.command for r in task.log(stage="report")] == [
        "migrate", "claim", "finish", "consume", "consume", "claim", "finish", "consume"
    ]  # fmt: skip
    steps = [(t.command, t.from_state, t.to_state, t.epoch) for t in task.history("text-2")]
    assert steps == [("consume", om.State.ready, om.State.consumed, 2)]  # nothing before 2

    # 5. 0.1.0 is refused at every verb, cleanly, and changes nothing.
    stale_header = release.parent / "header-0.1.0.json"
    stale_header.write_bytes(before[header_key][1])
    finished = snapshot(server, prefix)
    results = old(server, release, "refuse", url, server.endpoint_url, TASK_ID, str(stale_header))
    assert [r["op"] for r in results] == [
        "open", "claim", "put", "declare", "reap", "status", "consume"
    ]  # fmt: skip
    for r in results:
        assert r["error"] == "UnsupportedSchema", r
        assert "schema_version 2" in r["message"] and "reads up to 1" in r["message"], r
    for command in (["status"], ["claim", "--stage", "report", "--agent", "old-cli"], ["reap"]):
        args = [*command, "--json", "--url", url, "--endpoint-url", server.endpoint_url]
        done = old_cli(server, release, *args, "--task", TASK_ID)
        assert done.returncode == 12, (command, done)  # 0.1.0's ExitCode.UNSUPPORTED
        assert "schema_version 2" in done.stdout + done.stderr, (command, done)
    assert snapshot(server, prefix) == finished


def test_chunked_entries_cross_releases_with_their_whole_checksums(
    server: Server, prefix: str, release: Path, tmp_path: Path
) -> None:
    """At schema 1, 0.1.0 consumes a chunked entry this release wrote (its whole-object
    checksum and the upload state's seal are fields 0.1.0 does not know, and keeps); and an
    entry 0.1.0 produces again keeps the whole checksum of this release's earlier upload,
    which the upload state does not bind to 0.1.0's upload: this release then verifies its
    parts only, and consumes it."""
    load(server, prefix)
    url = f"s3://{BUCKET}/{prefix}"
    config = om.TransferConfig(threshold=5 << 20, part_size=5 << 20)
    task = om.Task.open(server.connect(prefix), TASK_ID, transfer=config)
    first, second = os.urandom(11 << 20), os.urandom(12 << 20)
    task.declare_many([("big-new", "report"), ("big-again", "report")])
    maker = task.agent("new-chunker")
    for file_id in ("big-new", "big-again"):
        claim = maker.claim(file_id)
        assert claim is not None
        made = maker.put(claim, first)
        assert made.is_chunked and made.whole_checksum == checksum.of_bytes(first)
    stale = task.entry("big-again").whole_checksum
    key = task.entry("big-again").key
    assert key is not None
    client = server.client()  # damage its stored bytes, so a consumer fails it
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/{key}", Body=second[: len(first)])
    with pytest.raises(om.ChecksumMismatch):
        task.agent("new-reader").consume("big-again")
    assert task.entry("big-again").state is om.State.failed

    source = tmp_path / "second.bin"
    source.write_bytes(second)
    answer = old(server, release, "chunked", url, server.endpoint_url, TASK_ID, str(source))
    assert answer["consumed"] == checksum.of_bytes(first)
    assert answer["entry"]["whole_checksum"] == stale  # kept, from the earlier upload
    again = task.entry("big-again")
    assert (again.state, again.epoch, again.whole_checksum) == (om.State.ready, 2, stale)
    assert task.agent("new-reader").consume("big-again") == second
