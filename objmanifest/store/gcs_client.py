"""The google-cloud-storage client of a GCS store: its credentials (application default
credentials, or anonymous for an emulator), the one HTTP session every request goes through
(its connection pool, and a hook that hands the ``Date`` of every answer to the stores'
clocks), the retry policy, and the checks of an endpoint URL.

The endpoint is ``endpoint_url`` (``--endpoint-url``), else ``STORAGE_EMULATOR_HOST``, else
Google's own. An endpoint other than Google's is an emulator (fake-gcs-server,
storage-testbench) and is asked anonymously, as the SDK does for ``STORAGE_EMULATOR_HOST``.
"""

from __future__ import annotations

import http.client
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import google.auth
import google.auth.exceptions
import requests
import requests.adapters
import urllib3.exceptions
from google.api_core import exceptions as api_exceptions
from google.api_core.retry import Retry
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import storage
from google.cloud.storage.exceptions import InvalidResponse

from ..core.pacing import SendRate
from ..core.runtime import DEFAULT, Runtime
from ..errors import InvalidInput, StoreError
from .base import StoreClock
from .sessions import pinned_session
from .urls import endpoint_parts, plain_http, without_credentials

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
GOOGLE_ENDPOINT = "https://storage.googleapis.com"
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
"""Objects only: read, write, list and delete; nothing of the bucket's settings or IAM."""

POOL = 32
"""Connections the session keeps to the endpoint (requests that may run at once)."""

TIMEOUT = (10.0, 60.0)
"""Seconds to connect, and to wait for each part of an answer."""

SERVER_SAID_RETRY = (429, 408, 500, 502, 503, 504)
"""Answers that say the request was not done and may be sent again: throttling (429: GCS
allows about one update a second per object, so a hot shard meets it in normal work), a
request timeout and server errors. A retried conditional write that had landed after all
meets its own generation and is refused: the commit loop recognises its own version."""

CONNECTION_ERRORS = (
    requests.ConnectionError,
    requests.exceptions.ChunkedEncodingError,
    requests.Timeout,
    http.client.HTTPException,
    urllib3.exceptions.HTTPError,
    ConnectionError,
)
"""A connection that broke or timed out: for a write, its answer was lost."""


def _server_said_retry(exc: Exception) -> bool:
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        return exc.code in SERVER_SAID_RETRY
    if isinstance(exc, InvalidResponse):
        return int(getattr(exc.response, "status_code", 0) or 0) in SERVER_SAID_RETRY
    return False


def _refused(exc: BaseException) -> bool:
    """A connection that could not be made at all: nothing listens there (retrying it for
    minutes only hides a wrong endpoint or a stopped emulator)."""
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            return False
        if isinstance(seen, (urllib3.exceptions.NewConnectionError, ConnectionRefusedError)):
            return True
        if isinstance(seen, urllib3.exceptions.MaxRetryError) and seen.reason is not None:
            seen = seen.reason
            continue
        args = getattr(seen, "args", ())
        inner = args[0] if args and isinstance(args[0], BaseException) else None
        seen = inner or seen.__cause__ or seen.__context__
    return False


def _read_may_retry(exc: Exception) -> bool:
    if isinstance(exc, google.auth.exceptions.TransportError) and exc.args:
        inner = exc.args[0]
        return isinstance(inner, Exception) and _read_may_retry(inner)
    if isinstance(exc, CONNECTION_ERRORS):
        return not _refused(exc)
    return _server_said_retry(exc)


BACKOFF_INITIAL, BACKOFF_MAXIMUM, BACKOFF_MULTIPLIER, RETRY_DEADLINE = 0.5, 16.0, 2.0, 120.0
"""A request the server said to send again is sent after a pause drawn uniformly up to
``BACKOFF_INITIAL`` s, doubling to at most ``BACKOFF_MAXIMUM``, for ``RETRY_DEADLINE`` s
(``google.api_core``'s truncated exponential backoff; the capacity model retries so too)."""


def _backoff(predicate: Callable[[Exception], bool]) -> Retry:
    return Retry(
        predicate=predicate,
        initial=BACKOFF_INITIAL,
        maximum=BACKOFF_MAXIMUM,
        multiplier=BACKOFF_MULTIPLIER,
        timeout=RETRY_DEADLINE,
    )


WRITE_RETRY = _backoff(_server_said_retry)
"""Writes are sent again only when the server answered that it did not do them; a
connection that broke after a write was sent is an unknown outcome, never a silent resend."""

READ_RETRY = _backoff(_read_may_retry)
"""Reads (and deletes, which are idempotent) are sent again on a broken connection too."""


def check_endpoint(endpoint_url: str, where: str = "--endpoint-url") -> str:
    """``http(s)://HOST[:PORT]`` (a bare ``HOST:PORT`` is taken as http, as the SDK takes
    ``STORAGE_EMULATOR_HOST``); anything else is refused without showing credentials."""
    url = endpoint_url if "://" in endpoint_url else f"http://{endpoint_url}"
    shown = without_credentials(url)
    user_info, parsed = endpoint_parts(url)
    if user_info:
        raise InvalidInput(
            f"invalid GCS endpoint URL {shown!r} ({where}): it carries user info (before '@'); "
            "an endpoint is http(s)://HOST[:PORT] only, and GCS credentials come from "
            "application default credentials (GOOGLE_APPLICATION_CREDENTIALS), never a URL"
        )
    if not plain_http(parsed, path=False):
        raise InvalidInput(
            f"invalid GCS endpoint URL {shown!r} ({where}): use http(s)://HOST[:PORT], such as "
            "http://127.0.0.1:4443 for fake-gcs-server"
        )
    return url.rstrip("/")


@dataclass(eq=False)
class GCSClient:
    """One SDK client and its session, shared by every store made from it."""

    client: storage.Client
    session: requests.Session
    endpoint: str
    """The JSON API's base URL, such as https://storage.googleapis.com."""
    emulator: bool
    """True when the endpoint is not Google's (asked anonymously)."""
    runtime: Runtime = field(default=DEFAULT, repr=False)
    """The clock and sleep of the pace of its writes."""
    writes: SendRate = field(default_factory=SendRate, repr=False)
    """The pace of this client's writes, slowed by GCS's 429s (a bucket's write rate, an
    object's one update a second): the agents of one bucket so settle near what it serves,
    each write waiting its turn rather than a retry's growing backoff."""
    _clocks: weakref.WeakSet[StoreClock] = field(default_factory=weakref.WeakSet, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def pace_write(self) -> None:
        """Wait until this client may send a write (at once until GCS throttles one)."""
        wait = self.writes.turn(self.runtime.monotonic())
        if wait > 0:
            self.runtime.sleep(wait)

    def attach(self, clock: StoreClock) -> None:
        """Feed ``clock`` the ``Date`` of every answer that comes through this client (all
        its stores are one service, with one clock)."""
        with self._lock:
            self._clocks.add(clock)

    def observe(self, response: requests.Response, *_: Any, **__: Any) -> None:
        if response.status_code == 429 and response.request.method != "GET":
            self.writes.throttled(self.runtime.monotonic())  # the SDK's retry sends it again
        date = response.headers.get("Date")
        if not date:
            return
        with self._lock:
            clocks = list(self._clocks)
        for clock in clocks:
            clock.observe({"date": date})

    @property
    def shown_endpoint(self) -> str:
        return without_credentials(self.endpoint)


def _session(credentials: Any | None, endpoint: str) -> requests.Session:
    """A pooled session for ``endpoint``, the environment read once (``sessions``)."""
    session: requests.Session = (
        requests.Session() if credentials is None else AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
    )
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=POOL)
    return pinned_session(session, endpoint, adapter)


def make_gcs_client(endpoint_url: str | None = None) -> GCSClient:
    """A client for ``endpoint_url`` (else ``STORAGE_EMULATOR_HOST``, else Google's).

    Google's endpoint is asked with application default credentials
    (``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``, or the
    service account of the machine on Google Cloud); an emulator anonymously.
    """
    where = "--endpoint-url"
    if not endpoint_url and os.environ.get(EMULATOR_ENV):
        endpoint_url, where = os.environ[EMULATOR_ENV], EMULATOR_ENV
    if endpoint_url:
        endpoint = check_endpoint(endpoint_url, where)
        session = _session(None, endpoint)
        client = storage.Client(
            project="objmanifest-emulator",
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": endpoint},
            _http=session,
        )
        made = GCSClient(client, session, endpoint, emulator=True)
    else:
        try:
            credentials, project = google.auth.default(scopes=[SCOPE])
        except google.auth.exceptions.DefaultCredentialsError:
            raise StoreError(
                "no Google Cloud credentials found: run `gcloud auth application-default "
                "login`, set GOOGLE_APPLICATION_CREDENTIALS to a service account key file, or "
                "run on Google Cloud with a service account; for an emulator set "
                f"{EMULATOR_ENV} (or --endpoint-url)"
            ) from None
        session = _session(credentials, GOOGLE_ENDPOINT)
        client = storage.Client(project=project, credentials=credentials, _http=session)
        made = GCSClient(client, session, GOOGLE_ENDPOINT, emulator=False)
    session.hooks["response"].append(made.observe)
    # The SDK fetches each bucket's metadata in a background thread, for tracing only: a
    # request (and a permission, storage.buckets.get) no call of the store needs.
    if hasattr(client, "_bucket_metadata_cache"):
        client._bucket_metadata_cache = None
    return made
