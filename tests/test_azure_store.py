"""``AzureStore`` against a real Azurite: what Azure enforces and how its answers become the
seam's outcomes (conditions, races between threads and processes, the mapping of multipart
uploads onto staged blocks, adoption of an upload by another process, digests, the clock,
retries, lost answers, refusals) and that no secret is ever shown.

Run when ``OBJMANIFEST_TEST_BACKENDS`` names ``azurite`` (Node.js and the npm package
``azurite``: ``scripts/test.sh`` installs it then):

    OBJMANIFEST_TEST_BACKENDS=azurite bash scripts/test.sh tests/test_azure_store.py
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.storage.blob import BlobServiceClient

import objmanifest as om
from objmanifest.cli import main
from objmanifest.core.runtime import DEFAULT, Runtime
from objmanifest.errors import AccessDenied, InvalidInput, ReadBrokeOff, StoreError
from objmanifest.local.azurite import ACCOUNT
from objmanifest.store import CREATE, PROBE_PREFIX, Blob, Head, Listed, PutMode
from objmanifest.store.azure import AzureStore, connect_azure
from objmanifest.store.azure_answers import ENFORCES
from objmanifest.store.azure_uploads import UPLOADS, block_id
from objmanifest.store.errors import (
    NoSuchObject,
    OutcomeUnknown,
    PartsRejected,
    PreconditionFailed,
    UploadGone,
)
from objmanifest.store.probe import probe_conditional_writes, probe_store
from tests.support.azure import CONTAINER, azure_store, azurite, flaky_store
from tests.support.faults import FaultProxy
from tests.support.stores import backend_names

pytestmark = [
    pytest.mark.skipif(
        "azurite" not in backend_names(),
        reason="OBJMANIFEST_TEST_BACKENDS does not name azurite",
    ),
    pytest.mark.xdist_group("azurite"),
    pytest.mark.azure,
]

ROOT = Path(__file__).resolve().parent.parent
THREADS = 8
STALE = '"0x8D0000000000000"'


def md5(body: bytes) -> str:
    return hashlib.md5(body, usedforsecurity=False).hexdigest()


@pytest.fixture
def store(prefix: str) -> AzureStore:
    return azure_store(prefix)


def raw_blob(store: AzureStore, key: str) -> Any:
    """The SDK's own client of ``key``, to look behind the store."""
    service = BlobServiceClient.from_connection_string(azurite().connection_string)
    return service.get_blob_client(CONTAINER, store.full_key(key))


def recording_runtime() -> tuple[Runtime, list[float]]:
    """The real runtime, except that sleeps are recorded, not slept."""
    slept: list[float] = []
    return replace(DEFAULT, sleep=slept.append), slept


# -- conditions -----------------------------------------------------------------------------------


def test_azure_refusals_are_lost_races_with_azures_answer(store: AzureStore) -> None:
    etag = store.put("k", b"first", mode=CREATE)
    assert etag.startswith('"0x') and etag.endswith('"')
    with pytest.raises(PreconditionFailed) as created:
        store.put("k", b"second", mode=CREATE)
    assert created.value.answer == "409 BlobAlreadyExists"
    with pytest.raises(PreconditionFailed) as stale:
        store.put("k", b"second", mode=PutMode.update(STALE))
    assert stale.value.answer == "412 ConditionNotMet"
    with pytest.raises(PreconditionFailed) as missing:
        store.put("never", b"x", mode=PutMode.update(etag))
    assert missing.value.answer == "412 ConditionNotMet"
    assert store.get("k") == Blob(b"first", etag, {})
    # A bare ETag in small letters (what checksum.bare_etag gives) names the same version.
    bare = om.core.checksum.bare_etag(etag)
    assert bare == bare.lower() != etag
    assert store.get("k", if_none_match=bare) is None
    updated = store.put("k", b"third", mode=PutMode.update(bare))
    assert store.head("k") == Head(updated, 5, {})


def test_metadata_names_azure_refuses_round_trip(store: AzureStore) -> None:
    meta = {"xxh3-128": "ab12", "size": "5", "Owner": "x", "a.b": "c", "_x": "y"}
    store.put("m", b"hello", metadata=meta)
    assert store.get("m") == Blob(b"hello", store.head("m").etag, meta)
    stored = raw_blob(store, "m").get_blob_properties().metadata
    assert stored["size"] == "5" and "xxh3-128" not in stored  # sent as an identifier
    with pytest.raises(InvalidInput, match="printable ASCII"):
        store.put("m", b"x", metadata={"who": "caf\u00e9"})


def test_the_uploads_namespace_is_the_stores_own(store: AzureStore) -> None:
    upload_id = store.create_upload("a/b")
    store.put("a/c", b"x")
    assert list(store.list("")) == [Listed("a/c")]
    assert list(store.list("", "/")) == [Listed("a/", True)]
    assert list(store.list(".")) == []
    for call in (
        lambda: store.put(f"{UPLOADS}x", b"x"),
        lambda: store.create_upload(f"{UPLOADS}x"),
    ):
        with pytest.raises(InvalidInput, match="store's own namespace"):
            call()
    assert list(store.list_uploads("")) == [("a/b", upload_id)]


def test_listing_is_in_code_point_order(store: AzureStore) -> None:
    # UTF-16 (JavaScript's, Azurite's) puts U+1F600 before U+E000; UTF-8 and S3 after it.
    keys = ["u/\U0001f600", "u/\ue000", "u/B", "u/a", "u/a/b", "u/a.json", "u/\u00e9"]
    for key in keys:
        store.put(key, key.encode())
    assert [row.key for row in store.list("u/")] == sorted(keys)
    store.list_page_size = 2
    assert [row.key for row in store.list("u/", "/")] == sorted(
        [k for k in keys if k != "u/a/b"] + ["u/a/"]
    )


# -- races ----------------------------------------------------------------------------------------


def test_threads_racing_to_create_or_update_have_exactly_one_winner(store: AzureStore) -> None:
    for round_ in range(3):
        key = f"race-{round_}"
        start = threading.Barrier(THREADS)

        def create(i: int, key: str = key, start: threading.Barrier = start) -> str | None:
            start.wait()
            try:
                return store.put(key, f"writer {i}".encode(), mode=CREATE)
            except PreconditionFailed:
                return None

        with ThreadPoolExecutor(THREADS) as pool:
            won = [(i, e) for i, e in enumerate(pool.map(create, range(THREADS))) if e]
        assert len(won) == 1, won
        etag = won[0][1]
        assert store.get(key) == Blob(f"writer {won[0][0]}".encode(), etag, {})

        again = threading.Barrier(THREADS)

        def update(
            i: int, key: str = key, etag: str = etag, again: threading.Barrier = again
        ) -> str | None:
            again.wait()
            try:
                return store.put(key, f"update {i}".encode(), mode=PutMode.update(etag))
            except PreconditionFailed:
                return None

        with ThreadPoolExecutor(THREADS) as pool:
            won = [(i, e) for i, e in enumerate(pool.map(update, range(THREADS))) if e]
        assert len(won) == 1, won
        assert store.get(key) == Blob(f"update {won[0][0]}".encode(), won[0][1], {})


RACER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from objmanifest.store import CREATE
    from objmanifest.store.errors import PreconditionFailed
    from tests.support.azure import CONTAINER
    from objmanifest.store.azure import connect_azure

    prefix, key, me, gate = sys.argv[1:5]
    store = connect_azure(CONTAINER, prefix)
    store.now()  # connected before the race
    Path(gate, f"ready-{me}").touch()
    while not Path(gate, "go").exists():
        time.sleep(0.001)
    try:
        etag = store.put(key, f"process {me}".encode(), mode=CREATE)
    except PreconditionFailed as e:
        print(json.dumps({"me": me, "won": False, "answer": e.answer}))
    else:
        print(json.dumps({"me": me, "won": True, "etag": etag}))
    """
)


def python(*args: str) -> list[str]:
    return [sys.executable, "-c", *args]


def child_env() -> dict[str, str]:
    return {**os.environ, **azurite().env(), "PYTHONPATH": str(ROOT)}


def test_processes_racing_to_create_have_exactly_one_winner(
    store: AzureStore, prefix: str, tmp_path: Path
) -> None:
    racers = 6
    procs = [
        subprocess.Popen(
            python(RACER, prefix, "contended", str(i), str(tmp_path)),
            stdout=subprocess.PIPE,
            env=child_env(),
            text=True,
        )
        for i in range(racers)
    ]
    while len(list(tmp_path.glob("ready-*"))) < racers:
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    (tmp_path / "go").touch()
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    winners = [r for r in results if r["won"]]
    assert len(winners) == 1, results
    assert {r["answer"] for r in results if not r["won"]} <= {"409 BlobAlreadyExists"}
    got = store.get("contended")
    assert got == Blob(f"process {winners[0]['me']}".encode(), winners[0]["etag"], {})


# -- multipart uploads as blocks ------------------------------------------------------------------


def test_parts_are_blocks_named_by_upload_number_and_digest(store: AzureStore) -> None:
    one, two, other = b"a" * 1000, b"b" * 10, b"c" * 7
    upload = store.create_upload("big")
    second = store.create_upload("big")  # a second upload of the same key
    assert len(upload) == len(second) == 24 and upload != second
    assert store.upload_part("big", upload, 1, one) == md5(one)
    assert store.upload_part("big", upload, 2, two) == md5(two)
    assert store.upload_part("big", upload, 2, other) == md5(other)  # part 2 sent again
    assert store.upload_part("big", second, 1, two) == md5(two)

    _, staged = raw_blob(store, "big").get_block_list("uncommitted")
    assert sorted(b.id for b in staged) == sorted(
        [
            block_id(upload, 1, md5(one)),
            block_id(upload, 2, md5(two)),
            block_id(upload, 2, md5(other)),
            block_id(second, 1, md5(two)),
        ]
    )
    assert len({len(b.id) for b in staged}) == 1  # Azure wants ids of one length
    assert store.list_parts("big", upload) == {
        1: {md5(one): 1000},
        2: {md5(two): 10, md5(other): 7},
    }
    assert store.list_parts("big", second) == {1: {md5(two): 10}}
    with pytest.raises(NoSuchObject):  # nothing is a blob before its commit
        store.head("big")

    # A refused commit (a named block not there) keeps every staged block.
    with pytest.raises(PartsRejected):
        store.complete_upload("big", upload, [md5(one), md5(b"never sent")])
    assert store.list_parts("big", upload)[2] == {md5(two): 10, md5(other): 7}
    store.complete_upload("big", upload, [md5(one), md5(other)])
    assert store.get("big").body == one + other  # type: ignore[union-attr]
    committed, _ = raw_blob(store, "big").get_block_list("committed")
    assert [b.id for b in committed] == [
        block_id(upload, 1, md5(one)),
        block_id(upload, 2, md5(other)),
    ]
    # The commit of one upload discards the blocks of the other (Azure keeps one list).
    assert store.list_parts("big", second) == {}
    with pytest.raises(UploadGone):  # completed: its marker is gone
        store.list_parts("big", upload)
    assert list(store.list_uploads("")) == [("big", second)]


def test_a_create_only_commit_over_an_object_keeps_the_blocks(store: AzureStore) -> None:
    first = store.put("taken", b"first")
    upload = store.create_upload("taken")
    etag = store.upload_part("taken", upload, 1, b"second")
    with pytest.raises(PreconditionFailed) as refused:
        store.complete_upload("taken", upload, [etag])
    assert refused.value.answer in ("409 BlobAlreadyExists", "412 ConditionNotMet")
    assert store.get("taken") == Blob(b"first", first, {})
    assert store.list_parts("taken", upload) == {1: {etag: 6}}
    store.delete("taken")
    store.complete_upload("taken", upload, [etag])
    assert store.get("taken").body == b"second"  # type: ignore[union-attr]


def test_an_aborted_upload_is_gone_and_ids_not_ours_name_no_upload(store: AzureStore) -> None:
    upload = store.create_upload("gone")
    etag = store.upload_part("gone", upload, 1, b"bytes")
    assert store.abort_upload("gone", upload) is True
    assert store.abort_upload("gone", upload) is False
    for call in (
        lambda: store.upload_part("gone", upload, 2, b"more"),
        lambda: store.list_parts("gone", upload),
        lambda: store.complete_upload("gone", upload, [etag]),
    ):
        with pytest.raises(UploadGone):
            call()
    for foreign in ("REBUILT", "", "../x", "0" * 23, upload.upper()):
        with pytest.raises(UploadGone):
            store.list_parts("gone", foreign)
        assert store.abort_upload("gone", foreign) is False
    with pytest.raises(StoreError, match="part numbers are 1 to 10000"):
        store.upload_part("gone", store.create_upload("gone"), 10_001, b"x")
    with pytest.raises(NoSuchObject):
        store.head("gone")


ADOPTER = textwrap.dedent(
    """
    import sys
    from tests.support.azure import CONTAINER
    from objmanifest.store.azure import connect_azure

    prefix, upload_id = sys.argv[1:3]
    store = connect_azure(CONTAINER, prefix)
    parts = store.list_parts("adopted", upload_id)
    ((etag, size),) = parts[1].items()
    second = store.upload_part("adopted", upload_id, 2, b"from the adopter")
    store.complete_upload("adopted", upload_id, [etag, second])
    print(etag, size)
    """
)


def test_another_process_adopts_an_open_upload(store: AzureStore, prefix: str) -> None:
    first = os.urandom(100_000)
    upload = store.create_upload("adopted")
    store.upload_part("adopted", upload, 1, first)
    done = subprocess.run(
        python(ADOPTER, prefix, upload),
        capture_output=True,
        env=child_env(),
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [md5(first), str(len(first))]
    assert store.get("adopted").body == first + b"from the adopter"  # type: ignore[union-attr]
    assert list(store.list_uploads("")) == []


def test_a_chunked_entry_goes_up_and_down_through_blocks(prefix: str) -> None:
    store = azure_store(prefix)
    task = om.Task.create(store, "t", stages=["a"])
    task.declare("big", "a")
    agent = task.agent("w")
    claim = agent.claim(stage="a")
    assert claim is not None
    data = os.urandom(11 * 1024 * 1024)
    entry = agent.put(claim, data, part_size=5 * 1024 * 1024, threshold=1024 * 1024)
    assert entry.state == "ready"
    committed, _ = raw_blob(store, entry.key).get_block_list("committed")
    assert len(committed) == 3
    assert task.agent("c").consume("big") == data


# -- bodies damaged on their way ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_a_damaged_body_or_block_is_refused_and_sent_again(prefix: str, how: str) -> None:
    """A flipped byte fails the Content-MD5 (400 Md5Mismatch); a body cut short, with a
    length to match, fails the Shared Key signature (403), which the store tells apart from
    refused credentials by asking again."""
    server = azurite()
    with FaultProxy(server.account_url.rpartition("/")[0]) as proxy:
        through = connect_azure(
            CONTAINER,
            prefix,
            connection_string=server.connection_string.replace(
                server.account_url, f"{proxy.endpoint_url}/{ACCOUNT}"
            ),
        )
        body = os.urandom(20_000)
        proxy.damage_request("PUT", f"/{CONTAINER}/{prefix}/whole", 2, how, once=False)
        etag = through.put("whole", body, mode=CREATE)
        upload = through.create_upload("parts")
        proxy.damage_request("PUT", "comp=block&", 1, how)
        assert through.upload_part("parts", upload, 1, body) == md5(body)
        assert len(proxy.damaged) == 3
        assert proxy.damaged_answers == [400, 400, 400] if how == "flip" else [403, 403, 403]
    assert azure_store(prefix).get("whole") == Blob(body, etag, {})
    assert azure_store(prefix).list_parts("parts", upload) == {1: {md5(body): len(body)}}


# -- lost answers, throttling, the one retry policy -----------------------------------------------


def test_a_put_whose_answer_is_lost_is_outcome_unknown_and_not_sent_again(prefix: str) -> None:
    runtime, slept = recording_runtime()
    store, transport = flaky_store(prefix, runtime)
    for mode in (CREATE, PutMode.update(store.put("k2", b"before"))):
        key = "k1" if mode is CREATE else "k2"
        transport.plan("PUT", f"/{key}", "lost")
        sent = transport.sent["PUT"]
        with pytest.raises(OutcomeUnknown):
            store.put(key, b"after", mode=mode)
        assert transport.sent["PUT"] == sent + 1  # not retried: it may have been applied
        assert store.get(key).body == b"after"  # type: ignore[union-attr]
    assert slept == []


def test_a_lost_completion_is_outcome_unknown_and_its_marker_goes_once_it_landed(
    prefix: str,
) -> None:
    store, transport = flaky_store(prefix)
    upload = store.create_upload("big")
    etag = store.upload_part("big", upload, 1, b"part")
    transport.plan("PUT", "comp=blocklist", "lost")
    with pytest.raises(OutcomeUnknown):
        store.complete_upload("big", upload, [etag])
    assert store.get("big").body == b"part"  # type: ignore[union-attr]
    assert list(store.list_uploads("")) == []
    with pytest.raises(UploadGone):
        store.complete_upload("big", upload, [etag])


def test_reads_blocks_and_deletes_whose_answer_is_lost_are_sent_again(prefix: str) -> None:
    runtime, slept = recording_runtime()
    store, transport = flaky_store(prefix, runtime)
    store.put("k", b"body")
    upload = store.create_upload("big")
    for method, where in (("GET", "/k"), ("HEAD", "/k"), ("PUT", "comp=block&")):
        transport.plan(method, where, "lost")
    assert store.get("k") == Blob(b"body", store.head("k").etag, {})
    assert store.upload_part("big", upload, 1, b"part") == md5(b"part")
    transport.plan("DELETE", "/k", "lost")
    store.delete("k")  # applied, lost, sent again: 404, which a delete takes as done
    with pytest.raises(NoSuchObject):
        store.head("k")
    assert transport.faults["lost"] == 4 and len(slept) == 4


@pytest.mark.parametrize("kind", ["busy", "timeout", "refused"])
def test_busy_and_unreachable_answers_are_retried_with_growing_backoff(
    prefix: str, kind: str
) -> None:
    runtime, slept = recording_runtime()
    store, transport = flaky_store(prefix, runtime)
    transport.plan("PUT", "/k", kind, times=4)
    etag = store.put("k", b"body", mode=CREATE)  # a create sent again after 4 refusals
    assert store.get("k") == Blob(b"body", etag, {})
    assert transport.faults[kind] == 4 and len(slept) == 4
    assert slept[0] < slept[3] and all(0 < s <= 12 for s in slept)
    transport.plan("GET", "/k", kind, times=6)  # more than the policy retries
    with pytest.raises(StoreError) as given_up:
        store.get("k")
    assert ("ServerBusy" in str(given_up.value)) == (kind == "busy")


def test_an_answer_azure_never_gives_is_a_store_error_naming_the_endpoint(prefix: str) -> None:
    store, transport = flaky_store(prefix)
    for method, call in (
        ("PUT", lambda: store.put("k", b"x", mode=CREATE)),
        ("GET", lambda: store.get("k")),
        ("GET", lambda: list(store.list(""))),
        ("HEAD", lambda: store.head("k")),
    ):
        transport.plan(method, "", "garbage")
        with pytest.raises(StoreError) as info:
            call()
        assert type(info.value) is StoreError
        assert azurite().account_url in str(info.value)
    assert transport.faults["garbage"] == 4


def test_a_read_that_breaks_off_raises_read_broke_off(prefix: str) -> None:
    server = azurite()
    body = os.urandom(300_000)
    azure_store(prefix).put("fragile", body)
    with FaultProxy(server.account_url.rpartition("/")[0]) as proxy:
        through = connect_azure(
            CONTAINER,
            prefix,
            connection_string=server.connection_string.replace(
                server.account_url, f"{proxy.endpoint_url}/{ACCOUNT}"
            ),
        )
        proxy.cut_response("GET", "/fragile", 1000)
        stream = through.open("fragile", (0, 200_000))  # the answer began: no error yet
        with pytest.raises(ReadBrokeOff, match="broke off"):
            stream.read()
        stream.close()
        assert proxy.cut == 1
        assert through.open("fragile", (1000, 300_000)).read() == body[1000:]


# -- what doctor asks ------------------------------------------------------------------------------


def test_the_probe_finds_azure_safe_and_says_how_it_enforces_each_check(prefix: str) -> None:
    store = azure_store(prefix)
    report = probe_store(store, f"{PROBE_PREFIX}{prefix}")
    assert report.safe and [c.verdict for c in report.checks] == ["ok"] * len(report.checks)
    answers = {c.name: c.answer for c in report.checks}
    assert "409 BlobAlreadyExists" in answers["create-only"]
    assert "412 ConditionNotMet" in answers["update-if-match, missing key"]
    assert "a create-only Put Block List" in answers["conditional multipart completion"]
    assert "400 Md5Mismatch" in answers["digest verification"]
    for name, how in ENFORCES.items():
        assert answers[name].endswith(f"[{how}]"), name
    assert list(store.list("")) == [] and list(store.list_uploads("")) == []
    assert probe_conditional_writes(store, f"{PROBE_PREFIX}again") == []


# -- the store's clock ----------------------------------------------------------------------------


def test_the_clock_is_the_stores_date_even_from_refusals(prefix: str) -> None:
    server = azurite()
    with FaultProxy(server.account_url.rpartition("/")[0], date_offset=3600) as proxy:
        through = connect_azure(
            CONTAINER,
            prefix,
            connection_string=server.connection_string.replace(
                server.account_url, f"{proxy.endpoint_url}/{ACCOUNT}"
            ),
        )
        with pytest.raises(NoSuchObject):
            through.head("missing")  # a 404 carries a Date too
        assert through.clock.known
        ahead = through.now() - azure_store(prefix).now()
    assert timedelta(minutes=59) < ahead < timedelta(minutes=61)


# -- refusals -------------------------------------------------------------------------------------


def test_a_missing_container_and_wrong_credentials_are_errors_that_name_the_fix(
    prefix: str,
) -> None:
    server = azurite()
    missing = connect_azure("no-such-container", prefix, connection_string=server.connection_string)
    for call in (
        lambda: missing.put("k", b"x"),
        lambda: missing.get("k"),
        lambda: missing.create_upload("k"),
    ):
        with pytest.raises(StoreError, match="container 'no-such-container' does not exist"):
            call()
    wrong = server.connection_string.replace(
        server.connection_string.split("AccountKey=")[1].split(";")[0],
        base64.b64encode(b"not the key " * 4).decode(),
    )
    refused = connect_azure(CONTAINER, prefix, connection_string=wrong)
    for call in (lambda: refused.put("k", b"x"), lambda: refused.head("k")):
        with pytest.raises(StoreError, match="refused the credentials") as info:
            call()
        assert not isinstance(info.value, AccessDenied)
        assert "damaged" not in str(info.value)


def test_connecting_needs_an_account_and_https_for_azure_identity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_URL", raising=False)
    with pytest.raises(InvalidInput, match="no Azure account to connect to"):
        connect_azure(CONTAINER)
    with pytest.raises(InvalidInput, match="invalid container name"):
        connect_azure("Bad_Name")
    # azure-identity's credential, over http: refused before any token is asked for.
    with pytest.raises(InvalidInput, match="https only"):
        connect_azure(CONTAINER, endpoint_url=azurite().account_url)
    store = connect_azure(CONTAINER, endpoint_url="https://acct.blob.core.windows.net")
    assert store.credentials.how == "azure-identity (DefaultAzureCredential)"
    # With a connection string, --endpoint-url is where its requests go (a proxy here;
    # a bare host and port keeps the emulator's account path).
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite().connection_string)
    with FaultProxy(azurite().account_url.rpartition("/")[0]) as proxy:
        through = connect_azure(CONTAINER, "p", endpoint_url=proxy.endpoint_url)
        assert through.credentials.account_url == f"{proxy.endpoint_url}/{ACCOUNT}"
        with pytest.raises(NoSuchObject):
            through.head("k")
        assert proxy.requests == [("HEAD", f"/{ACCOUNT}/{CONTAINER}/p/k")]
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "UseDevelopmentStorage=true")
    with pytest.raises(InvalidInput, match="names its own endpoint"):
        connect_azure(CONTAINER, endpoint_url="http://127.0.0.1:1")


# -- secrets --------------------------------------------------------------------------------------

KEY_SECRET = base64.b64encode(b"OBJMANIFEST-PLANTED-ACCOUNT-KEY-0123456789").decode()
SAS_SECRET = "OBJMANIFESTplantedSASsignature0123456789"


PLANTED = ("key", "sas", "key, nobody there", "sas, nobody there")


def planted() -> dict[str, str]:
    """Connection strings that carry distinctive secrets (``PLANTED`` names them): a wrong
    account key (Azurite refuses it), a SAS token (refused too), and each aimed at a port
    where nothing listens. Made in the test, not at collection: Azurite starts only in a
    run that has it."""
    url = azurite().account_url
    dead = "http://127.0.0.1:9/devstoreaccount1"
    key = f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY_SECRET};"
    sas = f"sv=2023-11-03&ss=b&srt=sco&sp=rwdl&se=2099-01-01T00:00:00Z&sig={SAS_SECRET}"
    return {
        "key": f"{key}BlobEndpoint={url};",
        "sas": f"BlobEndpoint={url};SharedAccessSignature={sas}",
        "key, nobody there": f"{key}BlobEndpoint={dead};",
        "sas, nobody there": f"BlobEndpoint={dead};SharedAccessSignature={sas}",
    }


def everything_a_store_shows(store: AzureStore) -> list[str]:
    shown = [repr(store), str(store.url), repr(store.credentials), str(store.identity)]
    calls: list[Callable[[], Any]] = [
        lambda: store.put("k", b"x", mode=CREATE),
        lambda: store.get("k"),
        lambda: store.open("k").read(),
        lambda: store.head("k"),
        lambda: list(store.list("")),
        lambda: store.delete("k"),
        lambda: store.create_upload("k"),
        lambda: list(store.list_uploads("")),
    ]
    for call in calls:
        with pytest.raises((StoreError, NoSuchObject)) as info:
            call()
        shown.append(str(info.value))
        shown.append(repr(info.value))
    try:  # the time, if a refusal's Date told it
        shown.append(str(store.now()))
    except StoreError as e:
        shown.append(str(e))
    return shown


@pytest.mark.parametrize("name", PLANTED)
def test_secrets_are_never_shown(name: str, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="objmanifest")
    caplog.set_level(logging.DEBUG, logger="azure")
    store = connect_azure(CONTAINER, prefix, connection_string=planted()[name], retries=1)
    shown = everything_a_store_shows(store)
    shown += [record.getMessage() for record in caplog.records]
    text = "\n".join(shown)
    assert "refused the credentials" in text or "no answer from" in text
    for secret in (KEY_SECRET, SAS_SECRET, SAS_SECRET[:16]):
        assert secret not in text


def test_doctor_passes_azurite(
    prefix: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite().connection_string)
    url = f"az://{CONTAINER}/{prefix}"
    assert main(["doctor", "--json", "--url", url]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["safe"] is True and report["url"] == url
    assert {c["verdict"] for c in report["checks"]} == {"ok"}
    answers = {c["name"]: c["answer"] for c in report["checks"]}
    assert "a create-only Put Block List" in answers["conditional multipart completion"]
    assert main(["doctor", "--url", url]) == 0
    assert f"safe: {url} enforces everything" in capsys.readouterr().out


@pytest.mark.parametrize("name", PLANTED)
def test_the_cli_shows_no_secret(
    name: str, prefix: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", planted()[name])
    url = f"az://{CONTAINER}/{prefix}"
    said = []
    for argv in (
        ["doctor", "--url", url],
        ["doctor", "--json", "--url", url],
        ["--debug", "doctor", "--url", url],
        ["--json", "status", "--url", url, "--task", "t"],
        ["--debug", "init", "--url", url, "--task", "t", "a"],
    ):
        assert main(argv) != 0
        out, err = capsys.readouterr()
        said.append(out + err)
    text = "\n".join(said)
    assert "refused the credentials" in text or "no answer from" in text
    for secret in (KEY_SECRET, SAS_SECRET, SAS_SECRET[:16]):
        assert secret not in text


@pytest.mark.parametrize(
    "endpoint",
    [
        f"http://127.0.0.1:9/{ACCOUNT}?sv=2023-11-03&sig={SAS_SECRET}",
        f"http://127.0.0.1:9/{ACCOUNT}?token={SAS_SECRET}",
        f"http://user:{SAS_SECRET}@127.0.0.1:9/{ACCOUNT}",
        "http://[::1",
        "ftp://127.0.0.1/x",
        "not a url",
    ],
)
def test_a_connection_strings_blob_endpoint_is_checked_as_an_account_url(
    endpoint: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BlobEndpoint that carries a credential (a SAS token in its query, user info), or
    is no http(s) URL, is refused as invalid input (exit 2) without the credential: it was
    taken as it was and shown in every error ("no answer from ..."). A SAS token belongs in
    the string's SharedAccessSignature field."""
    connection = f"AccountName={ACCOUNT};AccountKey={KEY_SECRET};BlobEndpoint={endpoint}"
    names = "the blob endpoint AZURE_STORAGE_CONNECTION_STRING names"
    with pytest.raises(InvalidInput, match=names):
        connect_azure(CONTAINER, connection_string=connection)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
    for argv in (["status"], ["--json", "status"], ["doctor"]):
        assert main([*argv, "--url", f"az://{CONTAINER}/p", "--task", "t"]) == 2
    out, err = capsys.readouterr()
    assert "invalid" in out + err
    for secret in (KEY_SECRET, SAS_SECRET, SAS_SECRET[:16]):
        assert secret not in out + err


def test_a_failed_sign_in_is_one_line_of_error_and_the_sdks_warnings_wait_for_debug(
    tmp_path: Path,
) -> None:
    """azure-identity logs a warning for each credential it tried and failed: a command
    printed them all (dozens of lines, ``--json`` too) before its own line of error. They
    show with ``--debug`` only; the error says what failed. No credential of the machine's
    is in reach (an empty home, no Azure variables)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AZURE_", "IDENTITY_", "MSI_", "IMDS_"))
    }
    env.update(PYTHONPATH=str(ROOT), HOME=str(tmp_path))
    argv = ["--url", "az://jobs/p", "--endpoint-url", "https://acct.blob.core.windows.net"]
    said = {}
    for extra in ([], ["--json"], ["--debug"]):
        done = subprocess.run(
            [sys.executable, "-m", "objmanifest", *extra, *argv, "--task", "t", "status"],
            capture_output=True,
            env=env,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 13, done.stderr
        said[" ".join(extra)] = done
    assert said[""].stderr.startswith("objmanifest: store error: could not sign in")
    assert said[""].stderr.count("\n") == 1
    assert said["--json"].stderr == "" and "could not sign in" in said["--json"].stdout
    assert "DefaultAzureCredential failed" in said["--debug"].stderr.split("objmanifest:")[0]


def test_an_account_url_with_a_sas_token_is_refused_without_showing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    for url in (
        f"https://acct.blob.core.windows.net/?sv=2023&sig={SAS_SECRET}",
        f"https://user:{SAS_SECRET}@acct.blob.core.windows.net",
    ):
        with pytest.raises(InvalidInput, match="carries credentials") as info:
            connect_azure(CONTAINER, endpoint_url=url)
        assert SAS_SECRET not in str(info.value)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"AccountKey={KEY_SECRET}")
    with pytest.raises(InvalidInput) as bad:
        connect_azure(CONTAINER)
    assert KEY_SECRET not in str(bad.value)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"garbage {KEY_SECRET}")
    with pytest.raises(InvalidInput, match="is not a connection string") as bad:
        connect_azure(CONTAINER)
    assert KEY_SECRET not in str(bad.value)
