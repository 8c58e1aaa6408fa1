"""Knowing the store: the probe ``Task.create`` runs (with its races) and ``objmanifest
doctor``.

Stores that get conditional writes wrong in the ways seen in the field are ``MemoryStore``s
that break one promise each: checking a condition and writing with nothing between (racing
writers all win, as a SeaweedFS release did for three concurrent creates), letting
``If-Match`` on a missing key succeed (a MinIO release), answering 409 to every racer. The
doctor runs against the real servers, against one behind a proxy that strips conditional
headers, and against one whose proxy refuses calls with ``AccessDenied``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import uuid
from email.utils import formatdate
from typing import Any

import pytest

import objmanifest as om
from objmanifest.cli import main
from objmanifest.store import PROBE_PREFIX, MemoryBackend, PutMode
from objmanifest.store.errors import PreconditionFailed
from objmanifest.store.probe import (
    CREATE_RACE,
    ORDER,
    RACE_ROUNDS,
    RACERS,
    UPDATE_MISSING,
    UPDATE_RACE,
    probe_conditional_writes,
    probe_store,
)
from tests.support.faults import FaultProxy, ignoring_conditions
from tests.support.internals import engine
from tests.support.stores import BUCKET, Server

RACER_THREADS = "objmanifest-race-"
"""The probe's racers run in threads of these names (``Runtime.at_once``)."""


def racing() -> bool:
    return threading.current_thread().name.startswith(RACER_THREADS)


class CheckThenWrite(MemoryBackend):
    """Checks a conditional write's condition, then writes, with nothing between: each
    write alone is right, but the probe's racers all pass the check before any writes (a
    barrier holds them between the two), so all of them win."""

    def __init__(self, *args: Any, racy: tuple[str, ...] = ("create", "update"), **kw: Any):
        super().__init__(*args, **kw)
        self.racy = racy
        self.barrier = threading.Barrier(RACERS, timeout=30)

    def put(self, key: str, body: Any, *, mode: PutMode = om.store.OVERWRITE, **kw: Any) -> str:
        if not (racing() and mode.kind in self.racy):
            return super().put(key, body, mode=mode, **kw)
        with self._data.lock:
            self._check(self.full_key(key), key, mode)
        self.barrier.wait()
        return super().put(key, body, mode=om.store.OVERWRITE, **kw)


class UpdatesMissingKeys(MemoryBackend):
    """``If-Match`` on a missing key writes it (a MinIO release did)."""

    def put(self, key: str, body: Any, *, mode: PutMode = om.store.OVERWRITE, **kw: Any) -> str:
        with self._data.lock:
            missing = self.full_key(key) not in self._data.objects
        if mode.kind == "update" and missing:
            mode = om.store.OVERWRITE
        return super().put(key, body, mode=mode, **kw)


class RefusesRacers(MemoryBackend):
    """Answers 409 to the first ``refusals`` racing writes without applying them."""

    def __init__(self, *args: Any, refusals: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.refusals = refusals
        self._lock = threading.Lock()

    def put(self, key: str, body: Any, *, mode: PutMode = om.store.OVERWRITE, **kw: Any) -> str:
        if racing():
            with self._lock:
                refuse, self.refusals = self.refusals > 0, self.refusals - 1
            if refuse:
                raise PreconditionFailed(key, answer="409 ConditionalRequestConflict")
        return super().put(key, body, mode=mode, **kw)


def bucket() -> str:
    return f"probe-{uuid.uuid4().hex[:10]}"


def keys(store: om.ObjectStore) -> list[str]:
    return list(om.store.list_keys(store, ""))


# -- the probe at Task.create ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("racy", "problem"),
    [
        (("create",), "If-None-Match: * is not enforced under concurrency: 3 of 3 concurrent"),
        (("update",), "If-Match is not enforced under concurrency: 3 of 3 concurrent If-Match"),
    ],
)
def test_a_store_whose_conditions_lose_races_is_refused_at_create(
    racy: tuple[str, ...], problem: str
) -> None:
    store = CheckThenWrite(bucket(), "p", racy=racy)
    with pytest.raises(om.UnsupportedStore, match="does not enforce conditional") as refused:
        om.Task.create(store, "job", stages=["a"])
    message = str(refused.value)
    assert problem in message, message
    assert "objmanifest doctor" in message
    # One write at a time it is right: only the race is named.
    assert message.count("not enforced under concurrency") == 1, message
    assert "is ignored" not in message
    assert keys(store) == [], "the probe left objects behind, or the task was created"


def test_a_store_where_if_match_on_a_missing_key_succeeds_is_refused_at_create() -> None:
    store = UpdatesMissingKeys(bucket(), "p")
    with pytest.raises(om.UnsupportedStore, match="If-Match on a missing key succeeded"):
        om.Task.create(store, "job", stages=["a"])
    assert keys(store) == []


def test_a_race_nobody_won_is_run_again_before_it_counts() -> None:
    """A store may answer 409 to every racer; that is safe, so the race is run again."""
    store = RefusesRacers(bucket(), "p", refusals=RACERS)  # the whole first round
    task = om.Task.create(store, "job", stages=["a"])
    assert keys(store) == [engine(task).header_key("job")]
    report = probe_store(RefusesRacers(bucket(), "p", refusals=RACERS), PROBE_PREFIX + "x", RACERS)
    race = report.check(CREATE_RACE)
    assert race.ok and "in round 2: nobody won before" in race.answer
    assert "409 ConditionalRequestConflict" in report.check("409 vs 412").answer


def test_a_race_nobody_ever_wins_is_refused() -> None:
    store = RefusesRacers(bucket(), "p", refusals=RACERS * RACE_ROUNDS)
    with pytest.raises(om.UnsupportedStore, match=f"none of {RACERS} concurrent If-None-Match"):
        om.Task.create(store, "job", stages=["a"])
    assert keys(store) == []


def test_the_create_probe_costs_fifteen_requests_in_eleven_round_trips() -> None:
    """Two races of RACERS writers (each one round trip), three single writes, a read after
    each race and refusal, one delete; then the header. Nothing is left behind."""
    store = om.MemoryStore(bucket(), "p")
    om.Task.create(store, "job", stages=["a"])
    assert dict(store.faults.calls) == {"put": 2 * RACERS + 3 + 1, "get": 5, "delete": 1}
    assert keys(store) == ["job/task.json"]


def test_lost_answers_to_racers_and_to_the_delete_are_not_taken_for_refusals() -> None:
    store = om.MemoryStore(bucket(), "p")
    store.faults.add("put", PROBE_PREFIX, effect="lose", times=RACERS + 2)
    store.faults.add("delete", PROBE_PREFIX, effect="lose")
    assert probe_conditional_writes(store, PROBE_PREFIX + "x") == []
    assert keys(store) == []


# -- the whole probe (doctor) on MemoryStore -----------------------------------------------------


def test_the_whole_probe_passes_on_memory_and_leaves_nothing() -> None:
    store = om.MemoryStore(bucket(), "p")
    report = probe_store(store, PROBE_PREFIX + "x")
    assert [c.name for c in report.checks] == list(ORDER)
    assert report.safe and not report.failed and not report.undecided
    assert all(c.ok for c in report.checks), report.checks
    assert report.check("digest verification").answer.startswith("not asked")
    assert report.store_time is not None
    assert keys(store) == [] and list(store.list_uploads("")) == []


def test_a_racy_store_fails_the_races_and_nothing_else() -> None:
    report = probe_store(CheckThenWrite(bucket(), "p"), PROBE_PREFIX + "x", racers=RACERS)
    failed = {c.name for c in report.failed}
    assert failed == {CREATE_RACE, UPDATE_RACE}
    assert report.check(CREATE_RACE).answer == f"{RACERS} of {RACERS} won"
    assert not report.safe


def test_a_refused_call_is_reported_with_what_it_was_and_the_rest_goes_on() -> None:
    store = om.MemoryStore(bucket(), "p")

    def deny(op: str, key: str) -> None:
        if op == "delete" or op == "create_upload":
            raise om.AccessDenied(f"refused to {op} {key} (AccessDenied)")

    store.faults.hooks.append(deny)
    report = probe_store(store, PROBE_PREFIX + "x")
    missing = report.check(UPDATE_MISSING)
    assert missing.verdict == "denied" and missing.denied is not None
    assert (missing.denied.op, missing.denied.key) == ("delete", PROBE_PREFIX + "x")
    multipart = report.check("conditional multipart completion")
    assert multipart.verdict == "denied" and multipart.denied is not None
    assert multipart.denied.op == "create_upload"
    assert report.check("listing").ok and report.check("ranged reads").ok
    assert {c.name for c in report.undecided} == {UPDATE_MISSING, multipart.name}
    assert not report.safe and not report.failed
    store.faults.hooks.clear()
    for key in keys(store):
        store.delete(key)


# -- doctor against real servers --------------------------------------------------------------

DIGEST_VERIFIED = {"moto": False, "seaweedfs": True}
"""Which servers refuse a PUT whose Content-MD5 is wrong (SeaweedFS: 400 BadDigest; the
moto server stores whatever it gets)."""


def run_doctor(server: Server, prefix: str, *extra: str) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, **server.env, "AWS_ENDPOINT_URL": server.endpoint_url}
    proc = subprocess.run(
        [sys.executable, "-m", "objmanifest", "doctor", "--json", *extra],
        env={**env, "OBJMANIFEST_URL": f"s3://{BUCKET}/{prefix}"},
        capture_output=True,
        timeout=120,
    )
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.behaviour  # so it runs against LocalStack in CI too (localstack/ci.sh)
@pytest.mark.s3_only
def test_doctor_finds_a_real_server_safe_and_says_how_it_answers(
    server: Server, store: om.ObjectStore
) -> None:
    code, report = run_doctor(server, store.prefix)
    checks = {c["name"]: c for c in report["checks"]}
    assert code == 0 and report["safe"] and report["exit_code"] == 0, report
    assert list(checks) == list(ORDER)
    assert all(c["verdict"] == "ok" for c in checks.values() if c["required"]), report
    assert re.fullmatch(
        r"1 of 8 won; the others: .*, the last answer after [\d.]+s", checks[CREATE_RACE]["answer"]
    )
    assert "412 PreconditionFailed" in checks["409 vs 412"]["answer"]
    assert report["store_time"] and abs(report["skew_seconds"]) < 60
    if server.name in DIGEST_VERIFIED:
        verdict = checks["digest verification"]["verdict"]
        assert verdict == ("ok" if DIGEST_VERIFIED[server.name] else "failed"), checks
    assert keys(store) == [], "the doctor left objects behind"


def test_doctor_names_what_a_store_that_ignores_conditions_gets_wrong(
    server: Server, store: om.ObjectStore, capsys: Any
) -> None:
    with ignoring_conditions(server.endpoint_url) as proxy:
        url = f"s3://{BUCKET}/{store.prefix}"
        code = main(["doctor", "--json", "--url", url, "--endpoint-url", proxy.endpoint_url])
    report = json.loads(capsys.readouterr().out)
    failed = {c["name"] for c in report["checks"] if c["verdict"] == "failed" and c["required"]}
    assert code == 12 and not report["safe"], report
    assert failed == {
        "create-only",
        CREATE_RACE,
        "update-if-match",
        UPDATE_MISSING,
        UPDATE_RACE,
        "conditional multipart completion",
    }
    assert keys(store) == []


class DenyingProxy(FaultProxy):
    """Answers ``403 AccessDenied`` (as S3 does, with a Date) to the requests ``denied``
    picks, and forwards the others."""

    def __init__(self, upstream: str, denied: Any) -> None:
        super().__init__(upstream)
        self.denied = denied

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        if self.denied(method, target):
            xml = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
            answer = [("Content-Type", "application/xml"), ("Date", formatdate(usegmt=True))]
            return 403, "Forbidden", answer, xml
        return super()._forward(method, target, headers, body)


def test_doctor_names_the_permission_a_refused_call_lacked(
    server: Server, store: om.ObjectStore, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # the table's rows on one line each

    def denied(method: str, target: str) -> bool:
        return method == "DELETE" or (method == "POST" and target.endswith("?uploads"))

    with DenyingProxy(server.endpoint_url, denied) as proxy:
        url = f"s3://{BUCKET}/{store.prefix}"
        code = main(["doctor", "--json", "--url", url, "--endpoint-url", proxy.endpoint_url])
        report = json.loads(capsys.readouterr().out)
        assert main(["doctor", "--url", url, "--endpoint-url", proxy.endpoint_url]) == code
        table = capsys.readouterr().out
    checks = {c["name"]: c for c in report["checks"]}
    probe = f"arn:aws:s3:::{BUCKET}/{store.prefix}/{PROBE_PREFIX}"
    assert code == 13 and report["exit_code"] == 13 and not report["safe"], report
    assert {n for n, c in checks.items() if c["verdict"] != "ok"} == {
        UPDATE_MISSING,
        "conditional multipart completion",
        "digest verification",  # only when the backend keeps a wrong digest
    } - ({"digest verification"} if DIGEST_VERIFIED.get(server.name, True) else set())
    lacking = checks[UPDATE_MISSING]["missing_permission"]
    assert lacking.startswith(f"s3:DeleteObject on {probe}"), lacking
    lacking = checks["conditional multipart completion"]["missing_permission"]
    assert lacking.startswith(f"s3:PutObject on {probe}") and lacking.endswith("~multipart")
    assert "AccessDenied: needs s3:DeleteObject on" in table
    assert "UNDECIDED: update-if-match, missing key, conditional multipart completion" in table
    for key in keys(store):  # its deletes were refused too
        store.delete(key)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["doctor", "--url", "s3://work/p", "--racers", "1"],
            "must be a whole number from 2 to 64 (writers in a race), not 1",
        ),
        (
            ["doctor", "--url", "s3://work/p", "--racers", "100"],
            "from 2 to 64 (writers in a race), not 100",
        ),
        (["doctor", "--url", "s3://work/a\nb"], "a store URL has no control characters"),
        (["doctor", "--url", "s3://["], "not a store URL: 's3://['"),
        (["iam-policy", "--url", "s3://work/p", "--for", "nobody"], "invalid choice: 'nobody'"),
        (
            ["iam-policy", "--url", "memory://m/x"],
            "there is no cloud access policy for memory://m/x",
        ),
        (["iam-policy", "--url", ""], "no store given: pass --url"),
    ],
)
def test_doctor_and_iam_policy_refuse_bad_arguments_in_one_line(
    argv: list[str], message: str, capsys: Any
) -> None:
    assert main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the usage, if any
    assert last.startswith("objmanifest: ") and message in last, last
