"""Chunked entries on real servers: large files in parts, adopted after a crash, fenced
zombies, corrupted parts, aborted uploads, bounded memory.

Producers that crash or stall run as real processes (``tests/workers/chunked.py``) and are
killed or stopped with real signals. Source files are generated deterministically in
``tmp_path`` (pseudo-random 1 MiB blocks) and deleted with it.
"""

from __future__ import annotations

import contextlib
import filecmp
import io
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import objmanifest as om
from objmanifest.core import checksum
from objmanifest.data import chunked as chunked
from objmanifest.data import transfer
from objmanifest.store.errors import PartsRejected
from tests.support.breaking import BreakingFile, BreakingStream
from tests.support.internals import engine
from tests.support.rawstore import get as raw_get
from tests.support.rawstore import put as raw_put
from tests.support.rawstore import requests as requests
from tests.support.stores import Server

WORKER = Path(__file__).parent / "workers" / "chunked.py"
MiB = 1024 * 1024
PART = 5 * MiB
TASK = "job"

BIG = {"seaweedfs": 200 * MiB, "moto": 64 * MiB}
"""The size of the large-file tests; moto serves one request at a time in this process."""


def big_size(server: Server) -> int:
    return BIG.get(server.name, 100 * MiB)


# -- helpers ------------------------------------------------------------------------------


def make_file(path: Path, size: int, seed: int) -> Path:
    """``size`` pseudo-random bytes, the same for the same seed."""
    rnd = random.Random(seed)
    with path.open("wb") as f:
        left = size
        while left:
            block = rnd.randbytes(min(MiB, left))
            f.write(block)
            left -= len(block)
    return path


def task_of(store: om.ObjectStore, lease: float = 30, retries: int = 3) -> om.Task:
    return om.Task.create(store, TASK, stages=["make"], lease_seconds=lease, max_retries=retries)


def uploads(store: om.ObjectStore) -> list[tuple[str, str]]:
    """Unfinished multipart uploads under the store's prefix."""
    return list(store.list_uploads(""))


def state_of(task: om.Task, file_id: str) -> chunked.UploadState:
    key = engine(task).layout.upload_state("make", file_id)
    blob = task.store.get(key)
    assert blob is not None
    return chunked.UploadCodec(task.task_id, "make", file_id).decode(key, blob.body)


def wait_expired(task: om.Task, file_id: str) -> None:
    """Sleep until the store's clock is past the entry's lease and its margin."""
    expiry = task.entry(file_id).lease_expires_at
    assert expiry is not None
    while task.store.now() <= expiry + timedelta(seconds=2.2):
        time.sleep(0.25)


@pytest.fixture(autouse=True)
def _clean_up(request: pytest.FixtureRequest) -> Iterator[None]:
    """Free the server's memory and disk: moto keeps every object in this process."""
    if "store" not in request.fixturenames:
        yield
        return
    store: om.ObjectStore = request.getfixturevalue("store")
    yield
    with contextlib.suppress(Exception):
        for key, upload_id in uploads(store):
            store.abort_upload(key, upload_id)
        for key in list(store.list_keys("")):
            store.delete(key)


# -- child processes -------------------------------------------------------------------------


class Worker:
    """One ``tests/workers/chunked.py`` process, its stdout read as JSON lines by a thread."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self.stderr.extend(self.proc.stderr)

    def next(self, event: str, timeout: float = 60) -> dict[str, Any]:
        """The next line with this event (others are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no {event!r} within {timeout}s; stderr: {''.join(self.stderr)}")
            if line is None:
                self.proc.wait(10)
                pytest.fail(f"exited {self.proc.returncode} before {event!r}: {self.stderr}")
            if line["event"] == event:
                return line

    def wait_stopped(self, timeout: float = 60) -> None:
        """Until the process has stopped itself with SIGSTOP."""
        self.next("stopping", timeout)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
            time.sleep(0.02)
        pytest.fail("the worker did not stop")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def spawn(server: Server, store: om.ObjectStore) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(name: str, *args: str) -> Worker:
        cmd = [
            sys.executable,
            str(WORKER),
            "--bucket",
            store.bucket,
            "--prefix",
            store.prefix,
            "--task",
            TASK,
            "--name",
            name,
            *args,
        ]
        env = {
            **os.environ,
            **server.env,
            "AWS_ENDPOINT_URL": server.endpoint_url,
            "PYTHONUNBUFFERED": "1",
        }
        worker = Worker(cmd, env)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()


# -- sizes and sources -----------------------------------------------------------------------


def test_part_size_grows_to_fit_10000_parts_and_explicit_ones_are_checked() -> None:
    config = transfer.TransferConfig(part_size=8 * MiB)
    assert transfer.part_size_for(10 * MiB, config) == 8 * MiB
    assert transfer.part_size_for(200 * 1024 * MiB, config) == 21 * MiB  # 200 GiB / 10,000
    assert transfer.part_size_for(None, config) == 64 * MiB  # a stream: up to 625 GiB
    with pytest.raises(ValueError, match=r"part_size >= 21 MiB|part_size >= 22020096"):
        transfer.part_size_for(200 * 1024 * MiB, config, explicit=True)
    with pytest.raises(ValueError, match="5 MiB"):
        transfer.TransferConfig(part_size=4 * MiB)
    with pytest.raises(ValueError, match="concurrency"):
        transfer.TransferConfig(concurrency=0)
    with pytest.raises(ValueError, match="5 TiB"):
        transfer.part_size_for(6 * 1024 * 1024 * MiB, config)


def test_transfer_settings_are_per_task_or_per_call_never_process_wide() -> None:
    assert "set_defaults" not in om.__all__ and not hasattr(om, "set_defaults")
    task = om.Task.create(om.MemoryStore("b", "t"), "job", ["make"])
    assert task.transfer == transfer.TransferConfig()
    assert task.transfer.with_overrides(concurrency=2).concurrency == 2
    tuned = transfer.TransferConfig(threshold=1 * MiB, concurrency=3)
    assert om.Task.open(task.store, "job", transfer=tuned).transfer == tuned


def test_multipart_etag_matches_what_s3_computes() -> None:
    etags = ['"4253f2ce3860eaefc76ce7277a395dae"', "91f0d2cad37d33b789d80e2e6a0de2dc"]
    import hashlib

    expected = hashlib.md5(b"".join(bytes.fromhex(checksum.bare_etag(e)) for e in etags))
    assert checksum.multipart_etag(etags) == f"{expected.hexdigest()}-2"
    assert checksum.multipart_etag(["not-an-md5"]) is None


# -- upload, consume, verify -------------------------------------------------------------------


@pytest.mark.heavy
def test_large_file_round_trip_in_parts(
    server: Server, store: om.ObjectStore, tmp_path: Path
) -> None:
    size = big_size(server) + 12345  # a short last part
    src = make_file(tmp_path / "big.bin", size, seed=1)
    task = task_of(store)
    task.declare("big", stage="make")
    agent = task.agent("producer")
    claim = agent.claim("big")
    assert claim is not None
    seen: list[tuple[int, int | None]] = []
    entry = agent.put(
        claim, src, part_size=PART, concurrency=4, progress=lambda d, t: seen.append((d, t))
    )
    parts = -(-size // PART)
    assert (entry.state, entry.size, entry.part_size) == (om.State.ready, size, PART)
    assert entry.checksum and entry.checksum.startswith(f"xxh3-128:composite-{parts}-")
    assert entry.key == "job/data/make/big@1"
    assert entry.parts_key == "job/uploads/make/big.json"
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1] == (size, size)
    shard = task.store.get(engine(task).shard_key("make"))
    assert shard is not None and len(shard.body) < 2000  # the part list is not in the shard
    assert len(state_of(task, "big").parts) == parts
    assert uploads(store) == []

    dest = tmp_path / "out" / "big.bin"
    consumer = task.agent("consumer")
    with requests(store) as seen_ops:
        got = consumer.consume("big", dest=dest, concurrency=4, parents=True)
    assert got.state is om.State.consumed
    # The shard (this task object's index already names the stage), the part list; then a
    # GET per part.
    assert seen_ops["GetObject"] == parts + 2
    assert filecmp.cmp(src, dest, shallow=False)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["big.bin"]
    dest.unlink()
    src.unlink()


def test_chunked_bytes_and_ranged_consume(store: om.ObjectStore) -> None:
    data = random.Random(2).randbytes(2 * 6 * MiB + 100)
    task = task_of(store)
    task.declare("b", stage="make")
    agent = task.agent("p")
    claim = agent.claim("b")
    assert claim is not None
    entry = agent.put(claim, data, part_size=6 * MiB, threshold=MiB)
    assert entry.part_size == 6 * MiB and entry.is_chunked
    with requests(store) as seen:
        assert task.agent("c").consume("b", part_size=5 * MiB) == data
    assert seen["GetObject"] == 2 + 5  # shard, part list; two 6 MiB parts in two ranges each,
    # and the tail


def test_small_data_stays_a_single_object(store: om.ObjectStore, tmp_path: Path) -> None:
    task = task_of(store)
    task.declare_many([("s", "make"), ("t", "make")])
    agent = task.agent("p")
    claim = agent.claim("s")
    assert claim is not None
    with requests(store) as seen:
        entry = agent.put(claim, b"x" * 1000)
    assert not entry.is_chunked and entry.part_size is None
    assert "CreateMultipartUpload" not in seen and seen["GetObject"] == 0
    src = make_file(tmp_path / "t.bin", 3 * MiB, seed=3)
    claim = agent.claim("t")
    assert claim is not None
    assert not agent.put(claim, src, threshold=4 * MiB).is_chunked


def test_a_stream_of_unknown_size_is_chunked(store: om.ObjectStore) -> None:
    data = random.Random(4).randbytes(11 * MiB + 7)
    read_fd, write_fd = os.pipe()

    def feed() -> None:
        with os.fdopen(write_fd, "wb") as w:
            for i in range(0, len(data), 65536):
                w.write(data[i : i + 65536])

    feeder = threading.Thread(target=feed)
    feeder.start()
    task = task_of(store)
    task.declare_many([("stream", "make"), ("small-stream", "make")])
    agent = task.agent("p")
    claim = agent.claim("stream")
    assert claim is not None
    with os.fdopen(read_fd, "rb") as stream:
        assert not stream.seekable()
        entry = agent.put(claim, stream, part_size=5 * MiB, threshold=MiB)
    feeder.join()
    assert entry.is_chunked and entry.size == len(data) and entry.part_size == 5 * MiB
    assert task.agent("c").consume("stream") == data
    claim = agent.claim("small-stream")
    assert claim is not None
    small = io.BufferedReader(io.BytesIO(b"tiny"))  # type: ignore[arg-type]
    assert not agent.put(claim, small).is_chunked


def test_a_source_that_changes_size_is_refused(
    store: om.ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_file(tmp_path / "grow.bin", 12 * MiB, seed=5)
    task = task_of(store)
    task.declare("g", stage="make")
    agent = task.agent("p")
    claim = agent.claim("g")
    assert claim is not None
    real = store.upload_part

    def growing(*args: Any) -> str:
        with src.open("ab") as f:
            f.write(b"more")
        return real(*args)

    monkeypatch.setattr(store, "upload_part", growing)
    with pytest.raises(om.SourceChanged, match=r"grow\.bin changed size \(12582912 ->"):
        agent.put(claim, src, part_size=PART, threshold=MiB)
    assert task.entry("g").state is om.State.writing


def test_a_file_changed_while_a_part_is_sent_is_refused(
    store: om.ObjectStore, tmp_path: Path
) -> None:
    src = make_file(tmp_path / "edit.bin", 12 * MiB, seed=14)
    task = task_of(store)
    task.declare("e", stage="make")
    agent = task.agent("p")
    claim = agent.claim("e")
    assert claim is not None

    def edit_after_signing(**_: Any) -> None:  # between the pass that signs and the one that sends
        with src.open("r+b") as f:
            f.seek(PART + 10)
            f.write(os.urandom(4))

    store.client.meta.events.register("before-send.s3.UploadPart", edit_after_signing)
    try:
        with pytest.raises(om.SourceChanged, match=r"edit\.bin was modified"):
            agent.put(claim, src, part_size=PART, threshold=MiB, concurrency=1)
    finally:
        store.client.meta.events.unregister("before-send.s3.UploadPart", edit_after_signing)


def test_a_named_pipe_is_read_as_a_stream(store: om.ObjectStore, tmp_path: Path) -> None:
    data = random.Random(13).randbytes(7 * MiB)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def feed() -> None:
        with fifo.open("wb") as w:
            w.write(data)

    feeder = threading.Thread(target=feed)
    feeder.start()
    task = task_of(store)
    task.declare("p", stage="make")
    agent = task.agent("p")
    claim = agent.claim("p")
    assert claim is not None
    entry = agent.put(claim, fifo, part_size=PART, threshold=MiB)
    feeder.join()
    assert entry.is_chunked and entry.size == len(data)
    assert task.agent("c").consume("p") == data


def test_a_stream_is_not_adopted_the_next_holder_starts_anew(store: om.ObjectStore) -> None:
    data = random.Random(16).randbytes(4 * PART + 99)  # five parts
    task = task_of(store)
    task.declare("s", stage="make")
    first = task.agent("first")
    claim = first.claim("s")
    assert claim is not None
    broken = io.BufferedReader(BreakingStream(data, 2 * PART + 10, "the producing command died"))
    assert not broken.seekable()
    with pytest.raises(OSError, match="the producing command died"):
        first.put(claim, broken, part_size=PART, threshold=MiB, concurrency=1)
    recorded = state_of(task, "s")
    assert recorded.status == "open" and len(recorded.parts) == 2  # adoptable, were it a file
    assert len(uploads(store)) == 1
    assert first.fail(claim, "its input died").state is om.State.failed

    second = task.agent("second")
    again = second.claim("s")
    assert again is not None and again.epoch == 2
    read_fd, write_fd = os.pipe()

    def feed() -> None:
        with os.fdopen(write_fd, "wb") as w:
            w.write(data)

    feeder = threading.Thread(target=feed)
    feeder.start()
    with requests(store) as seen, os.fdopen(read_fd, "rb") as pipe:
        entry = second.put(again, pipe, part_size=PART, threshold=MiB)
    feeder.join()
    # Nothing adopted: no look at the recorded parts, a new upload, every part sent again.
    # (The one ListParts is the abort's check that the replaced upload still exists.)
    assert (seen["ListParts"], seen["AbortMultipartUpload"]) == (1, 1)
    assert (seen["CreateMultipartUpload"], seen["UploadPart"]) == (1, 5)
    assert (entry.state, entry.key, entry.size) == (om.State.ready, "job/data/make/s@2", len(data))
    assert uploads(store) == []  # the first holder's upload was aborted, not left behind
    assert list(store.list_keys("job/data/")) == ["job/data/make/s@2"]
    assert task.agent("c").consume("s") == data


# -- corruption ---------------------------------------------------------------------------------


def test_a_corrupted_part_is_found_and_nothing_is_left_at_dest(
    store: om.ObjectStore, tmp_path: Path
) -> None:
    data = bytearray(random.Random(6).randbytes(3 * PART + 1000))
    task = task_of(store)
    task.declare("c", stage="make")
    producer = task.agent("p")
    claim = producer.claim("c")
    assert claim is not None
    entry = producer.put(claim, bytes(data), part_size=PART, threshold=MiB)
    assert entry.key is not None
    data[PART + 1234] ^= 0xFF  # one byte of part 2
    raw_put(store, entry.key, bytes(data))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(om.ChecksumMismatch, match=r"part 2 of 4 .*bytes 5242880-10485759"):
        task.agent("c").consume("c", dest=out / "c.bin")
    assert list(out.iterdir()) == []
    failed = task.entry("c")
    assert (failed.state, failed.retry_count) == (om.State.failed, 1)
    assert "part 2" in (failed.error or "")
    assert state_of(task, "c").status == "aborted"  # never to be adopted back

    # Produced again from the same source: a new upload, and the rejected object is gone.
    again = producer.claim("c")
    assert again is not None
    fixed = producer.put(again, bytes(data), part_size=PART, threshold=MiB)
    assert fixed.key == "job/data/make/c@2"
    assert task.agent("c").consume("c") == bytes(data)
    assert uploads(store) == []
    assert list(store.list_keys("job/data/")) == ["job/data/make/c@2"]


def test_a_tampered_part_list_is_a_mismatch(store: om.ObjectStore) -> None:
    data = random.Random(7).randbytes(2 * PART)
    task = task_of(store)
    task.declare("l", stage="make")
    agent = task.agent("p")
    claim = agent.claim("l")
    assert claim is not None
    entry = agent.put(claim, data, part_size=PART, threshold=MiB)
    assert entry.parts_key is not None
    body = json.loads(store.get(entry.parts_key).body)  # type: ignore[union-attr]
    body["parts"][0][2] = "0" * 32
    raw_put(store, entry.parts_key, json.dumps(body).encode())
    with pytest.raises(om.ChecksumMismatch, match="part list"):
        task.agent("c").consume("l")
    assert task.entry("l").state is om.State.failed


def test_data_a_consumer_rejected_is_never_adopted_back(
    store: om.ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The object is intact (its ETag still matches its parts), but a consumer read bad bytes:
    the next holder with the same source must upload anew rather than adopt it."""
    data = random.Random(15).randbytes(2 * PART + 5)
    task = task_of(store)
    task.declare("v", stage="make")
    producer = task.agent("p")
    claim = producer.claim("v")
    assert claim is not None
    producer.put(claim, data, part_size=PART, threshold=MiB)
    real_open = store.open

    class Flipped(io.RawIOBase):
        def __init__(self, body: Any) -> None:
            self.body = body

        def read(self, size: int = -1) -> bytes:
            chunk = bytearray(self.body.read(size))
            if chunk:
                chunk[0] ^= 1
            return bytes(chunk)

    monkeypatch.setattr(
        store, "open", lambda key, byte_range=None: Flipped(real_open(key, byte_range))
    )
    with pytest.raises(om.ChecksumMismatch, match="part 1 of 3"):
        task.agent("c").consume("v", concurrency=1)
    monkeypatch.setattr(store, "open", real_open)
    again = producer.claim("v")
    assert again is not None
    with requests(store) as seen:
        entry = producer.put(again, data, part_size=PART, threshold=MiB)
    assert entry.key == "job/data/make/v@2" and seen["UploadPart"] == 3
    assert task.agent("c").consume("v") == data


def test_a_broken_download_resumes_where_it_stopped(
    store: om.ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = random.Random(8).randbytes(2 * PART + 10)
    task = task_of(store)
    task.declare("r", stage="make")
    agent = task.agent("p")
    claim = agent.claim("r")
    assert claim is not None
    agent.put(claim, data, part_size=PART, threshold=MiB)
    real_open = store.open
    broken: list[tuple[int, int] | None] = []

    class Breaks(io.RawIOBase):
        def __init__(self, body: Any) -> None:
            self.body, self.given = body, 0

        def read(self, size: int = -1) -> bytes:
            if self.given >= MiB:
                raise ConnectionResetError("connection reset by peer")
            chunk: bytes = self.body.read(size)
            self.given += len(chunk)
            return chunk

    def open_once_broken(key: str, byte_range: tuple[int, int] | None = None) -> Any:
        body = real_open(key, byte_range)
        if not broken and byte_range and byte_range[0] == PART:
            broken.append(byte_range)
            return Breaks(body)
        return body

    monkeypatch.setattr(store, "open", open_once_broken)
    assert task.agent("c").consume("r", concurrency=1) == data
    assert broken == [(PART, 2 * PART)]


# -- crash, adoption, fencing ----------------------------------------------------------------


def keeps_every_upload_of_a_part(store: om.ObjectStore) -> bool:
    """Whether a completion may name an earlier upload of a part number (SeaweedFS keeps
    every upload and picks by ETag) or only the last one (AWS and moto keep the last)."""
    key = f"probe-{os.urandom(6).hex()}/part-uploads"
    upload_id = store.create_upload(key)
    try:
        first = store.upload_part(key, upload_id, 1, b"first upload of part 1")
        store.upload_part(key, upload_id, 1, b"second upload of part 1")
        try:
            store.complete_upload(key, upload_id, [first])
        except PartsRejected:
            return False
        assert raw_get(store, key) == b"first upload of part 1"
        return True
    finally:
        with contextlib.suppress(Exception):
            store.abort_upload(key, upload_id)
        with contextlib.suppress(Exception):
            store.delete(key)


@pytest.mark.parametrize(
    ("server", "keeps"), [("seaweedfs", True), ("moto", False)], indirect=["server"]
)
def test_the_part_keeping_probe_knows_the_backends(store: om.ObjectStore, keeps: bool) -> None:
    assert keeps_every_upload_of_a_part(store) is keeps
    assert list(store.list_keys("")) == [] and uploads(store) == []


@pytest.mark.heavy
def test_a_killed_producer_is_adopted_and_only_missing_parts_are_sent(
    server: Server, store: om.ObjectStore, tmp_path: Path, spawn: Callable[..., Worker]
) -> None:
    size = big_size(server)
    src = make_file(tmp_path / "big.bin", size, seed=11)
    parts = -(-size // PART)
    task = task_of(store, lease=3)
    task.declare("big", stage="make")
    first = spawn(
        "first",
        "put",
        "--file-id",
        "big",
        "--path",
        str(src),
        "--stop-after-parts",
        str(parts // 2),
    )
    first.wait_stopped()
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)

    recorded = state_of(task, "big").parts
    assert 0 < len(recorded) < parts
    listed = store.list_parts(
        state_of(task, "big").key or "", state_of(task, "big").upload_id or ""
    )
    assert all(p[3] in listed[p[0]] for p in recorded)

    second = spawn("second", "put", "--file-id", "big", "--path", str(src), "--claim-wait", "30")
    assert second.next("claimed")["epoch"] == 2
    result = second.next("result", timeout=120)
    assert result["outcome"] == "ok", result
    missing = sorted(set(range(1, parts + 1)) - {p[0] for p in recorded})
    assert result["part_numbers"] == missing
    assert result["bytes_sent"] == size - sum(p[1] for p in recorded)
    assert result["stats"]["parts_adopted"] == len(recorded)
    assert result["stats"]["uploads_started"] == 0

    entry = task.entry("big")
    assert (entry.state, entry.epoch, entry.key) == (om.State.ready, 2, "job/data/make/big@1")
    dest = tmp_path / "got.bin"
    task.agent("consumer").consume("big", dest=dest)
    assert filecmp.cmp(src, dest, shallow=False)
    assert uploads(store) == []


@pytest.mark.heavy
@pytest.mark.parametrize("where", ["mid-upload", "before-complete"])
def test_a_stopped_producer_cannot_make_the_entry_ready(
    server: Server, store: om.ObjectStore, tmp_path: Path, spawn: Callable[..., Worker], where: str
) -> None:
    """A SIGSTOPped producer sleeps past its lease; a second one takes the entry over with
    another file and finishes. Woken up, the first cannot make the entry ready, and
    consumers get the second file's bytes. ``before-complete`` stops the first just before
    it completes, and the second too, then lets the first complete first: on SeaweedFS
    (which keeps every upload of a part) its completion succeeds, so the second must see
    the object is not its own and start a new upload."""
    size = 8 * PART + 777
    mine = make_file(tmp_path / "zombie.bin", size, seed=21)
    theirs = make_file(tmp_path / "winner.bin", size, seed=22)
    task = task_of(store, lease=3)
    task.declare("x", stage="make")
    stop = ["--stop-after-parts", "3"] if where == "mid-upload" else ["--stop-before-complete"]
    zombie = spawn(
        "zombie", "put", "--file-id", "x", "--path", str(mine), "--concurrency", "2", *stop
    )
    zombie.wait_stopped()
    winner_stop = ["--stop-before-complete"] if where == "before-complete" else []
    winner = spawn(
        "winner", "put", "--file-id", "x", "--path", str(theirs), "--claim-wait", "30", *winner_stop
    )
    assert winner.next("claimed")["epoch"] == 2
    if where == "before-complete":
        winner.wait_stopped()
        zombie.proc.send_signal(signal.SIGCONT)
        zombie_result = zombie.next("result")
        winner.proc.send_signal(signal.SIGCONT)
        result = winner.next("result", timeout=120)
    else:
        result = winner.next("result", timeout=120)
        zombie.proc.send_signal(signal.SIGCONT)
        zombie_result = zombie.next("result")
    assert result["outcome"] == "ok", result
    assert zombie_result["outcome"] == "LeaseLost", zombie_result

    entry = task.entry("x")
    assert (entry.state, entry.epoch, entry.key) == (om.State.ready, 2, result["key"])
    # mid-upload: the winner takes the zombie's open upload over (at its key), adopts none
    # of its parts (other bytes) and sends every part. before-complete: a store that keeps
    # every upload of a part lets the zombie's completion with its own ETags succeed, so the
    # winner sees the object is not its own and starts anew at a new key; one that keeps
    # the last upload refuses the zombie's completion.
    keeps = keeps_every_upload_of_a_part(store)
    expected = {
        "mid-upload": "job/data/make/x@1",
        "before-complete": "job/data/make/x@2" if keeps else "job/data/make/x@1",
    }
    assert entry.key == expected[where]
    dest = tmp_path / "got.bin"
    task.agent("consumer").consume("x", dest=dest)
    assert filecmp.cmp(theirs, dest, shallow=False)
    assert uploads(store) == []
    data_keys = [k for k in store.list_keys("job/data/")]
    assert data_keys == [entry.key]  # a zombie's completed object does not linger


# -- cleaning up ----------------------------------------------------------------------------------


def test_a_dead_entry_has_its_upload_aborted(store: om.ObjectStore) -> None:
    task = task_of(store, retries=0)
    task.declare("d", stage="make")
    agent = task.agent("p")
    claim = agent.claim("d")
    assert claim is not None
    data = random.Random(9).randbytes(4 * PART)
    with pytest.raises(OSError, match="disk on fire"):
        agent.put(
            claim,
            BreakingFile(data, 2 * PART, "disk on fire"),
            part_size=PART,
            threshold=MiB,  # type: ignore[arg-type]
            concurrency=1,
        )
    assert len(uploads(store)) == 1
    assert len(state_of(task, "d").parts) == 2  # what was sent is kept for an adopter
    assert agent.fail(claim, "disk on fire").state is om.State.dead
    assert uploads(store) == []  # fail() of a dead entry aborted its upload itself
    assert state_of(task, "d").status == "aborted"
    assert task.sweep_uploads() == []


def test_sweep_keeps_adoptable_uploads_and_aborts_orphans(store: om.ObjectStore) -> None:
    task = task_of(store)
    task.declare_many([("kept", "make"), ("orphan", "make")])
    agent = task.agent("p")
    claim = agent.claim("kept")
    assert claim is not None
    data = random.Random(10).randbytes(3 * PART)
    with pytest.raises(OSError, match="disk on fire"):
        agent.put(
            claim,
            BreakingFile(data, PART, "disk on fire"),
            part_size=PART,
            threshold=MiB,
            concurrency=1,
        )  # type: ignore[arg-type]
    agent.fail(claim, "retry later")
    orphan = store.create_upload("job/data/make/orphan@1")  # its starter died
    assert task.sweep_uploads() == ["job/data/make/orphan@1"]
    assert [k for k, _ in uploads(store)] == ["job/data/make/kept@1"]
    assert orphan not in [u for _, u in uploads(store)]

    again = agent.claim("kept")
    assert again is not None
    with requests(store) as seen:
        entry = agent.put(again, data, part_size=PART, threshold=MiB)
    assert seen["UploadPart"] == 2 and entry.key == "job/data/make/kept@1"
    assert task.agent("c").consume("kept") == data


def test_producing_again_as_one_object_aborts_the_old_upload(store: om.ObjectStore) -> None:
    task = task_of(store)
    task.declare("m", stage="make")
    agent = task.agent("p")
    claim = agent.claim("m")
    assert claim is not None
    with pytest.raises(OSError, match="disk on fire"):
        agent.put(
            claim,
            BreakingFile(random.Random(12).randbytes(3 * PART), PART, "disk on fire"),  # type: ignore[arg-type]
            part_size=PART,
            threshold=MiB,
            concurrency=1,
        )
    agent.fail(claim, "try small")
    again = agent.claim("m")
    assert again is not None
    agent.put(again, b"small after all")
    assert uploads(store) == []
    assert task.agent("c").consume("m") == b"small after all"


# -- memory --------------------------------------------------------------------------------------


@pytest.mark.heavy
def test_memory_stays_bounded_by_concurrency_times_part_size(
    server: Server, store: om.ObjectStore, tmp_path: Path, spawn: Callable[..., Worker]
) -> None:
    """A child process moves a file many times larger than concurrency x part size; its peak
    RSS grows by about that, not by the file's size."""
    size = max(big_size(server), 160 * MiB)
    src = make_file(tmp_path / "big.bin", size, seed=31)
    task = task_of(store)
    task.declare("big", stage="make")
    allowed = 2 * 4 * PART + 8 * MiB  # concurrency 4 x 5 MiB, twice, plus code paths
    assert size > 3 * allowed
    up = spawn("p", "put", "--file-id", "big", "--path", str(src), "--concurrency", "4")
    result = up.next("result", timeout=120)
    assert result["outcome"] == "ok", result
    grew = (result["rss_peak"] - result["rss_before"]) * 1024
    assert grew < allowed, f"upload: peak RSS grew {grew / MiB:.0f} MiB, file {size // MiB} MiB"
    out = tmp_path / "out.bin"
    down = spawn("c", "consume", "--file-id", "big", "--concurrency", "4", "--dest", str(out))
    got = down.next("result", timeout=120)
    grew = (got["rss_peak"] - got["rss_before"]) * 1024
    assert grew < allowed, f"download: peak RSS grew {grew / MiB:.0f} MiB, file {size // MiB} MiB"
    assert filecmp.cmp(src, out, shallow=False)
