"""Asking a store what it enforces, before trusting it with a task.

Stores that accept conditional headers without enforcing them are the commonest failure in
this field: a SeaweedFS release answered 200 to three concurrent ``If-None-Match: *`` PUTs
of one key, a MinIO release let ``If-Match`` on a missing key succeed, some stores enforce
the headers only on GET. So the probe writes, and races, on an object of its own:

* ``probe_conditional_writes`` (run by ``Task.create``): a create-only PUT refused on an
  existing key, an ``If-Match`` with a stale ETag refused, one on a deleted key refused,
  and two races: ``RACERS`` concurrent create-only PUTs of one new key and ``RACERS``
  concurrent ``If-Match`` PUTs of one version, of which exactly one each must land: 15
  requests in 11 round trips, the racers of a race released at once (``Runtime.at_once``).
  An S3 store found safe is not asked again by the same process.
* ``probe_store`` (run by ``objmanifest doctor``): the same, with more racers, and
  conditional multipart completion, the ``Date`` header, ranged reads, listing and digest
  verification, each reported with how the store answered (``Check``). A call refused with
  ``AccessDenied`` is reported as such (``Denied``), naming the call, and the probe goes on.

Every probe write has a body of its own and is read back when its answer is a refusal or
lost, so a lost response (or a client retry meeting its own write) is not taken for a
refusal, and a race is judged on what landed, not only on what was answered. Probe objects
live under ``PROBE_PREFIX`` and are removed at the end; one left by a probe that died is
removed by ``gc`` once its body is a finished one (it starts with ``current:``).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from ..errors import AccessDenied, NotFound, ObjManifestError, StoreError
from .base import CREATE, OVERWRITE, Blob, Digested, Explained, ObjectStore, PutMode, Remote
from .errors import NoSuchObject, OutcomeUnknown, PartsRejected, PreconditionFailed, UploadGone
from .s3 import S3Store

PROBE_PREFIX = ".objmanifest-probe/"

RACERS = 3
"""Concurrent writers of each race at ``Task.create`` (three: what the SeaweedFS release
mentioned above let all win). Some stores make each loser of a race wait: SeaweedFS 4.48
answers them about a second apart, so on it a race costs up to ``RACERS - 1`` seconds."""

DOCTOR_RACERS = 8
"""Concurrent writers of each race in ``objmanifest doctor``."""

RACE_ROUNDS = 3
"""A race nobody won (every racer refused, as a store may answer 409 to all of them) is run
again, up to this many times in all, before it counts as a failure."""

STALE_ETAG = '"00000000000000000000000000000000"'

log = logging.getLogger(__name__)


Verdict = Literal["ok", "failed", "denied", "error", "skipped"]


@dataclass(frozen=True)
class Denied:
    """A call the store refused with ``AccessDenied``: the ``ObjectStore`` method (``op``),
    the key relative to the store's prefix, and its full address."""

    op: str
    key: str
    address: str


@dataclass(frozen=True)
class Check:
    """One thing the probe asked the store, and how it answered.

    ``required``: objmanifest is not safe (or cannot work) on a store that fails it;
    otherwise it is informational. ``verdict`` is ``ok`` or ``failed``, or ``denied`` /
    ``error`` / ``skipped`` when the store's answer did not tell (a refused call, a fault, an
    earlier step that could not run). ``problem`` says what is wrong when it failed.
    """

    name: str
    required: bool
    verdict: Verdict
    answer: str
    problem: str = ""
    denied: Denied | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


@dataclass
class ProbeReport:
    """Every check of one probe run, and the store's time as its ``Date`` headers said."""

    url: str
    checks: list[Check] = field(default_factory=list)
    store_time: datetime | None = None

    @property
    def safe(self) -> bool:
        """Every required check passed."""
        return all(c.ok for c in self.checks if c.required)

    @property
    def failed(self) -> list[Check]:
        """The required checks the store failed (not those it could not be asked)."""
        return [c for c in self.checks if c.required and c.verdict == "failed"]

    @property
    def undecided(self) -> list[Check]:
        """The required checks the store's answers did not decide (denied, error, skipped)."""
        return [c for c in self.checks if c.required and c.verdict not in ("ok", "failed")]

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)


# The names of the checks.
CREATE_ONLY = "create-only"
CREATE_RACE = "create-only race"
UPDATE_IF_MATCH = "update-if-match"
UPDATE_MISSING = "update-if-match, missing key"
UPDATE_RACE = "update-if-match race"
MULTIPART = "conditional multipart completion"
DATE = "Date header"
RANGES = "ranged reads"
LISTING = "listing"
DIGEST = "digest verification"
REFUSALS = "409 vs 412"

ORDER = (
    CREATE_ONLY,
    CREATE_RACE,
    UPDATE_IF_MATCH,
    UPDATE_MISSING,
    UPDATE_RACE,
    MULTIPART,
    DATE,
    RANGES,
    LISTING,
    DIGEST,
    REFUSALS,
)
"""The checks as ``probe_store`` reports them."""


_VERIFIED: set[tuple[str, str]] = set()
"""(endpoint, bucket) of the S3 stores this process found safe: what a store enforces does
not depend on the prefix, and it is not asked again for every task created."""
_VERIFIED_LOCK = threading.Lock()


def _identity(store: ObjectStore) -> tuple[str, str] | None:
    """What a verdict is about: a remote store's endpoint and bucket (or account and
    container). None for a store in this process (``MemoryStore`` and the like), which is
    asked every time: it costs nothing, and a simulation replays the same calls whatever ran
    before."""
    if isinstance(store, S3Store):
        return str(getattr(store.client.meta, "endpoint_url", "")), store.bucket
    if isinstance(store, Remote):
        return store.identity
    return None


def probe_conditional_writes(store: ObjectStore, key: str, racers: int = RACERS) -> list[str]:
    """What this store gets wrong about conditional writes; empty when it enforces them.

    The protocol is only safe on a store that refuses a second ``If-None-Match: *`` create,
    an ``If-Match`` with a stale ETag or on a missing key, and lets exactly one of several
    concurrent conditional writers win, so ``Task.create`` asks before trusting it. A store
    fault (``AccessDenied`` included) is raised. An S3 store (endpoint and bucket) found safe
    is not asked again by this process.
    """
    identity = _identity(store)
    with _VERIFIED_LOCK:
        if identity is not None and identity in _VERIFIED:
            return []
    probe = _Probe(store, key, racers, tolerant=False)
    try:
        checks = probe.conditional()
    finally:
        probe.clean_up()
    problems = [c.problem for c in checks if c.verdict == "failed"]
    if identity is not None and not problems:
        with _VERIFIED_LOCK:
            _VERIFIED.add(identity)
    return problems


def probe_store(store: ObjectStore, key: str, racers: int = DOCTOR_RACERS) -> ProbeReport:
    """Every check, each with how the store answered; a refused or failing call is
    reported in its check, and the probe goes on with the next."""
    probe = _Probe(store, key, racers, tolerant=True)
    report = ProbeReport(store.url)
    try:
        report.checks += probe.conditional()
        report.checks.append(probe.step(MULTIPART, True, probe.multipart))
        report.checks.append(probe.step(DATE, True, probe.date))
        report.checks.append(probe.step(RANGES, True, probe.ranges))
        report.checks.append(probe.step(LISTING, True, probe.listing))
        report.checks.append(probe.step(DIGEST, False, probe.digest))
    finally:
        probe.clean_up()
    report.store_time = probe.store_time
    report.checks.append(Check(REFUSALS, False, "ok", probe.refusals()))
    report.checks.sort(key=lambda c: ORDER.index(c.name))
    return report


@dataclass(frozen=True)
class _Fail:
    """What a check returns when the store failed it: the problem, and its answer in short."""

    problem: str
    answer: str = ""


Outcome = str | _Fail
"""A check's result: how the store answered (it passed), or why it failed."""


@dataclass
class _Race:
    landed: set[int]
    answers: Counter[str]
    final: Blob | None
    rounds: int
    slowest: float
    """Seconds until the last racer had its answer."""


class _Probe:
    """One run: the probe object ``key`` (and, for the doctor, objects beside it)."""

    def __init__(self, store: ObjectStore, key: str, racers: int, tolerant: bool) -> None:
        self.store = store
        self.key = key
        self.racers = max(2, racers)
        self.tolerant = tolerant
        self.nonce = store.runtime.new_id()
        self.op = ("", "")  # the call under way: (ObjectStore method, key)
        self.etag = ""  # the probe object's version, as last read
        self.refused: dict[str, Counter[str]] = {}  # check -> answers of refused writes
        self.written: set[str] = set()  # keys that may exist and must be removed
        self.uploads: list[tuple[str, str]] = []  # uploads that may be open
        self.store_time: datetime | None = None

    # -- calls -----------------------------------------------------------------------------

    def at(self, op: str, key: str) -> ObjectStore:
        """The store, for one call of ``op`` on ``key`` (named if the call is refused)."""
        self.op = (op, key)
        return self.store

    def put(self, key: str, body: bytes, mode: PutMode = OVERWRITE) -> str:
        """Write ``key``, noting it for removal once something may be there (a write the
        store refused for lack of permission, or answered as no S3 store does, left
        nothing)."""
        try:
            etag = self.at("put", key).put(key, body, mode=mode)
        except (PreconditionFailed, OutcomeUnknown):
            self.written.add(key)
            raise
        self.written.add(key)
        return etag

    def get(self, key: str) -> Blob | None:
        """The object, or None if there is none."""
        try:
            return self.at("get", key).get(key)
        except NoSuchObject:
            return None

    def refusal(self, check: str, answer: str) -> None:
        self.refused.setdefault(check, Counter())[answer or "refused"] += 1

    def accepted(self, check: str, body: bytes, mode: PutMode) -> tuple[bool, Blob | None]:
        """Did the store take this write of the probe object? A refusal or a lost answer is
        judged by reading the object back; returns the verdict and the object as read back
        (None if it was not read, or is not there)."""
        try:
            self.put(self.key, body, mode)
            return True, None
        except PreconditionFailed as e:
            self.refusal(check, e.answer)
        except OutcomeUnknown:
            pass
        blob = self.get(self.key)
        return blob is not None and blob.body == body, blob

    def step(self, name: str, required: bool, run: Callable[[], Outcome]) -> Check:
        """Run one check and give its verdict. A probe object gone from under a read
        (another probe's clean-up, a lifecycle rule) is the public ``NotFound`` naming it."""
        try:
            try:
                outcome = run()
            except NoSuchObject as e:
                raise NotFound(str(e)) from e
        except AccessDenied as e:
            if not self.tolerant:
                raise
            op, key = self.op
            denied = Denied(op, key, self.store.describe(key))
            return Check(name, required, "denied", str(e), denied=denied)
        except (StoreError, NotFound, UploadGone, PartsRejected, OutcomeUnknown) as e:
            if not self.tolerant:
                raise
            return Check(name, required, "error", f"{type(e).__name__}: {e}")
        if isinstance(outcome, _Fail):
            answer = self.how(name, outcome.answer or outcome.problem)
            return Check(name, required, "failed", answer, outcome.problem)
        return Check(name, required, "ok", self.how(name, outcome))

    def how(self, name: str, answer: str) -> str:
        """The store's answer, and the mechanism that enforces the check on it, if it says."""
        if isinstance(self.store, Explained) and name in self.store.enforces:
            return f"{answer} [{self.store.enforces[name]}]"
        return answer

    # -- conditional writes ------------------------------------------------------------------

    def conditional(self) -> list[Check]:
        """The conditional-write checks, in order; each needs the one before it, so once one
        could not run to its end the rest are skipped."""
        steps: list[tuple[str, Callable[[], Outcome]]] = [
            (CREATE_RACE, self.create_race),
            (CREATE_ONLY, self.create_again),
            (UPDATE_IF_MATCH, self.stale),
            (UPDATE_RACE, self.update_race),
            (UPDATE_MISSING, self.missing),
        ]
        checks: list[Check] = []
        for name, run in steps:
            if checks and checks[-1].verdict not in ("ok", "failed"):
                checks.append(
                    Check(name, True, "skipped", f"not run: {checks[-1].name} could not finish")
                )
                continue
            checks.append(self.step(name, True, run))
        return checks

    def race(self, check: str, tag: str, mode: PutMode, round_: int) -> _Race:
        """``racers`` writes of the probe object at once, each with a body of its own."""
        bodies = [f"{tag}:{self.nonce}:{round_}:{i}".encode() for i in range(self.racers)]
        store = self.at("put", self.key)

        clock = store.runtime.monotonic
        began = clock()

        def write(i: int) -> tuple[str, str, float]:
            try:
                store.put(self.key, bodies[i], mode=mode)
                outcome = "won", ""
            except PreconditionFailed as e:
                outcome = "refused", e.answer or "refused"
            except OutcomeUnknown:
                outcome = "unknown", "no answer"
            self.written.add(self.key)  # one object, there or maybe there
            return (*outcome, clock() - began)

        timed: list[tuple[str, str, float]] = store.runtime.at_once(
            [functools.partial(write, i) for i in range(self.racers)]
        )
        results = [(result, answer) for result, answer, _ in timed]
        final = self.get(self.key)
        landed = {i for i, (result, _) in enumerate(results) if result == "won"}
        if final is not None and final.body in bodies:
            landed.add(bodies.index(final.body))
        answers = Counter(answer for result, answer in results if result != "won")
        self.refused.setdefault(check, Counter()).update(answers)
        return _Race(landed, answers, final, round_, max(t for _, _, t in timed))

    def judge(self, check: str, tag: str, mode: PutMode, what: str) -> _Race | _Fail:
        """Race until someone wins (at most ``RACE_ROUNDS`` times); more than one winner
        fails the check at once."""
        answers: Counter[str] = Counter()
        for round_ in range(1, RACE_ROUNDS + 1):
            outcome = self.race(check, tag, mode, round_)
            if len(outcome.landed) > 1:
                return _Fail(
                    f"{what} is not enforced under concurrency: {len(outcome.landed)} of "
                    f"{self.racers} concurrent {what} PUTs of one key succeeded",
                    f"{len(outcome.landed)} of {self.racers} won",
                )
            if outcome.landed:
                if outcome.final is not None:
                    self.etag = outcome.final.etag
                return outcome
            answers = outcome.answers
        return _Fail(
            f"none of {self.racers} concurrent {what} PUTs of one key succeeded, "
            f"{RACE_ROUNDS} times over (answers: {_counts(answers)})",
            f"none of {self.racers} won, {RACE_ROUNDS} times",
        )

    def create_race(self) -> Outcome:
        outcome = self.judge(CREATE_RACE, "create", CREATE, "If-None-Match: *")
        return outcome if isinstance(outcome, _Fail) else _won(self.racers, outcome)

    def create_again(self) -> Outcome:
        taken, _ = self.accepted(CREATE_ONLY, f"create-again:{self.nonce}".encode(), CREATE)
        if taken:
            return _Fail("If-None-Match: * is ignored (a second create of one key succeeded)")
        return f"a create of an existing key is refused ({self.answers(CREATE_ONLY)})"

    def stale(self) -> Outcome:
        body = f"stale:{self.nonce}".encode()
        taken, blob = self.accepted(UPDATE_IF_MATCH, body, PutMode.update(STALE_ETAG))
        if taken:
            return _Fail("If-Match is ignored (a write with a stale ETag succeeded)")
        if blob is None:
            raise StoreError(f"the probe object {self.store.describe(self.key)} vanished")
        self.etag = blob.etag
        return f"a stale ETag is refused ({self.answers(UPDATE_IF_MATCH)})"

    def update_race(self) -> Outcome:
        # The probe's last write of the object: gc may remove a body that starts "current:".
        outcome = self.judge(UPDATE_RACE, "current:update", PutMode.update(self.etag), "If-Match")
        if isinstance(outcome, _Fail):
            if outcome.problem.startswith("none of"):
                return _Fail(f"If-Match with the current ETag was refused ({outcome.problem})")
            return outcome
        return _won(self.racers, outcome)

    def missing(self) -> Outcome:
        self.remove(self.key)
        body = f"current:gone:{self.nonce}".encode()
        taken, _ = self.accepted(UPDATE_MISSING, body, PutMode.update(self.etag))
        if taken:
            return _Fail(
                "If-Match on a missing key succeeded (a write naming the version of a deleted "
                "object recreated it)"
            )
        self.written.discard(self.key)
        return f"refused ({self.answers(UPDATE_MISSING)})"

    def remove(self, key: str) -> None:
        """Delete ``key``, making sure it is gone when the answer was lost (a lost answer
        to a delete is a ``StoreError``; the delete may have been applied)."""
        try:
            self.at("delete", key).delete(key)
        except (StoreError, OutcomeUnknown):
            if self.get(key) is not None:
                self.at("delete", key).delete(key)
        self.written.discard(key)

    def answers(self, check: str) -> str:
        return _counts(self.refused.get(check, Counter())) or "no answer"

    # -- the doctor's other checks -------------------------------------------------------------

    def beside(self, name: str) -> str:
        return f"{self.key}~{name}"

    def multipart(self) -> Outcome:
        """A create-only completion lands on a new key and is refused on an existing one."""
        key = self.beside("multipart")
        first = f"current:multipart:1:{self.nonce}".encode()
        for body, expect in ((first, True), (f"current:multipart:2:{self.nonce}".encode(), False)):
            upload_id = self.at("create_upload", key).create_upload(key)
            self.uploads.append((key, upload_id))
            etag = self.at("upload_part", key).upload_part(key, upload_id, 1, body)
            try:
                self.at("complete_upload", key).complete_upload(key, upload_id, [etag], CREATE)
                done = True
            except PreconditionFailed as e:
                self.refusal(MULTIPART, e.answer)
                done = False
            except OutcomeUnknown:
                blob = self.get(key)
                done = blob is not None and blob.body == body
            self.written.add(key)
            if done:
                self.uploads.remove((key, upload_id))
            if done != expect:
                return _Fail(
                    "a create-only multipart completion of a new key was refused"
                    if expect
                    else "a create-only multipart completion (S3: If-None-Match: *; GCS: compose "
                    "with ifGenerationMatch=0) replaced an existing object: chunked entries are "
                    "not safe on this store"
                )
        blob = self.get(key)
        if blob is None or blob.body != first:
            return _Fail("a refused multipart completion changed the object")
        return f"refused over an existing key ({self.answers(MULTIPART)})"

    def ranges(self) -> Outcome:
        key = self.beside("range")
        body = b"current:" + bytes(range(256)) * 2
        self.put(key, body)
        for start, end in ((100, 150), (500, 10_000)):
            stream = self.at("open", key).open(key, (start, end))
            try:
                got = stream.read()
            finally:
                stream.close()
            if got != body[start:end]:
                return _Fail(
                    f"bytes {start}-{end} of a {len(body)}-byte object came back as "
                    f"{len(got)} bytes, not the {len(body[start:end])} asked for"
                )
        return "a range, and one past the end, read exactly"

    def listing(self) -> Outcome:
        base = self.beside("list/")
        keys = [f"{base}a", f"{base}b/c"]
        for key in keys:
            self.put(key, b"current:list")
        found = [row.key for row in self.at("list", base).list(base)]
        if found != keys:
            return _Fail(f"a listing of 2 keys gave {found}")
        rows = self.at("list", base).list(base, delimiter="/")
        rolled = [(row.key, row.is_prefix) for row in rows]
        if rolled != [(keys[0], False), (f"{base}b/", True)]:
            return _Fail(f"a listing with a delimiter gave {rolled}")
        return "keys in order; a delimiter rolls up common prefixes"

    def digest(self) -> Outcome:
        if not isinstance(self.store, Digested):
            said = getattr(self.store, "integrity", None)
            return str(said or "not asked: an in-process store has no transit to damage")
        key = self.beside("digest")
        body = f"current:digest:{self.nonce}".encode()
        self.op = ("put", key)
        stored, answer = self.store.put_digested(key, body, _md5(body + b"!"))
        if stored:
            self.written.add(key)
            return _Fail(
                "a PUT whose Content-MD5 is wrong was stored: a body damaged in transit "
                "would be kept",
                "not verified: a PUT with a wrong Content-MD5 was stored",
            )
        good, right = self.store.put_digested(key, body, _md5(body))
        if not good:
            return _Fail(f"a PUT with the right Content-MD5 was refused ({right})")
        self.written.add(key)
        return f"a wrong Content-MD5 is refused ({answer})"

    def date(self) -> Outcome:
        self.store_time = self.at("now", "").now()
        return "usable: the store's time is read from it"

    def refusals(self) -> str:
        """How the store said no (409 or 412, or 404 for a missing key), and where."""
        where: dict[str, list[str]] = {}
        for check in ORDER:
            for answer, n in self.refused.get(check, Counter()).most_common():
                where.setdefault(answer, []).append(f"{check} x{n}" if n > 1 else check)
        parts = [f"{answer} ({', '.join(checks)})" for answer, checks in where.items()]
        return "; ".join(parts) or "no refusal seen"

    # -- cleaning up ------------------------------------------------------------------------

    def clean_up(self) -> None:
        for key, upload_id in self.uploads:
            try:
                self.store.abort_upload(key, upload_id)
            except (ObjManifestError, OutcomeUnknown, UploadGone) as e:
                log.warning("could not abort the probe upload %s: %s", self.store.describe(key), e)
        for key in sorted(self.written):
            try:
                self.store.delete(key)
            except (ObjManifestError, OutcomeUnknown) as e:
                log.warning("could not remove the probe object %s: %s", self.store.describe(key), e)


def _md5(body: bytes) -> str:
    """A body's MD5, as a Content-MD5 header carries it."""
    return base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()


def _counts(answers: Counter[str]) -> str:
    return ", ".join(f"{answer} x{n}" if n > 1 else answer for answer, n in answers.most_common())


def _won(racers: int, outcome: _Race) -> str:
    again = f" (in round {outcome.rounds}: nobody won before)" if outcome.rounds > 1 else ""
    rest = f"; the others: {_counts(outcome.answers)}" if outcome.answers else ""
    return f"1 of {racers} won{rest}, the last answer after {outcome.slowest:.2f}s{again}"
