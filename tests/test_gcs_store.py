"""``GCSStore`` against a real fake-gcs-server and against a double of GCS's JSON API that
enforces what the emulator does not (preconditions on compose and reads, the digests of
uploads): generations as versions, races between threads and processes, an upload adopted
by another process, compose trees, and how each error of GCS is mapped onto the seam."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import objmanifest as om
from objmanifest.core.pacing import SendRate
from objmanifest.errors import AccessDenied, InvalidInput, ReadBrokeOff, StoreError
from objmanifest.local.fakegcs import LocalGCS, start_fakegcs
from objmanifest.local.servers import free_port
from objmanifest.store import PROBE_PREFIX, probe
from objmanifest.store.base import CREATE, Blob, Listed, PutMode
from objmanifest.store.errors import NoSuchObject, OutcomeUnknown, PreconditionFailed, UploadGone
from objmanifest.store.gcs import GCSStore
from objmanifest.store.gcs_client import make_gcs_client
from objmanifest.store.gcs_uploads import PARTS
from objmanifest.store.probe import probe_conditional_writes, probe_store
from tests.support.gcs_double import GCSDouble

BUCKET = "objmanifest-gcs-test"
THREADS = 8
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def fakegcs() -> Iterator[LocalGCS]:
    with start_fakegcs() as local:
        local.create_bucket(BUCKET)
        yield local


@pytest.fixture(scope="module")
def double() -> Iterator[GCSDouble]:
    made = GCSDouble()
    made.create_bucket(BUCKET)
    yield made
    made.stop()


@pytest.fixture(params=["fakegcs", "double"])
def endpoint(request: pytest.FixtureRequest) -> str:
    server = request.getfixturevalue(request.param)
    return str(server.endpoint_url)


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(endpoint: str, prefix: str) -> GCSStore:
    return GCSStore(make_gcs_client(endpoint), BUCKET, prefix)


@pytest.fixture
def on_double(double: GCSDouble, prefix: str) -> GCSStore:
    return GCSStore(make_gcs_client(double.endpoint_url), BUCKET, prefix)


def raw_names(store: GCSStore) -> list[str]:
    """Every object name under the store's prefix, the store's own parts included."""
    return sorted(b.name for b in store.gcs.client.list_blobs(BUCKET, prefix=store.full_key("")))


_PRELUDE = (
    "import sys, json\n"
    "from objmanifest.store.gcs import GCSStore\n"
    "from objmanifest.store.gcs_client import make_gcs_client\n"
    "from objmanifest.store.base import CREATE\n"
    "from objmanifest.store.errors import PreconditionFailed\n"
    "store = GCSStore(make_gcs_client(), sys.argv[1], sys.argv[2])\n"
)
"""What a script run in another process starts with: ``store``, the GCSStore of the bucket
and prefix it was given, on the emulator ``STORAGE_EMULATOR_HOST`` names."""


def elsewhere(endpoint: str, code: str, *args: str) -> subprocess.Popen[str]:
    """Start ``code`` in another Python process (see ``_PRELUDE``)."""
    return subprocess.Popen(
        [sys.executable, "-c", _PRELUDE + code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "STORAGE_EMULATOR_HOST": endpoint},
        cwd=ROOT,
    )


def run_elsewhere(endpoint: str, code: str, *args: str) -> str:
    """Run ``code`` in another Python process to its end; its stdout."""
    process = elsewhere(endpoint, code, *args)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return out


# -- versions are generations ------------------------------------------------------------------


def test_the_version_token_is_the_generation(store: GCSStore) -> None:
    first = store.put("doc", b"v1", metadata={"who": "a"})
    assert first.isdigit() and int(first) > 0
    meta = store.gcs.client.bucket(BUCKET).get_blob(store.full_key("doc"))
    assert str(meta.generation) == first and meta.etag != first  # not GCS's ETag
    assert store.head("doc").etag == first
    assert store.get("doc") == Blob(b"v1", first, {"who": "a"})
    second = store.put("doc", b"v2", mode=PutMode.update(f'"{first}"'))  # quoted works too
    assert int(second) > int(first)
    with pytest.raises(PreconditionFailed):
        store.put("doc", b"v3", mode=PutMode.update(first))
    assert store.get("doc") == Blob(b"v2", second, {})


@pytest.mark.parametrize("token", ["0", '"00000000000000000000000000000000"', "abc", "-5", ""])
def test_a_token_that_is_no_generation_never_matches_and_never_creates(
    store: GCSStore, token: str
) -> None:
    """``ifGenerationMatch=0`` means create-only: an update naming "0" (or an S3 ETag that
    reads as 0) must not turn into a create."""
    with pytest.raises(PreconditionFailed):
        store.put("never", b"x", mode=PutMode.update(token))
    with pytest.raises(NoSuchObject):
        store.head("never")
    etag = store.put("there", b"y")
    with pytest.raises(PreconditionFailed):
        store.put("there", b"z", mode=PutMode.update(token))
    assert store.get("there", if_none_match=token) == Blob(b"y", etag, {})


def test_an_unchanged_read_sends_no_body(double: GCSDouble, on_double: GCSStore) -> None:
    etag = on_double.put("watched", b"v1")
    before = double.requests["GET media"]
    assert on_double.get("watched", if_none_match=etag) is None
    assert double.requests["GET media"] == before  # answered 304: no body was asked for
    changed = on_double.put("watched", b"v2")
    assert on_double.get("watched", if_none_match=etag) == Blob(b"v2", changed, {})
    assert double.requests["GET media"] == before + 1


def test_an_unchanged_read_is_none_where_read_preconditions_are_ignored(
    fakegcs: LocalGCS, prefix: str
) -> None:
    store = GCSStore(make_gcs_client(fakegcs.endpoint_url), BUCKET, prefix)
    etag = store.put("watched", b"v1")
    url = (
        f"{fakegcs.endpoint_url}/storage/v1/b/{BUCKET}/o/{prefix}%2Fwatched"
        f"?ifGenerationNotMatch={etag}"
    )
    with urllib.request.urlopen(url) as answer:  # the emulator answers 200, not 304
        assert answer.status == 200
    assert store.get("watched", if_none_match=etag) is None


# -- digests ------------------------------------------------------------------------------------


def test_a_body_damaged_on_its_way_is_refused_and_sent_again(
    double: GCSDouble, on_double: GCSStore
) -> None:
    before = on_double.put("damaged", b"before")
    body = os.urandom(20_000)
    double.plan("POST", "uploadType=multipart", "damage", times=2)
    fired = double.fired
    etag = on_double.put("damaged", body, mode=PutMode.update(before), metadata={"k": "v"})
    assert double.fired == fired + 2
    assert on_double.get("damaged") == Blob(body, etag, {"k": "v"})

    double.plan("POST", "uploadType=multipart", "damage", times=100)
    try:
        with pytest.raises(StoreError, match="4 times as damaged on its way"):
            on_double.put("damaged", b"after", mode=PutMode.update(etag))
    finally:
        double.faults.clear()
    assert on_double.get("damaged") == Blob(body, etag, {"k": "v"})


def test_a_part_damaged_on_its_way_is_refused_and_sent_again(
    double: GCSDouble, on_double: GCSStore
) -> None:
    part = os.urandom(50_000)
    upload_id = on_double.create_upload("big")
    double.plan("POST", "uploadType=multipart", "damage", times=1)
    fired = double.fired
    etag = on_double.upload_part("big", upload_id, 1, part)
    assert double.fired == fired + 1
    assert on_double.list_parts("big", upload_id) == {1: {etag: len(part)}}
    on_double.complete_upload("big", upload_id, [etag])
    assert on_double.get("big").body == part  # type: ignore[union-attr]


# -- races ---------------------------------------------------------------------------------------


def test_concurrent_creates_have_exactly_one_winner(store: GCSStore) -> None:
    start = threading.Barrier(THREADS)

    def create(i: int) -> str | None:
        start.wait()
        try:
            return store.put("contended", f"writer {i}".encode(), mode=CREATE)
        except PreconditionFailed:
            return None

    with ThreadPoolExecutor(THREADS) as pool:
        outcomes = list(pool.map(create, range(THREADS)))
    winners = [i for i, etag in enumerate(outcomes) if etag is not None]
    assert len(winners) == 1, outcomes
    assert store.get("contended") == Blob(f"writer {winners[0]}".encode(), outcomes[winners[0]], {})  # type: ignore[arg-type]


def test_creates_from_several_processes_have_exactly_one_winner(
    endpoint: str, store: GCSStore
) -> None:
    code = (
        "try:\n"
        "    print(store.put('contended', sys.argv[3].encode(), mode=CREATE))\n"
        "except PreconditionFailed:\n"
        "    print('lost')\n"
    )
    racers = [elsewhere(endpoint, code, BUCKET, store.prefix, f"process {i}") for i in range(4)]
    answers = [racer.communicate(timeout=120)[0].strip() for racer in racers]
    won = [i for i, said in enumerate(answers) if said != "lost"]
    assert len(won) == 1, answers
    assert store.get("contended") == Blob(f"process {won[0]}".encode(), answers[won[0]], {})


def test_concurrent_create_only_completions_have_exactly_one_winner(
    on_double: GCSStore,
) -> None:
    """Compose with ``ifGenerationMatch=0``, which GCS enforces and fake-gcs-server does not."""
    start = threading.Barrier(THREADS)

    def complete(i: int) -> bool:
        upload_id = on_double.create_upload("composed")
        etag = on_double.upload_part("composed", upload_id, 1, f"upload {i}".encode())
        start.wait()
        try:
            on_double.complete_upload("composed", upload_id, [etag], CREATE)
            return True
        except PreconditionFailed:
            assert on_double.abort_upload("composed", upload_id) is True
            return False

    with ThreadPoolExecutor(THREADS) as pool:
        outcomes = list(pool.map(complete, range(THREADS)))
    assert outcomes.count(True) == 1, outcomes
    blob = on_double.get("composed")
    assert blob is not None and blob.body == f"upload {outcomes.index(True)}".encode()
    assert list(on_double.list_uploads("")) == []
    assert raw_names(on_double) == [on_double.full_key("composed")]


def test_fakegcs_does_not_enforce_a_create_only_compose(fakegcs: LocalGCS, prefix: str) -> None:
    """Why ``doctor`` reports fake-gcs-server unsafe for chunked entries."""
    store = GCSStore(make_gcs_client(fakegcs.endpoint_url), BUCKET, prefix)
    for body in (b"first", b"second"):
        upload_id = store.create_upload("composed")
        etag = store.upload_part("composed", upload_id, 1, body)
        store.complete_upload("composed", upload_id, [etag], CREATE)  # the second one too
    assert store.get("composed").body == b"second"  # type: ignore[union-attr]


# -- uploads -------------------------------------------------------------------------------------


def test_an_upload_is_adopted_by_another_process(endpoint: str, store: GCSStore) -> None:
    parts = [os.urandom(30_000), os.urandom(30_000), os.urandom(1000)]
    upload_id = store.create_upload("adopted")
    first = store.upload_part("adopted", upload_id, 1, parts[0])
    code = (
        "[(key, upload_id)] = list(store.list_uploads(''))\n"
        "listed = store.list_parts(key, upload_id)\n"
        "etags = [next(iter(listed[1]))]\n"
        "for n, hexed in ((2, sys.argv[3]), (3, sys.argv[4])):\n"
        "    etags.append(store.upload_part(key, upload_id, n, bytes.fromhex(hexed)))\n"
        "store.complete_upload(key, upload_id, etags)\n"
        "print(json.dumps([key, upload_id, etags]))\n"
    )
    out = run_elsewhere(endpoint, code, BUCKET, store.prefix, parts[1].hex(), parts[2].hex())
    key, adopted, etags = json.loads(out)
    assert (key, adopted, etags[0]) == ("adopted", upload_id, first)
    assert store.get("adopted").body == b"".join(parts)  # type: ignore[union-attr]
    assert list(store.list_uploads("")) == []
    assert raw_names(store) == [store.full_key("adopted")]
    with pytest.raises(UploadGone):
        store.upload_part("adopted", upload_id, 4, b"late")
    assert raw_names(store) == [store.full_key("adopted")]


def test_more_than_32_parts_are_composed_in_a_tree(store: GCSStore) -> None:
    parts = [os.urandom(100 + i) for i in range(70)]
    upload_id = store.create_upload("tree")
    with ThreadPoolExecutor(8) as pool:
        etags = list(
            pool.map(
                lambda n: store.upload_part("tree", upload_id, n, parts[n - 1]),
                range(1, len(parts) + 1),
            )
        )
    store.complete_upload("tree", upload_id, etags)
    assert store.get("tree").body == b"".join(parts)  # type: ignore[union-attr]
    assert raw_names(store) == [store.full_key("tree")]


def test_the_parts_namespace_is_never_listed_nor_written(store: GCSStore) -> None:
    store.put("a", b"x")
    upload_id = store.create_upload("b/c")
    store.upload_part("b/c", upload_id, 1, b"part")
    assert any(PARTS in name for name in raw_names(store))
    assert list(store.list("")) == [Listed("a")]
    assert list(store.list("", delimiter="/")) == [Listed("a")]
    assert list(store.list(PARTS)) == []
    for call in (
        lambda: store.put(f"{PARTS}x", b"y"),
        lambda: store.delete(f"{PARTS}x"),
        lambda: store.create_upload(f"{PARTS}x"),
    ):
        with pytest.raises(InvalidInput, match="parts of unfinished uploads"):
            call()
    assert list(store.list_uploads("b/")) == [("b/c", upload_id)]


class Trickle(io.BytesIO):
    """A part stream that gives at most ``block`` bytes a read, as a file read in blocks
    does (``PartReader`` gives one block of the file at a time)."""

    def __init__(self, data: bytes, block: int) -> None:
        super().__init__(data)
        self.length = len(data)
        self.block = block

    def read(self, size: int | None = -1) -> bytes:
        wanted = self.block if size is None or size < 0 else min(size, self.block)
        return super().read(wanted)


def test_a_part_stream_that_gives_a_block_a_read_is_sent_whole(store: GCSStore) -> None:
    body = os.urandom(100_000)
    upload_id = store.create_upload("streamed")
    etag = store.upload_part("streamed", upload_id, 1, Trickle(body, 16_384))
    assert etag == hashlib.md5(body, usedforsecurity=False).hexdigest()
    assert store.list_parts("streamed", upload_id) == {1: {etag: len(body)}}
    store.complete_upload("streamed", upload_id, [etag])
    assert store.get("streamed").body == body  # type: ignore[union-attr]


@pytest.mark.parametrize("upload_id", ["", "nope", "0" * 31, "G" * 32, "../" * 11])
def test_an_id_that_names_no_upload_is_gone(store: GCSStore, upload_id: str) -> None:
    with pytest.raises(UploadGone):
        store.upload_part("k", upload_id, 1, b"x")
    with pytest.raises(UploadGone):
        store.list_parts("k", upload_id)
    with pytest.raises(UploadGone):
        store.complete_upload("k", upload_id, ["0" * 32])
    assert store.abort_upload("k", upload_id) is False
    assert raw_names(store) == []


# -- lost answers, throttling, broken reads -------------------------------------------------------


def test_a_lost_answer_is_outcome_unknown(double: GCSDouble, on_double: GCSStore) -> None:
    double.plan("POST", "uploadType=multipart", "lose")
    with pytest.raises(OutcomeUnknown):
        on_double.put("lost", b"body", mode=CREATE)
    assert on_double.get("lost").body == b"body"  # type: ignore[union-attr]

    upload_id = on_double.create_upload("composed")
    etag = on_double.upload_part("composed", upload_id, 1, b"part")
    double.plan("POST", "/compose", "lose")
    with pytest.raises(OutcomeUnknown):
        on_double.complete_upload("composed", upload_id, [etag])
    assert on_double.get("composed") == Blob(b"part", on_double.head("composed").etag, {})
    assert list(on_double.list_uploads("")) == []  # the upload's own object: cleaned up

    double.plan("DELETE", "lost", "lose")
    with pytest.raises(StoreError, match="answer was lost"):
        on_double.delete("lost")


@pytest.mark.parametrize("status", [429, 503])
def test_throttling_and_unavailability_are_retried(
    double: GCSDouble, on_double: GCSStore, status: int
) -> None:
    etag = on_double.put("hot", b"v1")
    sent = double.requests["POST upload"]
    double.plan("POST", "uploadType=multipart", "status", status=status, times=2)
    again = on_double.put("hot", b"v2", mode=PutMode.update(etag))
    assert double.requests["POST upload"] == sent + 1  # refused twice before the double counts
    assert on_double.get("hot") == Blob(b"v2", again, {})
    double.plan("GET", "/o/", "status", status=status, times=1)
    assert on_double.head("hot").etag == again


def test_a_client_throttled_on_a_write_paces_its_writes_and_not_on_a_read(
    double: GCSDouble, on_double: GCSStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its least, one every 10 s, and a recovery too slow to move it while the test runs.
    writes = on_double.gcs.writes = SendRate(decrease=0.01, recovery=1e-9)
    turns: list[float] = []

    def turn(now: float) -> float:
        turns.append(SendRate.turn(writes, now))
        return 0.0  # recorded, not waited

    monkeypatch.setattr(writes, "turn", turn)
    etag = on_double.put("paced", b"v1")
    double.plan("GET", "/o/", "status", status=429, times=1)
    assert on_double.head("paced").etag == etag
    assert turns == [0.0] and writes.rate(time.monotonic()) is None  # a read paces no write
    double.plan("POST", "uploadType=multipart", "status", status=429, times=1)
    etag = on_double.put("paced", b"v2", mode=PutMode.update(etag))
    assert writes.rate(time.monotonic()) == pytest.approx(0.1, abs=0.01)
    on_double.put("paced", b"v3", mode=PutMode.update(etag))
    on_double.delete("paced")
    assert turns[:2] == [0.0, 0.0]  # sent at once until the 429
    assert turns[2] > 5 and turns[3] > turns[2] + 5  # then each write its turn, 10 s apart


def test_a_read_that_breaks_off_is_read_broke_off(double: GCSDouble, on_double: GCSStore) -> None:
    body = os.urandom(100_000)
    on_double.put("fragile", body)
    double.plan("GET", "alt=media", "cut")
    stream = on_double.open("fragile")
    received = b""
    with pytest.raises(ReadBrokeOff):
        while chunk := stream.read(8192):
            received += chunk
    stream.close()
    assert received == body[: len(received)] and len(received) <= len(body) // 2


# -- errors --------------------------------------------------------------------------------------


def test_refusals_name_the_fix(double: GCSDouble, on_double: GCSStore) -> None:
    double.plan("POST", "uploadType=multipart", "status", status=403)
    with pytest.raises(AccessDenied, match="iam-policy"):
        on_double.put("k", b"x")
    double.plan("GET", "/o/", "status", status=401)
    with pytest.raises(StoreError, match="application-default login"):
        on_double.head("k")


def test_a_missing_bucket_is_a_clear_error(endpoint: str) -> None:
    """Reads too: a task in a missing bucket was "not found" (exit 8), not a store error
    (fake-gcs-server answers a read there as it answers a missing object: it is asked)."""
    store = GCSStore(make_gcs_client(endpoint), "no-such-bucket-here", "p")
    for call in (
        lambda: store.put("k", b"x"),
        lambda: list(store.list("")),
        lambda: store.get("k"),
        lambda: store.head("k"),
        lambda: store.open("k"),
        lambda: om.Task.open(store, "t1"),
    ):
        with pytest.raises(StoreError, match="bucket 'no-such-bucket-here' does not exist"):
            call()


@pytest.mark.parametrize("pages", ["files", "nothing"])
def test_an_endpoint_that_answers_with_web_pages_is_named(tmp_path: Path, pages: str) -> None:
    """A web server (or another cloud's API) answers with a page (404 for a file it lacks,
    501 for what it cannot do): the endpoint is named as no GCS JSON API in one line, never
    taken for a missing task."""
    handler: Any = (
        functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
        if pages == "files"
        else http.server.BaseHTTPRequestHandler
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        store = GCSStore(make_gcs_client(endpoint), BUCKET, "p")
        for call in (
            lambda: store.get("k"),
            lambda: store.open("k"),
            lambda: store.put("k", b"x"),
            lambda: om.Task.open(store, "t1"),
        ):
            with pytest.raises(StoreError, match="does not behave like the GCS JSON API") as e:
                call()
            assert "\n" not in str(e.value)
    finally:
        server.shutdown()
        server.server_close()


def test_a_missing_object_in_a_bucket_named_bucket_is_no_such_object(
    fakegcs: LocalGCS, double: GCSDouble, endpoint: str, prefix: str
) -> None:
    """A 404 is told apart by what the store says, not by the URL it was asked at: GCS says
    ``No such object: my-bucket/...``, fake-gcs-server only ``Not Found``."""
    for server in (fakegcs, double):
        server.create_bucket("my-bucket")
    store = GCSStore(make_gcs_client(endpoint), "my-bucket", prefix)
    for call in (lambda: store.head("gone"), lambda: store.get("gone"), lambda: store.open("gone")):
        with pytest.raises(NoSuchObject, match=r"gs://my-bucket/.*/gone does not exist"):
            call()
    store.delete("gone")  # a missing key is fine


def test_an_endpoint_that_does_not_answer_is_named() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    store = GCSStore(make_gcs_client(endpoint), BUCKET, "p")
    with pytest.raises(StoreError, match=r"no answer from http://127\.0\.0\.1"):
        store.head("k")
    with pytest.raises(OutcomeUnknown):
        store.put("k", b"x", mode=CREATE)


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://user:secret@127.0.0.1:1",
        "ftp://h",
        "http://h/path",
        "http://h:port",
        "http://h?k=secret",
    ],
)
def test_a_bad_endpoint_is_refused_without_showing_credentials(endpoint: str) -> None:
    with pytest.raises(InvalidInput, match="GCS endpoint") as info:
        make_gcs_client(endpoint)
    assert "secret" not in str(info.value)


def test_missing_credentials_name_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key-with-secret.json")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:1")
    with pytest.raises(StoreError, match="gcloud auth application-default login"):
        make_gcs_client()


def test_the_clock_is_the_stores_date(prefix: str) -> None:
    double = GCSDouble(date_offset=3 * 3600)
    try:
        double.create_bucket(BUCKET)
        store = GCSStore(make_gcs_client(double.endpoint_url), BUCKET, prefix)
        now = store.now()
        assert now - datetime.now(timezone.utc) > timedelta(hours=2, minutes=59)
        assert now - datetime.now(timezone.utc) < timedelta(hours=3, minutes=1)
    finally:
        double.stop()


# -- what the probe and doctor say ----------------------------------------------------------------


def test_doctor_reports_fakegcs_unsafe_for_chunked_entries(fakegcs: LocalGCS, prefix: str) -> None:
    store = GCSStore(make_gcs_client(fakegcs.endpoint_url), BUCKET, prefix)
    assert probe_conditional_writes(store, f"{PROBE_PREFIX}{uuid.uuid4().hex}") == []
    report = probe_store(store, f"{PROBE_PREFIX}{uuid.uuid4().hex}", racers=4)
    verdicts = {check.name: check.verdict for check in report.checks}
    assert not report.safe
    assert [check.name for check in report.failed] == [probe.MULTIPART]
    assert "chunked entries are not safe" in report.check(probe.MULTIPART).problem
    assert verdicts[probe.DIGEST] == "failed"  # a wrong MD5 is stored: not verified
    for name in (probe.CREATE_ONLY, probe.CREATE_RACE, probe.UPDATE_IF_MATCH):
        assert verdicts[name] == "ok", report.check(name)
    for name in (probe.UPDATE_MISSING, probe.UPDATE_RACE, probe.DATE, probe.RANGES):
        assert verdicts[name] == "ok", report.check(name)
    assert verdicts[probe.LISTING] == "ok"
    assert list(store.list("")) == [] and raw_names(store) == []


def test_doctor_passes_a_store_that_enforces_everything(on_double: GCSStore) -> None:
    report = probe_store(on_double, f"{PROBE_PREFIX}{uuid.uuid4().hex}", racers=4)
    assert report.safe, [c for c in report.checks if not c.ok]
    assert report.check(probe.DIGEST).verdict == "ok"
    assert "400" in report.check(probe.DIGEST).answer
    assert "412" in report.check(probe.MULTIPART).answer
    assert "compose of the part objects with ifGenerationMatch=0" in (
        report.check(probe.MULTIPART).answer
    )  # doctor says how GCS enforces each check
    assert raw_names(on_double) == []
