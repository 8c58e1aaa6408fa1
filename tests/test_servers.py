"""The local S3 servers start, honour conditional requests and leave nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from objmanifest.local import servers
from objmanifest.local.servers import LocalS3

pytestmark = pytest.mark.xdist_group("servers")
"""Under xdist (``--dist loadgroup``) this module's tests run on one worker, so its own
module-scoped servers start once."""


def _bucket() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def _status(err: ClientError) -> int:
    return int(err.response["ResponseMetadata"]["HTTPStatusCode"])


def _pid_gone(pid: int) -> bool:
    """True when neither the process nor anything in its process group exists any more."""
    for probe in (lambda: os.kill(pid, 0), lambda: os.killpg(pid, 0)):
        try:
            probe()
        except ProcessLookupError:
            continue
        return False
    return True


@pytest.fixture(scope="module", params=list(servers.BACKENDS))
def local(request: pytest.FixtureRequest) -> Iterator[LocalS3]:
    running = servers.start(request.param)
    try:
        yield running
    finally:
        running.stop()


def test_env_points_at_the_server(local: LocalS3) -> None:
    env = local.env()
    assert env["AWS_ENDPOINT_URL"] == local.endpoint_url
    assert env["AWS_ACCESS_KEY_ID"] == servers.LOCAL_ACCESS_KEY
    assert env["AWS_SECRET_ACCESS_KEY"] == servers.LOCAL_SECRET_KEY
    assert env["AWS_DEFAULT_REGION"] == servers.LOCAL_REGION
    assert local.endpoint_url.startswith("http://127.0.0.1:")


def test_create_bucket_is_idempotent(local: LocalS3) -> None:
    name = _bucket()
    local.create_bucket(name)
    local.create_bucket(name)
    # head_bucket, not list_buckets: SeaweedFS lists no buckets to anonymous callers.
    head = local.client().head_bucket(Bucket=name)
    assert head["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_if_none_match_star_creates_once(local: LocalS3) -> None:
    client, bucket = local.client(), _bucket()
    local.create_bucket(bucket)
    first = client.put_object(Bucket=bucket, Key="k", Body=b"one", IfNoneMatch="*")
    assert first["ETag"]
    with pytest.raises(
        ClientError,
        match=r"\((PreconditionFailed|ConditionalRequestConflict)\) when calling the PutObject",
    ) as info:
        client.put_object(Bucket=bucket, Key="k", Body=b"two", IfNoneMatch="*")
    assert _status(info.value) in (412, 409)
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"one"


def test_if_match_with_stale_etag_fails(local: LocalS3) -> None:
    client, bucket = local.client(), _bucket()
    local.create_bucket(bucket)
    stale = client.put_object(Bucket=bucket, Key="k", Body=b"v1")["ETag"]
    current = client.put_object(Bucket=bucket, Key="k", IfMatch=stale, Body=b"v2")["ETag"]
    assert current != stale
    with pytest.raises(
        ClientError, match=r"\(PreconditionFailed\) when calling the PutObject"
    ) as info:
        client.put_object(Bucket=bucket, Key="k", IfMatch=stale, Body=b"v3")
    assert _status(info.value) == 412
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v2"


def test_get_if_none_match_current_etag_is_304(local: LocalS3) -> None:
    client, bucket = local.client(), _bucket()
    local.create_bucket(bucket)
    etag = client.put_object(Bucket=bucket, Key="k", Body=b"v1")["ETag"]
    with pytest.raises(ClientError, match=r"\(304\) when calling the GetObject") as info:
        client.get_object(Bucket=bucket, Key="k", IfNoneMatch=etag)
    assert _status(info.value) == 304
    got = client.get_object(Bucket=bucket, Key="k", IfNoneMatch='"not-the-etag"')
    assert got["Body"].read() == b"v1"


def test_responses_carry_a_date_header(local: LocalS3) -> None:
    client, bucket = local.client(), _bucket()
    local.create_bucket(bucket)
    put = client.put_object(Bucket=bucket, Key="k", Body=b"v1")
    head = client.head_object(Bucket=bucket, Key="k")
    for response in (put, head):
        assert response["ResponseMetadata"]["HTTPHeaders"].get("date")


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(servers.LocalServerError, match="unknown backend"):
        servers.start("minio")


def test_moto_stop_closes_the_port() -> None:
    moto = servers.start_moto()
    moto.create_bucket(_bucket())
    moto.stop()
    moto.stop()  # idempotent
    with pytest.raises(
        (urllib.error.URLError, ConnectionError),
        match=r"Connection refused|Remote end closed connection",
    ):
        urllib.request.urlopen(moto.endpoint_url, timeout=2)


def test_moto_refuses_a_busy_port(local: LocalS3) -> None:
    port = int(local.endpoint_url.rsplit(":", 1)[1])
    with pytest.raises(servers.LocalServerError, match="in use"):
        servers.start_moto(port=port)


def test_weed_binary_is_found() -> None:
    path = servers.weed_binary()
    assert os.access(path, os.X_OK)
    assert Path(path).name == "weed"


@pytest.mark.parametrize("local", ["seaweedfs"], indirect=True)
def test_seaweedfs_listens_only_on_its_loopback_ports(local: LocalS3) -> None:
    assert shutil.which("ss"), "this test needs `ss` (Debian package iproute2)"
    assert local.data_dir is not None and local.pid is not None
    chosen = set(json.loads((Path(local.data_dir) / "weed-ports.json").read_text()).values())
    out = subprocess.run(["ss", "-ltnupH"], capture_output=True, text=True, check=True).stdout
    listeners = [line.split() for line in out.splitlines() if f"pid={local.pid}," in line]
    assert listeners, out
    seen = set()
    for fields in listeners:
        addr = fields[4]
        host, _, port = addr.rpartition(":")
        assert host == "127.0.0.1", f"weed listens on {addr}"
        seen.add(int(port))
    assert seen <= chosen, f"unexpected listeners {seen - chosen}"
    assert int(local.endpoint_url.rsplit(":", 1)[1]) in seen


def test_seaweedfs_keeps_data_across_restart_and_stops_cleanly(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "weed")
    bucket = _bucket()
    first = servers.start_seaweedfs(data_dir=data_dir)
    try:
        first.create_bucket(bucket)
        first.client().put_object(Bucket=bucket, Key="kept", Body=b"survives")
    finally:
        first.stop()
    assert first.pid is not None and _pid_gone(first.pid)
    assert (tmp_path / "weed" / "weed.log").is_file()

    with servers.start_seaweedfs(data_dir=data_dir) as second:
        assert second.pid != first.pid
        client = second.client()
        assert client.get_object(Bucket=bucket, Key="kept")["Body"].read() == b"survives"
        with pytest.raises(
            ClientError,
            match=r"\((PreconditionFailed|ConditionalRequestConflict)\) when calling the PutObject",
        ) as info:
            client.put_object(Bucket=bucket, Key="kept", Body=b"x", IfNoneMatch="*")
        assert _status(info.value) in (412, 409)
    assert second.pid is not None and _pid_gone(second.pid)
    assert Path(data_dir).is_dir(), "a given data_dir is kept"


@pytest.mark.parametrize("local", ["seaweedfs"], indirect=True)
def test_seaweedfs_data_dir_and_log_exist_while_running(local: LocalS3) -> None:
    # The shared server uses a temporary directory; it must exist while running.
    assert local.data_dir is not None and Path(local.data_dir).is_dir()
    assert local.log_path is not None and Path(local.log_path).is_file()


def test_seaweedfs_start_timeout_raises_with_log_and_cleans_up() -> None:
    with pytest.raises(servers.LocalServerError, match="not ready") as info:
        servers.start_seaweedfs(timeout=0.5)
    assert "last lines of" in str(info.value)
    log_path = str(info.value).split("last lines of ", 1)[1].split(":\n", 1)[0]
    assert not Path(log_path).parent.exists(), "temporary data_dir left behind"
    out = subprocess.run(["pgrep", "-f", Path(log_path).parent.name], capture_output=True)
    assert out.stdout == b""
