"""A model of a cloud object store for the discrete-event simulation (``des``): the real
library against latencies, per-object conditional-write rates and request-rate limits as
the services publish them.

``ModelStore`` is an ``ObjectStore`` (one per agent, as each agent process has its own
client) over a shared in-memory bucket (``MemoryBackend``) that holds the objects. Each
request arrives at the current simulated instant, is answered after a latency drawn from
the profile for its kind, and is applied at its finish time (the linearisation point), so
requests of many agents overlap as they do on the wire. What the model enforces:

* **Conditional writes to one object** (``If-Match``, ``If-None-Match: *``): a write naming
  a version that is no longer current is refused (412); one arriving while another of its
  object is in flight is refused as in flight (S3: 409 ``ConditionalRequestConflict``;
  GCS: 429, its one write per second per object; Azure: 412). An object takes up a write
  at least ``1 / cas_per_object`` seconds after the one before (a write arriving sooner
  waits that long, on top of its latency), so no object ever accepts more than
  ``cas_per_object`` writes in a second.
* **Request rates per scope** (S3: per key prefix, the key up to its last ``/``, every
  prefix starting at the published rates: S3's gradual scaling up is not assumed; S3
  Express, GCS, Azure: per bucket or account, Azure also per blob): a request beyond the
  scope's rate over the last second is throttled (503 SlowDown, GCS 429) and not served.
* **The client's retries**: a throttled request is sent again as the library's client for
  that store does (``ClientRetry``: botocore's standard mode for S3, five attempts, a
  jittered backoff of up to 1, 2, 4, 8 s, a retry quota; ``google.api_core``'s for GCS, a
  backoff from 0.5 s doubling to 16 s for up to 120 s), so a throttle costs time and
  requests; a 409 or 412 goes to the commit loop as a lost race.
* **Faults**, so the checker has something to judge: a write applied whose answer is lost
  (``OutcomeUnknown``), a read refused (503).

The profiles (each cloud's figures and where they come from) are in ``storeprofiles.py``.
Everything served, refused and throttled is counted (``Counts``), with the highest rate any
object and any scope saw.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import BinaryIO

from objmanifest.core.pacing import SendRate
from objmanifest.core.runtime import Runtime
from objmanifest.errors import StoreError
from objmanifest.store import memory
from objmanifest.store.base import (
    CREATE,
    OVERWRITE,
    Blob,
    ByteStream,
    Head,
    Listed,
    PartBody,
    PartsListed,
    PutMode,
    read_whole,
)
from objmanifest.store.errors import OutcomeUnknown, PreconditionFailed
from objmanifest.store.memory import MemoryBackend
from tests.support.des import Scheduler, Stopped
from tests.support.storeprofiles import (
    PROFILE_NAMES,
    PROFILES,
    ClientRetry,
    Kind,
    Latency,
    Limit,
    Prices,
    Profile,
    local_profile,
    profile,
)

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
READS = frozenset({"get", "head", "open", "list", "list_parts", "list_uploads"})
FREE = frozenset({"delete", "abort_upload"})
"""Requests S3 does not charge for."""
LISTS = frozenset({"list", "list_parts", "list_uploads"})


# -- the shared state of the store --------------------------------------------------------


@dataclass(frozen=True)
class Faults:
    """Fault rates per request: a write applied whose answer is lost, a read refused."""

    lost_write: float = 0.0
    failed_read: float = 0.0


@dataclass
class Counts:
    """What the store served, refused and throttled, from ``StoreModel.mark`` on."""

    requests: Counter[str] = field(default_factory=Counter)
    """By ``what``: the classifier's name for the key (shard, data ...), op and outcome."""
    billed_writes: int = 0
    billed_reads: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    throttled: int = 0
    busy: int = 0
    stale: int = 0
    retries: int = 0
    faults: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.requests.values())


class _Window:
    """Events of the last second at one scope (one object, one prefix): how many, and the
    most there ever were."""

    __slots__ = ("most", "times")

    def __init__(self) -> None:
        self.times: deque[float] = deque()
        self.most = 0

    def count(self, now: float) -> int:
        times = self.times
        edge = now - 1.0
        while times and times[0] <= edge:
            times.popleft()
        return len(times)

    def add(self, now: float) -> None:
        self.times.append(now)
        if len(self.times) > self.most:
            self.most = len(self.times)


class StoreModel:
    """The state every agent's ``ModelStore`` shares: objects in flight, rate windows and
    counts."""

    def __init__(
        self,
        profile: Profile,
        sched: Scheduler,
        bucket: str,
        faults: Faults = Faults(),
        classify: Callable[[str], str] = lambda key: "object",
    ) -> None:
        self.profile = profile
        self.sched = sched
        self.bucket = bucket
        self.faults = faults
        self.classify = classify
        self.objects = memory._bucket(bucket).objects
        self._busy: dict[str, tuple[float, float]] = {}
        """Per object: when its last conditional write was accepted, and when it finishes."""
        self._cas: dict[str, _Window] = {}
        self._rates: dict[tuple[str, str], _Window] = {}
        self.counts = Counts()
        self._spacing = 1.0 / profile.cas_per_object * (1 + 1e-9) if profile.cas_per_object else 0.0

    def store_clock(self) -> datetime:
        """The store's time: a fixed start plus the simulated seconds."""
        return T0 + timedelta(seconds=self.sched.now)

    def mark(self) -> None:
        """Count from now on (the rate maxima are kept from the start)."""
        self.counts = Counts()

    @property
    def max_object_cas_per_s(self) -> int:
        return max((w.most for w in self._cas.values()), default=0)

    @property
    def max_scope_requests_per_s(self) -> int:
        return max((w.most for w in self._rates.values()), default=0)

    def scope_maxima(self) -> dict[str, int]:
        """The highest rate over a second each limited scope saw, highest first."""
        found = {f"{scope} ({cls})": w.most for (scope, cls), w in self._rates.items()}
        return dict(sorted(found.items(), key=lambda kv: -kv[1]))

    def _throttled(self, op: str, full_key: str, now: float) -> bool:
        """Count the request at every limited scope, unless one of them is at its rate
        (then it is throttled and counted nowhere)."""
        cls = "reads" if op in READS else "writes"
        windows: list[_Window] = []
        for limit in self.profile.limits:
            if limit.scope == "prefix":
                scope = full_key[: full_key.rfind("/") + 1]
            elif limit.scope == "object":
                scope = full_key
            else:
                scope = ""
            for name, rate in ((cls, getattr(limit, cls)), ("total", limit.total)):
                if rate is None:
                    continue
                window = self._rates.get((scope, name))
                if window is None:
                    window = self._rates[(scope, name)] = _Window()
                if window.count(now) >= rate:
                    return True
                windows.append(window)
        for window in windows:
            window.add(now)
        return False

    def arrive(
        self, op: str, full_key: str, mode: PutMode | None, rng: random.Random
    ) -> tuple[str, float]:
        """A request arriving now: its outcome (``ok``, ``stale``, ``busy``, ``throttled``)
        and how long until its answer."""
        profile, now = self.profile, self.sched.now
        if self._throttled(op, full_key, now):
            return "throttled", profile.refusal.sample(rng)
        conditional = mode is not None and mode.kind != "overwrite"
        if not conditional:
            kind: Kind = "list" if op in LISTS else ("get" if op in READS else "put")
            return "ok", profile.latency(kind).sample(rng)
        assert mode is not None
        found = self.objects.get(full_key)
        if (mode.kind == "create" and found is not None) or (
            mode.kind == "update"
            and (found is None or found.etag.strip('"') != (mode.etag or "").strip('"'))
        ):
            return "stale", profile.refusal.sample(rng)
        last = self._busy.get(full_key)
        if last is not None and last[1] > now:
            return "busy", profile.refusal.sample(rng)
        accepted = now if last is None else max(now, last[0] + self._spacing)
        finish = accepted + profile.cas.sample(rng)
        self._busy[full_key] = (accepted, finish)
        window = self._cas.get(full_key)
        if window is None:
            window = self._cas[full_key] = _Window()
        window.count(accepted)
        window.add(accepted)
        return "ok", finish - now


# -- one agent's client -------------------------------------------------------------------

QUOTA, RETRY_COST, NO_RETRY_REFILL = 500, 5, 1
"""botocore's retry quota (``ClientRetry.quota``)."""


class ModelStore:
    """One agent's client of the modelled store (see the module's docstring)."""

    scheme = "model"

    def __init__(self, model: StoreModel, runtime: Runtime, seed: str, prefix: str = "") -> None:
        self.model = model
        self.runtime = runtime
        self.inner = MemoryBackend(model.bucket, prefix, clock=self._clock, runtime=runtime)
        self.prefix = self.inner.prefix
        self._rng = random.Random(seed)
        self._quota = QUOTA
        self._writes = SendRate() if model.profile.retry.paced else None

    def _clock(self) -> datetime:
        return self.model.store_clock()

    def __repr__(self) -> str:
        return f"ModelStore({self.url!r})"

    @property
    def url(self) -> str:
        return (
            f"model://{self.model.bucket}/{self.prefix}"
            if self.prefix
            else f"model://{self.model.bucket}"
        )

    @property
    def connections(self) -> int:
        return 32

    def describe(self, key: str) -> str:
        return f"model://{self.model.bucket}/{self.inner.full_key(key)}"

    def now(self) -> datetime:
        return self.model.store_clock()

    # -- the request ------------------------------------------------------------------------

    def _request(self, op: str, key: str, mode: PutMode | None = None, size: int = 0) -> bool:
        """Send one request and wait for its answer, retrying throttles as its client does;
        returns whether its answer is to be lost (a write: apply it, then raise)."""
        model, sched, rng = self.model, self.model.sched, self._rng
        if sched.stopping:
            raise Stopped()
        full = self.inner.full_key(key)
        what = model.classify(full)
        counts = model.counts
        retry = model.profile.retry
        paced = self._writes if op not in READS else None
        wait = 0.0 if paced is None else paced.turn(sched.now)
        if wait > 0:
            sched.sleep(wait)
        attempt, first = 1, sched.now
        while True:
            outcome, latency = model.arrive(op, full, mode, rng)
            counts = model.counts
            if paced is not None and outcome in ("throttled", "busy"):
                paced.throttled(sched.now)
            counts.requests[f"{what} {op} {outcome}"] += 1
            if outcome == "throttled":
                counts.throttled += 1
            else:
                if op in READS:
                    counts.billed_reads += op not in LISTS
                    counts.billed_writes += op in LISTS
                elif op not in FREE:
                    counts.billed_writes += 1
                    counts.bytes_up += size
            sched.sleep(latency)
            if outcome == "ok":
                if attempt > 1:
                    self._quota = min(QUOTA, self._quota + RETRY_COST)
                else:
                    self._quota = min(QUOTA, self._quota + NO_RETRY_REFILL)
                break
            if outcome == "stale":
                counts.stale += 1
                raise PreconditionFailed(f"{self.describe(key)}: 412 (model)", "412")
            if outcome == "busy" and model.profile.busy != 429:
                counts.busy += 1
                status = model.profile.busy
                raise PreconditionFailed(f"{self.describe(key)}: {status} (model)", str(status))
            if outcome == "busy":
                counts.busy += 1
            spent = (retry.attempts is not None and attempt >= retry.attempts) or (
                retry.quota and self._quota < RETRY_COST
            )
            pause = 0.0 if spent else retry.pause(attempt, rng)
            if spent or (retry.deadline is not None and sched.now + pause - first > retry.deadline):
                raise StoreError(
                    f"could not {op} {self.describe(key)}: {model.profile.throttle} "
                    f"throttled after {attempt} attempts (model)"
                )
            if retry.quota:
                self._quota -= RETRY_COST
            counts.retries += 1
            sched.sleep(pause)
            attempt += 1
        faults = model.faults
        if op in READS:
            if faults.failed_read and rng.random() < faults.failed_read:
                counts.faults["failed read"] += 1
                raise StoreError(f"could not {op} {self.describe(key)}: 503 (model fault)")
            return False
        if (
            faults.lost_write
            and op in ("put", "complete_upload")
            and rng.random() < faults.lost_write
        ):
            counts.faults["lost answer"] += 1
            return True
        return False

    def _lost(self, key: str) -> OutcomeUnknown:
        return OutcomeUnknown(f"{self.describe(key)}: the answer was lost (model fault)")

    # -- objects ------------------------------------------------------------------------------

    def get(self, key: str, if_none_match: str | None = None) -> Blob | None:
        self._request("get", key)
        blob = self.inner.get(key, if_none_match)
        if blob is not None:
            self.model.counts.bytes_down += len(blob.body)
        return blob

    def head(self, key: str) -> Head:
        self._request("head", key)
        return self.inner.head(key)

    def open(self, key: str, byte_range: tuple[int, int] | None = None) -> ByteStream:
        self._request("open", key)
        return self.inner.open(key, byte_range)

    def put(
        self,
        key: str,
        body: bytes | BinaryIO,
        *,
        mode: PutMode = OVERWRITE,
        metadata: dict[str, str] | None = None,
        content_type: str = "application/octet-stream",
    ) -> str:
        data = body if isinstance(body, bytes) else read_whole(body)
        lose = self._request("put", key, mode, len(data))
        etag = self.inner.put(key, data, mode=mode, metadata=metadata, content_type=content_type)
        if lose:
            raise self._lost(key)
        return etag

    def delete(self, key: str) -> None:
        self._request("delete", key)
        self.inner.delete(key)

    def list(self, prefix: str, delimiter: str | None = None) -> Iterator[Listed]:
        self._request("list", prefix)
        rows = list(self.inner.list(prefix, delimiter))
        for _ in range(len(rows) // 1000):  # a page of 1,000 rows per request
            self._request("list", prefix)
        return iter(rows)

    def create_upload(self, key: str) -> str:
        self._request("create_upload", key)
        return self.inner.create_upload(key)

    def upload_part(self, key: str, upload_id: str, number: int, body: PartBody) -> str:
        self._request("upload_part", key)
        return self.inner.upload_part(key, upload_id, number, body)

    def list_parts(self, key: str, upload_id: str) -> PartsListed:
        self._request("list_parts", key)
        return self.inner.list_parts(key, upload_id)

    def complete_upload(
        self, key: str, upload_id: str, etags: Sequence[str], mode: PutMode = CREATE
    ) -> None:
        lose = self._request("complete_upload", key, mode)
        self.inner.complete_upload(key, upload_id, etags, mode)
        if lose:
            raise self._lost(key)

    def abort_upload(self, key: str, upload_id: str) -> bool:
        self._request("abort_upload", key)
        return self.inner.abort_upload(key, upload_id)

    def list_uploads(self, prefix: str) -> Iterator[tuple[str, str]]:
        self._request("list_uploads", prefix)
        return iter(list(self.inner.list_uploads(prefix)))


__all__ = [
    "PROFILES",
    "PROFILE_NAMES",
    "ClientRetry",
    "Counts",
    "Faults",
    "Latency",
    "Limit",
    "ModelStore",
    "Prices",
    "Profile",
    "StoreModel",
    "local_profile",
    "profile",
]
