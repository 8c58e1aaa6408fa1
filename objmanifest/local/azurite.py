"""Azurite, Microsoft's Azure Storage emulator, on loopback: ``az://`` stores for the tests
(as moto and SeaweedFS are S3's, in ``servers``).

Azurite is an npm package (``azurite``, Node.js). ``scripts/test.sh`` installs the version
``AZURITE_VERSION`` names into ``azurite_dir()`` when a run asks for the ``azurite``
backend; ``start_azurite`` finds it there (or on ``PATH``) and starts its blob service
alone, keeping everything in memory, on a free port. It signs requests with the emulator's
well-known account (``devstoreaccount1`` and its published key: not a secret). It ignores
SIGTERM, so it is stopped with SIGKILL (nothing of it outlives the process group).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from .errors import LocalServerError
from .running import Running, start_server
from .servers import free_port

AZURITE_VERSION = "3.37.0"

ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
"""The emulator's account and key, the same in every copy of Azurite (Microsoft's docs
publish them): they open nothing but a local emulator."""

DIR_VARIABLE = "OBJMANIFEST_AZURITE_DIR"

_ATTEMPTS = 3


def azurite_dir() -> Path:
    """Where Azurite is installed: ``$OBJMANIFEST_AZURITE_DIR``, else
    ``~/.cache/objmanifest/azurite``."""
    given = os.environ.get(DIR_VARIABLE, "").strip()
    return Path(given) if given else Path.home() / ".cache" / "objmanifest" / "azurite"


def azurite_binary() -> str:
    """The ``azurite-blob`` command: in ``azurite_dir()``, else on ``PATH``."""
    installed = azurite_dir() / "node_modules" / ".bin" / "azurite-blob"
    if installed.is_file() and os.access(installed, os.X_OK):
        return str(installed)
    on_path = shutil.which("azurite-blob")
    if on_path:
        return on_path
    raise LocalServerError(
        f"Azurite is not installed (no azurite-blob in {installed.parent} or on PATH): "
        f"npm install --prefix {azurite_dir()} azurite@{AZURITE_VERSION} (scripts/test.sh "
        "does it when OBJMANIFEST_TEST_BACKENDS names azurite; it needs Node.js and npm)"
    )


@dataclass(eq=False)
class LocalAzurite(Running):
    """A running Azurite blob service; stop it with ``stop()`` or as a context manager."""

    account_url: str
    pid: int
    log_path: str
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _stopper: Callable[[], None] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    backend = "azurite"

    @property
    def endpoint_url(self) -> str:
        """The account URL (what ``--endpoint-url`` means for ``az://``)."""
        return self.account_url

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={self.account_url};"
        )

    def env(self) -> dict[str, str]:
        """Environment for a child process (CLI, agents) that should use this emulator."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    @property
    def running(self) -> bool:
        return super().running and self._proc is not None and self._proc.poll() is None


def _kill(proc: subprocess.Popen[bytes], directory: str) -> None:
    """SIGKILL the emulator's process group (it ignores SIGTERM; only while its leader is
    unreaped, so the group id is still its own), and remove its directory."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    shutil.rmtree(directory, ignore_errors=True)


def _answers(url: str) -> bool:
    """Whether ``url`` gives any HTTP answer (an error status counts)."""
    try:
        with urllib.request.urlopen(url, timeout=2.0):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def start_azurite(host: str = "127.0.0.1", timeout: float = 60.0) -> LocalAzurite:
    """Start Azurite's blob service on a free port of ``host``, data in memory, and wait
    until it answers. A port taken before Azurite binds it is tried again with another."""
    binary = azurite_binary()
    last = ""
    for _ in range(_ATTEMPTS):
        local, last = _start_once(binary, host, timeout)
        if local is not None:
            return local
        if "EADDRINUSE" not in last:
            break
    raise LocalServerError(f"Azurite did not start: {last}")


def _start_once(binary: str, host: str, timeout: float) -> tuple[LocalAzurite | None, str]:
    port = free_port(host)
    directory = tempfile.mkdtemp(prefix="objmanifest-azurite-")
    log_path = Path(directory) / "azurite.log"
    command = [
        binary,
        "--inMemoryPersistence",
        "--blobHost",
        host,
        "--blobPort",
        str(port),
        "--disableTelemetry",
        "--skipApiVersionCheck",
    ]
    with log_path.open("ab") as log:
        proc = start_server(command, log, directory)
    local = LocalAzurite(
        f"http://{host}:{port}/{ACCOUNT}",
        proc.pid,
        str(log_path),
        proc,
        partial(_kill, proc, directory),
    )
    atexit.register(local.stop)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            local.stop()
            return None, f"azurite-blob exited with code {proc.returncode}: {tail}"
        if _answers(local.account_url):
            return local, ""
        time.sleep(0.1)
    local.stop()
    return None, f"azurite-blob on {local.account_url} did not answer within {timeout:.0f}s"
