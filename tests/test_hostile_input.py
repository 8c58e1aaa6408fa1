"""Hostile input through the Python API: every bad value a clear refusal, nothing of the
user's touched.

Pure input validation runs on ``MemoryStore``; whatever involves the store (writing a
consumed file, corrupt or deleted manifest objects, concurrent uploads) runs against the
real servers of ``tests.support.stores``.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import objmanifest as om
from objmanifest.core.names import MAX_AGENT_BYTES, MAX_ERROR_CHARS
from objmanifest.engine.manifest import Manifest
from objmanifest.store.errors import NoSuchObject
from tests.support import rawstore
from tests.support.internals import engine

MiB = 1024 * 1024
LEASE_MESSAGE = "lease_seconds must be a number of seconds above 0 and at most 2592000"


def memory_task(stages: tuple[str, ...] = ("collect", "write")) -> om.Task:
    store = om.connect(f"memory://harden-{uuid.uuid4().hex[:8]}/p")
    return om.Task.create(store, "job", stages=list(stages), lease_seconds=30, max_retries=2)


def produce(task: om.Task, file_id: str, data: bytes, stage: str = "collect") -> om.Entry:
    task.declare(file_id, stage)
    agent = task.agent("maker")
    claim = agent.claim(file_id)
    assert claim is not None
    return agent.put(claim, data)


@contextlib.contextmanager
def data_reads(store: om.ObjectStore) -> Iterator[Counter[str]]:
    """Count the GETs of data objects the store's client sends while the block runs."""
    seen: Counter[str] = Counter()

    def count(params: dict[str, Any], **_: Any) -> None:
        if "/data/" in params.get("Key", ""):
            seen["data"] += 1

    store.client.meta.events.register("provide-client-params.s3.GetObject", count)
    try:
        yield seen
    finally:
        store.client.meta.events.unregister("provide-client-params.s3.GetObject", count)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


# -- consume(dest=): what is at dest decides how it is written ------------------------------


@pytest.mark.one_server  # the local destination, not the store, is under test
def test_a_device_behind_a_symlink_is_written_into_never_replaced(
    task: om.Task, tmp_path: Path
) -> None:
    produce(task, "a", b"to the void")
    null = tmp_path / "null"
    null.symlink_to("/dev/null")
    task.agent("reader").consume("a", dest=null)
    assert null.is_symlink() and os.readlink(null) == "/dev/null"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert task.entry("a").state is om.State.consumed
    assert [p.name for p in tmp_path.iterdir()] == ["null"]  # no temporary file left


@pytest.mark.one_server  # the local destination, not the store, is under test
def test_a_fifo_receives_the_verified_bytes_and_stays_a_fifo(task: om.Task, tmp_path: Path) -> None:
    data = b"through the pipe " * 1000
    produce(task, "a", data)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    task.agent("reader").consume("a", dest=fifo)
    reader.join(timeout=30)
    assert received == [data]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.one_server  # the local destination, not the store, is under test
def test_a_symlink_to_a_file_is_written_through(task: om.Task, tmp_path: Path) -> None:
    produce(task, "a", b"new bytes")
    real = tmp_path / "real.txt"
    real.write_bytes(b"old bytes")
    link = tmp_path / "link.txt"
    link.symlink_to(real.name)
    task.agent("reader").consume("a", dest=link)
    assert link.is_symlink() and os.readlink(link) == "real.txt"
    assert real.read_bytes() == b"new bytes"


@pytest.mark.one_server  # the local destination, not the store, is under test
def test_a_directory_is_refused_before_anything_is_downloaded(
    task: om.Task, tmp_path: Path
) -> None:
    produce(task, "a", b"never fetched")
    (tmp_path / "inside").write_text("mine")
    with data_reads(task.store) as reads, pytest.raises(IsADirectoryError, match="is a directory"):
        task.agent("reader").consume("a", dest=tmp_path)
    assert reads["data"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["inside"]
    assert task.entry("a").state is om.State.ready


@pytest.mark.one_server  # the local destination, not the store, is under test
def test_a_new_file_gets_0666_less_the_umask_and_a_replaced_file_keeps_its_mode(
    task: om.Task, tmp_path: Path
) -> None:
    produce(task, "a", b"bytes")
    reader = task.agent("reader")
    for mask, wanted in ((0o022, 0o644), (0o027, 0o640), (0o002, 0o664)):
        dest = tmp_path / f"new-{mask:o}"
        with umask(mask):
            reader.consume("a", dest=dest)
        assert stat.S_IMODE(dest.stat().st_mode) == wanted
    for mode in (0o600, 0o640, 0o755):
        dest = tmp_path / f"old-{mode:o}"
        dest.write_bytes(b"old")
        dest.chmod(mode)
        reader.consume("a", dest=dest)
        assert stat.S_IMODE(dest.stat().st_mode) == mode and dest.read_bytes() == b"bytes"


@pytest.mark.one_server  # the local destination, not the store, is under test
def test_missing_parent_directories_are_refused_unless_asked_for(
    task: om.Task, tmp_path: Path
) -> None:
    produce(task, "a", b"deep")
    dest = tmp_path / "no" / "such" / "dir" / "a.txt"
    reader = task.agent("reader")
    with data_reads(task.store) as reads, pytest.raises(FileNotFoundError, match="parents=True"):
        reader.consume("a", dest=dest)
    assert reads["data"] == 0 and list(tmp_path.iterdir()) == []
    assert task.entry("a").state is om.State.ready
    reader.consume("a", dest=dest, parents=True)
    assert dest.read_bytes() == b"deep"


@pytest.mark.one_server  # the local destination, not the store, is under test
def test_writing_into_a_full_device_fails_before_the_entry_is_marked(
    task: om.Task, tmp_path: Path
) -> None:
    produce(task, "a", b"no room")
    full = tmp_path / "full"
    full.symlink_to("/dev/full")
    with pytest.raises(OSError, match=r"cannot write .*full.*not consumed") as refused:
        task.agent("reader").consume("a", dest=full)
    assert refused.value.errno == errno.ENOSPC
    assert task.entry("a").state is om.State.ready and full.is_symlink()


# -- values that poison a task -----------------------------------------------------------------


@pytest.mark.parametrize("lease", [0, -5, math.inf, -math.inf, math.nan, 1e12, True, "300"])
def test_a_lease_out_of_range_is_refused_with_one_message(lease: Any) -> None:
    store = om.connect(f"memory://harden-{uuid.uuid4().hex[:8]}/p")
    with pytest.raises(om.InvalidInput, match=LEASE_MESSAGE):
        om.Task.create(store, "t", stages=["a"], lease_seconds=lease)
    assert list(om.store.list_keys(store, "t/")) == []


@pytest.mark.parametrize("retries", [-1, 1001, 1.5, True, None])
def test_retries_out_of_range_are_refused(retries: Any) -> None:
    store = om.connect(f"memory://harden-{uuid.uuid4().hex[:8]}/p")
    with pytest.raises(om.InvalidInput, match="max_retries must be a whole number from 0 to 1000"):
        om.Task.create(store, "t", stages=["a"], max_retries=retries)


BAD_NAMES = [
    "ev\nil",
    "tab\there",
    "esc\x1b[31m",
    "c1\x9b",
    "",
    "   ",
    "\udcff",
    "x" * 300,
    7,
    "x\u202egpj.exe",
    "\u2066isolate",
]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_agent_names_and_roles_are_checked_like_file_ids(name: Any) -> None:
    task = memory_task()
    with pytest.raises(om.InvalidInput, match="invalid agent name"):
        task.agent(name)
    if name != "":  # an empty role means the agent's name
        with pytest.raises(om.InvalidInput, match="invalid consumer role"):
            task.agent("ok", role=name)
    with pytest.raises(om.InvalidInput, match="invalid consumer role"):
        task.declare("a", "collect", consumers=[name])
    assert task.status().totals["pending"] == 0


def test_an_agent_name_may_be_any_printable_text_up_to_the_limit() -> None:
    task = memory_task()
    task.declare("a", "collect")
    name = "agent@host:1234 ünïcode"
    claim = task.agent(name).claim("a")
    assert claim is not None and task.entry("a").owner == name
    assert task.agent("é" * (MAX_AGENT_BYTES // 2)).name  # 256 bytes of UTF-8


def test_a_long_fail_reason_is_cut_to_the_documented_length() -> None:
    task = memory_task()
    task.declare("a", "collect")
    agent = task.agent("maker")
    claim = agent.claim("a")
    assert claim is not None
    entry = agent.fail(claim, "x" * 120_000)
    assert entry.error is not None and len(entry.error) == MAX_ERROR_CHARS == 1024
    assert entry.error.endswith("[cut to 1024 of 120000 characters]")
    shard = task.store.get(engine(task).shard_key("collect"))
    # The cut reason is kept twice: in the entry and in the journal record of the commit.
    assert shard is not None and b"x" * MAX_ERROR_CHARS not in shard.body
    assert shard.body.count(b"[cut to 1024 of 120000 characters]") == 2
    assert len(shard.body) < 4 * 1024
    again = agent.claim("a")
    assert again is not None
    with pytest.raises(om.InvalidInput, match="a reason must be a string"):
        agent.fail(again, None)  # type: ignore[arg-type]
    assert agent.fail(again, "short").error == "short"


@pytest.mark.behaviour
@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"schema_version": 0, "task_id": "job", "stage": "collect"}', "schema_version 0"),
        (b'{"schema_version": -3, "task_id": "job", "stage": "collect"}', "schema_version -3"),
        (b"\xfe\xff\x00{\x00}\x00\x00garbage\xff", "not JSON: it is not UTF-8 text"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"schema_version": 1, "task_id": "job"}', "stage: Field required"),
    ],
)
@pytest.mark.stage_layout
def test_a_corrupt_shard_names_its_full_address_and_is_never_overwritten(
    task: om.Task, body: bytes, problem: str
) -> None:
    key = engine(task).shard_key("collect")
    rawstore.put(task.store, key, body)
    address = task.store.describe(key)
    assert address.startswith(task.store.url) and address.endswith("/job/shards/collect.json")
    with pytest.raises(om.CorruptShard, match=problem) as caught:
        task.declare("a", "collect")
    message = str(caught.value)
    assert address in message and "journal" not in message
    assert "copies it aside and rebuilds it" in message and "delete it" not in message
    assert caught.value.key == key and caught.value.address == address
    assert rawstore.get(task.store, key) == body


@pytest.mark.behaviour
def test_a_corrupt_header_or_index_says_how_to_repair_it(task: om.Task) -> None:
    rawstore.put(task.store, engine(task).index_key, b"\x00\x01binary")
    with pytest.raises(om.CorruptShard, match="objmanifest repair") as caught:
        task.declare("a", "collect")
    assert task.store.describe(engine(task).index_key) in str(caught.value)
    header = Manifest.header_key("job")
    rawstore.put(task.store, header, b'{"schema_version": 0}')
    with pytest.raises(om.CorruptShard, match="objmanifest init` again") as opened:
        om.Task.open(task.store, "job")
    assert task.store.describe(header) in str(opened.value)


def test_store_urls_with_dot_dot_or_empty_segments_are_refused() -> None:
    for url in ("s3://work/../evil", "s3://work/a//b", "s3://work/./a", "memory://m/a/../b"):
        with pytest.raises(om.InvalidInput, match=r"empty, '\.' or '\.\.' segment"):
            om.connect(url)


@pytest.mark.parametrize(
    "url", ["s3://Bad_Bucket!!/x", "s3://-x/p", "s3://a b/p", "s3://user:pw@bucket/p", "s3://b:80"]
)
def test_a_malformed_bucket_name_is_one_line(url: str) -> None:
    with pytest.raises(om.InvalidInput, match="invalid bucket name") as caught:
        om.connect(url)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "endpoint", ["notaurl", "ftp://host", "http://", "http://h:port", "http://not a url"]
)
def test_a_malformed_endpoint_is_one_line(endpoint: str) -> None:
    with pytest.raises(om.InvalidInput, match="invalid S3 endpoint URL"):
        om.connect("s3://work/p", endpoint_url=endpoint)


@pytest.mark.parametrize("endpoint", ["not a url", "http://a b:4443", "http://h^st", "ftp://h"])
def test_a_malformed_gcs_endpoint_is_invalid_input(
    endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given as --endpoint-url or STORAGE_EMULATOR_HOST: a host with a space was taken and
    failed later, inside the HTTP library (exit 1)."""
    with pytest.raises(om.InvalidInput, match="invalid GCS endpoint URL"):
        om.connect("gs://work/p", endpoint_url=endpoint)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    with pytest.raises(om.InvalidInput, match=r"invalid GCS endpoint URL.*STORAGE_EMULATOR_HOST"):
        om.connect("gs://work/p")


# -- inputs that used to fail with the wrong message -------------------------------------------


@contextlib.contextmanager
def not_s3(status: int) -> Iterator[str]:
    """A web server that answers every request with ``status`` and an empty body."""

    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("status", "what"), [(404, "404 without an S3 error code"), (200, "ETag")])
def test_an_endpoint_that_is_not_s3_is_named_as_such(
    status: int, what: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    with not_s3(status) as endpoint:
        store = om.connect("s3://work/p", endpoint_url=endpoint)
        with pytest.raises(om.StoreError, match=f"does not behave like S3: it answered .*{what}"):
            om.Task.open(store, "job")
        with pytest.raises(om.StoreError, match="does not behave like S3"):
            om.Task.create(store, "job", stages=["a"])


def test_put_refuses_what_it_cannot_upload_and_says_what_it_takes(tmp_path: Path) -> None:
    task = memory_task()
    task.declare("a", "collect")
    agent = task.agent("maker")
    claim = agent.claim("a")
    assert claim is not None
    for wrong in (123, None, 1.5, ["a"]):
        with pytest.raises(TypeError, match=r"bytes \(the data\), a path .* or a binary file"):
            agent.put(claim, wrong)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match=r"takes a str as the path .* pass bytes"):
        agent.put(claim, "hello")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        agent.put(claim, tmp_path)
    assert task.entry("a").state is om.State.writing
    assert agent.put(claim, b"hello").state is om.State.ready


def test_a_bare_string_or_dict_where_a_list_is_meant_is_refused() -> None:
    store = om.connect(f"memory://harden-{uuid.uuid4().hex[:8]}/p")
    with pytest.raises(om.InvalidInput, match="stages must be a list of stage names"):
        om.Task.create(store, "t", stages="abc")
    with pytest.raises(om.InvalidInput, match="stages must be a list"):
        om.Task.create(store, "t", stages={"a": 1})  # type: ignore[arg-type]
    task = memory_task()
    for batch in ({"file_id": "a", "stage": "collect"}, "abc", b"ab"):
        with pytest.raises(om.InvalidInput, match="declare_many\\(\\) takes a list"):
            task.declare_many(batch)  # type: ignore[arg-type]
    with pytest.raises(om.InvalidInput, match="a declaration is a Declaration, a dict or a"):
        task.declare_many(["a"])  # type: ignore[list-item]
    with pytest.raises(om.InvalidInput, match="not a dict"):
        task.declare("a", "collect", depends_on={"b": 1})  # type: ignore[arg-type]
    assert task.status().totals["pending"] == 0


@pytest.mark.parametrize("file_id", ["", "../x", "/abs", "a//b", "a\nb", "\udcff"], ids=repr)
def test_reading_an_invalid_file_id_is_invalid_not_missing(file_id: str) -> None:
    task = memory_task()
    with pytest.raises(om.InvalidFileId, match="invalid file id"):
        task.entry(file_id)
    with pytest.raises(om.InvalidFileId, match="invalid file id"):
        task.agent("x").claim(file_id)


def test_one_batch_naming_an_id_twice_differently_is_refused_whole() -> None:
    task = memory_task()
    with pytest.raises(om.DeclarationConflict, match=r"declares 'a' twice, differently .*stage"):
        task.declare_many([{"file_id": "b", "stage": "collect"}, ("a", "collect"), ("a", "write")])
    with pytest.raises(om.DeclarationConflict, match=r"twice, differently .*consumers"):
        task.declare_many([("a", "collect", [], ["x"]), ("a", "collect", [], ["y"])])
    assert task.index().file_ids() == frozenset()
    assert len(task.declare_many([("a", "collect"), ("a", "collect")])) == 2  # the same: fine


def test_claim_many_refuses_a_bool_limit() -> None:
    task = memory_task()
    with pytest.raises(om.InvalidInput, match="limit must be a whole number"):
        task.agent("x").claim_many("collect", limit=True)


# -- damage a user should be told about ------------------------------------------------------


@pytest.mark.behaviour
@pytest.mark.stage_layout
def test_an_id_in_a_shard_but_not_in_the_index_is_refused_until_repaired(task: om.Task) -> None:
    task.declare("a", "collect")
    task.declare("b", "write", depends_on=["a"])
    task.store.delete(engine(task).index_key)  # by hand
    with pytest.raises(om.CorruptShard, match="lacks 'a', which shard 'collect' holds") as caught:
        task.declare("a", "check")
    assert "objmanifest repair" in str(caught.value)
    assert "a" not in task.shard("check").entries
    status = task.status()
    assert {(n.file_id, n.stage) for n in status.unindexed} == {("a", "collect"), ("b", "write")}
    assert all("objmanifest repair" in n.reason for n in status.unindexed)
    assert sorted(task.repair_index()) == ["a", "b"]
    assert task.repair_index() == []
    assert task.index().dependencies("b") == frozenset({"a"})
    assert task.status().unindexed == []
    with pytest.raises(om.DeclarationConflict, match="stage"):
        task.declare("a", "check")
    task.declare("a", "collect")  # the same declaration again: a no-op


@pytest.mark.behaviour
@pytest.mark.stage_layout
def test_an_id_in_the_index_but_in_no_shard_is_flagged_and_a_rerun_finishes_it(
    task: om.Task,
) -> None:
    task.declare("a", "collect")
    task.declare("c", "write")
    task.store.delete(engine(task).shard_key("collect"))
    status = task.status()
    assert [(n.file_id, n.stage, n.reason) for n in status.unfinished] == [
        ("a", "collect", "declared, not yet in its shard: rerun the declare")
    ]
    assert not status.finished
    assert task.declare("a", "collect").state is om.State.pending
    assert task.status().unfinished == []


# -- uploads nobody will finish ------------------------------------------------------------------


@pytest.mark.behaviour
def test_the_loser_of_two_concurrent_puts_of_one_claim_aborts_its_upload(
    store: om.ObjectStore, server: Any, prefix: str
) -> None:
    """Both start before either records an upload, so both upload to the same key; the one
    whose upload is replaced learns it at its next record and aborts its own upload."""
    task = om.Task.create(store, "job", stages=["make"], lease_seconds=60)
    task.declare("big", "make")
    claim = task.agent("maker").claim("big")
    assert claim is not None
    first_store, second_store = server.connect(prefix), server.connect(prefix)
    first, second = om.Task.open(first_store, "job"), om.Task.open(second_store, "job")
    second_read, first_began, second_began = threading.Event(), threading.Event(), threading.Event()
    state_key = engine(task).layout.upload_state("make", "big")

    def after(store: om.ObjectStore, method: str, done: threading.Event, key: str) -> None:
        """Set ``done`` once ``method`` on ``key`` has answered (a read, even NoSuchObject; a
        write only when it landed)."""
        original: Callable[..., Any] = getattr(store, method)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                result = original(*args, **kwargs)
            except NoSuchObject:
                if args[0] == key and method == "get":
                    done.set()
                raise
            if args[0] == key:
                done.set()
            return result

        setattr(store, method, wrapper)

    def before(store: om.ObjectStore, method: str, wait: threading.Event) -> None:
        original: Callable[..., Any] = getattr(store, method)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            assert wait.wait(60), f"{method} waited in vain"
            return original(*args, **kwargs)

        setattr(store, method, wrapper)

    after(second_store, "get", second_read, state_key)
    after(first_store, "put", first_began, state_key)
    after(second_store, "put", second_began, state_key)
    before(second_store, "create_upload", first_began)  # the second starts after the first
    before(first_store, "upload_part", second_began)  # the first sends after the second began

    data_first, data_second = os.urandom(6 * MiB), os.urandom(6 * MiB)
    outcome: dict[str, Any] = {}

    def put(name: str, t: om.Task, data: bytes) -> None:
        try:
            outcome[name] = t.agent("maker").put(claim, data, threshold=MiB, part_size=5 * MiB)
        except Exception as e:
            outcome[name] = e

    second_thread = threading.Thread(target=put, args=("second", second, data_second))
    second_thread.start()
    assert second_read.wait(60)
    put("first", first, data_first)
    second_thread.join(120)
    try:
        assert isinstance(outcome["first"], om.LeaseLost), outcome
        assert "no longer the entry's upload" in str(outcome["first"])
        assert isinstance(outcome["second"], om.Entry) and outcome["second"].state is om.State.ready
        assert task.agent("reader").consume("big") == data_second
        assert rawstore.multipart_uploads(store, "job/") == []
    finally:
        rawstore.abort_uploads(store, "job/")
