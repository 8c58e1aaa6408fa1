"""The profiles of the store model (``storemodel.py``): each cloud's latencies, per-object
conditional-write rate, request-rate limits, list prices and client retry, with the sources
they come from; and the local profile (SeaweedFS behind the latency proxy)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from objmanifest.store import gcs_client

Kind = Literal["get", "put", "cas", "list"]


@dataclass(frozen=True)
class Latency:
    """A log-normal latency given by its median and 99th percentile, in seconds."""

    median: float
    p99: float

    def sample(self, rng: random.Random) -> float:
        sigma = math.log(self.p99 / self.median) / 2.3263478740408408
        return self.median * math.exp(sigma * rng.gauss(0.0, 1.0))


@dataclass(frozen=True)
class Limit:
    """Requests per second one scope serves: ``reads`` (GET, HEAD, LIST), ``writes`` (PUT,
    POST, DELETE) or ``total`` (either); None: no limit of that class."""

    scope: Literal["prefix", "bucket", "object"]
    reads: float | None = None
    writes: float | None = None
    total: float | None = None


@dataclass(frozen=True)
class Prices:
    """List prices in dollars: per 1,000 write-class (PUT, COPY, POST, LIST) and read-class
    (GET, HEAD) requests, per GB sent up and read back; where they come from."""

    writes: float
    reads: float
    upload_gb: float = 0.0
    download_gb: float = 0.0
    source: str = ""


S3_PRICES = Prices(
    0.005, 0.0004, source="https://aws.amazon.com/s3/pricing/ (S3 Standard, us-east-1)"
)
EXPRESS_PRICES = Prices(
    0.00113,
    0.00003,
    0.0032,
    0.0006,
    source="https://aws.amazon.com/s3/pricing/ (S3 Express One Zone, us-east-1)",
)


@dataclass(frozen=True)
class ClientRetry:
    """How a profile's client sends a throttled request again: a pause drawn uniformly up
    to ``initial * multiplier ** (n - 1)`` s after the n-th try (at most ``maximum``), for
    at most ``attempts`` tries or ``deadline`` s, and botocore's retry ``quota`` or none."""

    initial: float
    maximum: float
    multiplier: float = 2.0
    attempts: int | None = None
    deadline: float | None = None
    quota: bool = False
    paced: bool = False
    """Writes paced by the library's ``SendRate`` once the store throttles one."""

    def pause(self, attempt: int, rng: random.Random) -> float:
        return rng.random() * min(self.maximum, self.initial * self.multiplier ** (attempt - 1))


BOTOCORE_STANDARD = ClientRetry(1.0, 20.0, attempts=5, quota=True)
"""botocore's standard retry mode, as ``S3Store``'s client is configured (every profile
but GCS's)."""
GCS_CLIENT = ClientRetry(
    gcs_client.BACKOFF_INITIAL,
    gcs_client.BACKOFF_MAXIMUM,
    gcs_client.BACKOFF_MULTIPLIER,
    deadline=gcs_client.RETRY_DEADLINE,
    paced=True,
)
"""``GCSStore``'s retry (``google.api_core``): no attempt limit, no quota, a deadline; its
writes paced after a throttle (``core.pacing.SendRate``)."""


@dataclass(frozen=True)
class Profile:
    """One store as the model serves it (see the module's docstring)."""

    name: str
    description: str
    get: Latency
    put: Latency
    cas: Latency
    list: Latency
    refusal: Latency
    """How long a refused or throttled request takes to be answered."""
    cas_per_object: float | None
    busy: Literal[409, 412, 429]
    """What a conditional write gets while another one of its object is in flight."""
    throttle: Literal[503, 429]
    limits: tuple[Limit, ...] = ()
    prices: Prices = S3_PRICES
    retry: ClientRetry = BOTOCORE_STANDARD
    sources: tuple[str, ...] = ()

    def latency(self, kind: Kind) -> Latency:
        return {"get": self.get, "put": self.put, "cas": self.cas, "list": self.list}[kind]


def _ms(median: float, p99: float) -> Latency:
    return Latency(median / 1000, p99 / 1000)


CDOUGLAS = "https://cdouglas.github.io/posts/2026/01/conditional"
S3_RATES = "https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html"
S3_CONDITIONAL = "https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html"
EXPRESS_RATES = "https://docs.aws.amazon.com/AmazonS3/latest/userguide/s3-express-performance.html"
GCS_QUOTAS = "https://cloud.google.com/storage/quotas"
GCS_RATES = "https://cloud.google.com/storage/docs/request-rate"
AZURE_BLOB = "https://learn.microsoft.com/azure/storage/blobs/scalability-targets"
AZURE_ACCOUNT = (
    "https://learn.microsoft.com/azure/storage/common/scalability-targets-standard-account"
)

PROFILES: dict[str, Profile] = {
    "s3-standard": Profile(
        "s3-standard",
        "S3 Standard, in region: 15 conditional writes/s per object (58-68 ms); 3,500 writes "
        "and 5,500 reads/s per prefix; 409 for a conditional write in flight",
        get=_ms(30, 120),
        put=_ms(50, 150),
        cas=_ms(63, 130),
        list=_ms(60, 200),
        refusal=_ms(30, 120),
        cas_per_object=15.0,
        busy=409,
        throttle=503,
        limits=(Limit("prefix", reads=5500, writes=3500),),
        sources=(CDOUGLAS, S3_RATES, S3_CONDITIONAL),
    ),
    "s3-express": Profile(
        "s3-express",
        "S3 Express One Zone, same zone: 70 conditional writes/s per object (14-26 ms); "
        "200,000 reads and 100,000 writes/s per directory bucket (not per prefix)",
        get=_ms(5, 15),
        put=_ms(8, 25),
        cas=_ms(20, 35),
        list=_ms(10, 30),
        refusal=_ms(5, 15),
        cas_per_object=70.0,
        busy=409,
        throttle=503,
        limits=(Limit("bucket", reads=200_000, writes=100_000),),
        prices=EXPRESS_PRICES,
        sources=(CDOUGLAS, EXPRESS_RATES, S3_CONDITIONAL),
    ),
    "gcs": Profile(
        "gcs",
        "Google Cloud Storage: one write per second per object (conditional writes 500-700 "
        "ms); a new bucket serves about 1,000 writes and 5,000 reads/s; 429 beyond either",
        get=_ms(40, 150),
        put=_ms(80, 250),
        cas=_ms(600, 700),
        list=_ms(80, 250),
        refusal=_ms(40, 150),
        cas_per_object=1.0,
        busy=429,
        throttle=429,
        limits=(Limit("bucket", reads=5000, writes=1000),),
        retry=GCS_CLIENT,
        sources=(CDOUGLAS, GCS_QUOTAS, GCS_RATES),
    ),
    "azure": Profile(
        "azure",
        "Azure Blob Storage, standard account: 10 conditional writes/s per blob (100-600 ms); "
        "500 requests/s per blob, 20,000/s per account; 503 ServerBusy beyond",
        get=_ms(20, 100),
        put=_ms(40, 150),
        cas=_ms(150, 600),
        list=_ms(50, 200),
        refusal=_ms(20, 100),
        cas_per_object=10.0,
        busy=412,
        throttle=503,
        limits=(Limit("object", total=500), Limit("bucket", total=20_000)),
        sources=(CDOUGLAS, AZURE_BLOB, AZURE_ACCOUNT),
    ),
}


LOCAL_OVERHEAD_MS = {"get": (6.0, 18.0), "put": (9.0, 27.0), "cas": (9.0, 27.0)}
"""What one request to SeaweedFS on this machine costs beyond the proxy's delay (median,
99th percentile, ms): the client, the proxy and the server (``--calibrate`` measures it)."""


def local_profile(delay_ms: float = 60.0, measured: dict[str, Latency] | None = None) -> Profile:
    """SeaweedFS on this machine behind the latency proxy of ``tests/support/faults.py``
    adding ``delay_ms`` to every request: ``measured`` latencies per kind (``get``, ``put``,
    ``cas``), or the proxy's delay plus ``LOCAL_OVERHEAD_MS``. No per-object or request-rate
    limit: SeaweedFS serialises conditional writes and refuses a stale one, and serves what
    it can."""
    got = dict(measured or {})
    for kind, (median, p99) in LOCAL_OVERHEAD_MS.items():
        got.setdefault(kind, _ms(delay_ms + median, delay_ms + p99))
    return Profile(
        "local",
        f"SeaweedFS on this machine behind a {delay_ms:g} ms latency proxy",
        get=got["get"],
        put=got["put"],
        cas=got["cas"],
        list=got["get"],
        refusal=got["get"],
        cas_per_object=None,
        busy=412,
        throttle=503,
    )


def profile(name: str, delay_ms: float = 60.0) -> Profile:
    if name == "local":
        return local_profile(delay_ms)
    return PROFILES[name]


PROFILE_NAMES = (*PROFILES, "local")
