"""Where the demo runs: its settings, and the store (an embedded S3 server, an S3 endpoint,
or any store's URL).

An embedded server lives exactly as long as the run; in a store of the user's (an endpoint,
a URL) the run's own objects are removed afterwards unless ``--keep`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

import objmanifest as om
from objmanifest.local import servers

from ..local.errors import SetupError

_SECRET_ENV = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE")


@dataclass(frozen=True)
class Settings:
    """The demo's options, parsed."""

    agents: int
    files: int
    big_mib: int
    lease: float
    backend: str
    endpoint_url: str | None
    url: str | None
    bucket: str
    keep: bool
    json: bool
    work_ms: int
    timeout: float

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        return cls(
            agents=args.agents,
            files=args.files,
            big_mib=args.big_mib,
            lease=args.lease,
            backend=args.backend,
            endpoint_url=args.endpoint_url,
            url=args.store_url,
            bucket=args.bucket,
            keep=args.keep,
            json=args.json,
            work_ms=args.work_ms,
            timeout=args.timeout,
        )


@dataclass
class Target:
    """Where the demo runs."""

    label: str
    """The embedded server's name, ``endpoint``, or the URL's scheme."""
    endpoint_url: str | None
    store: om.ObjectStore
    data_dir: str | None = None
    """The embedded SeaweedFS's data, when ``--keep`` keeps it."""

    @property
    def embedded(self) -> bool:
        return self.label in servers.BACKENDS

    @property
    def where(self) -> str:
        """The store, for the summary: its URL, and the endpoint it is reached through."""
        url = self.store.url
        return f"{url} at {self.endpoint_url}" if self.endpoint_url else url


def child_env(s: Settings) -> dict[str, str]:
    """The agents' environment: the caller's for a store of theirs, the local keys for an
    embedded server.

    They import the same objmanifest as this process, wherever it comes from.
    """
    env = dict(os.environ)
    if not (s.endpoint_url or s.url):
        env = {k: v for k, v in env.items() if k not in _SECRET_ENV}
        env.update(
            AWS_ACCESS_KEY_ID=servers.LOCAL_ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=servers.LOCAL_SECRET_KEY,
            AWS_DEFAULT_REGION=servers.LOCAL_REGION,
        )
    source = str(Path(om.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (source, env.get("PYTHONPATH")) if x)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _connect(s: Settings) -> om.ObjectStore:
    """The store ``--url`` names (``--endpoint-url`` its endpoint), asked once for its time
    so a store that cannot be reached is one clear error before any agent starts; a setup
    error if it cannot be opened. The error names the store as ``connect`` shows it (a URL
    that carries a credential is never shown whole)."""
    assert s.url is not None
    if s.url.startswith("memory:"):
        raise SetupError(
            "the demo's agents are processes of their own, and a memory:// store lives inside "
            "one process: use an s3://, gs://, az:// or file:// URL"
        )
    try:
        store = om.connect(s.url, endpoint_url=s.endpoint_url)
        if isinstance(store, om.S3Store):
            _ensure_bucket(store)
        store.now()
    except om.ObjManifestError as e:
        raise SetupError(f"cannot use the store --url names: {e}") from None
    return store


def _ensure_bucket(store: om.S3Store) -> None:
    client = store.client
    try:
        client.head_bucket(Bucket=store.bucket)
        return
    except ClientError as e:
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status not in (404, 400) and e.response.get("Error", {}).get("Code") != "404":
            raise SetupError(f"cannot use bucket {store.bucket!r}: {e}") from None
    except BotoCoreError as e:
        raise SetupError(f"cannot reach the store: {e}") from None
    region = client.meta.region_name
    kwargs: dict[str, Any] = {"Bucket": store.bucket}
    if region and region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        client.create_bucket(**kwargs)
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code")
        if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise SetupError(f"cannot create bucket {store.bucket!r}: {e}") from None


@contextlib.contextmanager
def open_target(s: Settings) -> Iterator[Target]:
    """The store to run against: the given URL or endpoint, or an embedded server stopped
    after."""
    if s.url:
        store = _connect(s)
        yield Target(store.url.partition("://")[0], s.endpoint_url, store)
        return
    if s.endpoint_url:
        store = om.connect(f"s3://{s.bucket}", endpoint_url=s.endpoint_url)
        assert isinstance(store, om.S3Store)
        _ensure_bucket(store)
        yield Target("endpoint", s.endpoint_url, store)
        return
    data_dir = tempfile.mkdtemp(prefix="objmanifest-demo-data-") if s.keep else None
    # moto's server logs every request through werkzeug; the demo's output is its own.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    try:
        local = servers.start(s.backend, data_dir=data_dir if s.backend == "seaweedfs" else None)
    except servers.LocalServerError as e:
        raise SetupError(f"could not start the embedded {s.backend} server: {e}") from None
    try:
        client = local.client(
            Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=32)
        )
        local.create_bucket(s.bucket)
        store = om.S3Store(client, s.bucket, "")
        yield Target(s.backend, local.endpoint_url, store, data_dir)
    finally:
        _stop_server(local, keep=s.keep)


def _stop_server(local: servers.LocalS3, keep: bool) -> None:
    """Stop the embedded server. A throwaway SeaweedFS is killed at once: its clean stop
    can take seconds and nothing in its temporary directory is needed afterwards."""
    if local.pid is not None and not keep:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(local.pid, signal.SIGKILL)
    local.stop()


def cleanup(target: Target, task_id: str) -> None:
    """In a store of the user's, remove the run's objects (unless --keep was given)."""
    store = target.store
    try:
        for key in [row.key for row in store.list(f"{task_id}/")]:
            store.delete(key)
        for key, upload_id in list(store.list_uploads(f"{task_id}/")):
            store.abort_upload(key, upload_id)
    except om.ObjManifestError as e:
        print(f"objmanifest demo: could not remove the run's objects: {e}", file=sys.stderr)
