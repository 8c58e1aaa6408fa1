"""``objmanifest serve``: a local S3 server on loopback for trying things and for tests.

It prints the environment that points a shell at it, using the server's own local test
credentials (never any from the environment), then runs until Ctrl-C or SIGTERM. With
``--detach`` it starts itself in the background, prints the same lines (and
``OBJMANIFEST_SERVE_PID``) once the server is ready and returns, so
``eval "$(objmanifest serve --detach)"`` works in a script; ``--stop`` stops it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType
from typing import IO, Any

import objmanifest
from objmanifest.local import servers

from ..local.errors import LocalServerError
from ..wire.errors import UsageError
from .extras import extra_needed
from .output import Output

SERVER_MODULES = ("moto", "flask", "flask_cors", "werkzeug")
"""What ``--backend moto`` imports, of the ``servers`` extra (SeaweedFS is a binary it ships,
said apart when missing)."""
ENV_SERVE_PID = "OBJMANIFEST_SERVE_PID"
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
"""A bucket name as S3 (and so the local servers) accepts it."""
START_TIMEOUT = 120.0
"""How long ``--detach`` waits for the server to be ready (SeaweedFS takes seconds)."""
STOP_TIMEOUT = 60.0


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM, so the server stops cleanly instead of dying."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def announcement(local: servers.LocalS3, bucket: str | None) -> dict[str, Any]:
    """What a client needs to reach the server, as JSON (``--json``) and shell lines."""
    env = local.env()
    if bucket:
        env["OBJMANIFEST_URL"] = f"s3://{bucket}"
    return {
        "backend": local.backend,
        "endpoint_url": local.endpoint_url,
        "bucket": bucket,
        "url": f"s3://{bucket}" if bucket else None,
        "data_dir": local.data_dir,
        "pid": local.pid,
        "env": env,
    }


SHADOWING = ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN")
"""Variables of the calling shell that would send its requests elsewhere (an S3 endpoint
wins over AWS_ENDPOINT_URL) or spoil the local credentials (a session token of real ones)."""


def shell_lines(env: dict[str, str]) -> list[str]:
    """``export`` lines for ``env``, and an ``unset`` of what in this shell would override
    them, so ``eval`` of the output reaches the local server and nothing else."""
    lines = [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    shadowing = [name for name in SHADOWING if os.environ.get(name)]
    if shadowing:
        lines.append(f"unset {' '.join(shadowing)}")
    return lines


def _where(local: servers.LocalS3, persistent: bool) -> str:
    if local.data_dir is None:
        return "data in memory, lost when it stops"
    if persistent:
        return f"data in {local.data_dir}, kept across restarts"
    return "data in a temporary directory, removed when it stops; --data DIR keeps it"


def run(args: argparse.Namespace, out: Output) -> int:
    """Start the server, announce it, wait for a signal, stop it; exit 0 on a clean stop."""
    if getattr(args, "stop", False):
        return stop_detached(out)
    if args.backend == "moto" and args.data:
        raise UsageError("--data needs --backend seaweedfs: moto keeps its data in memory")
    if args.bucket is not None and not BUCKET_NAME.fullmatch(args.bucket):
        raise UsageError(
            f"--bucket {args.bucket!r} is not a bucket name S3 accepts: 3 to 63 lowercase "
            "letters, digits, '.' and '-', starting and ending with a letter or a digit, such "
            "as work-bucket"
        )
    if getattr(args, "detach", False):
        return detach(args, out)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's per-request log lines
    with stop_on_signals() as stop:
        with extra_needed("serve", "servers", SERVER_MODULES):
            local = servers.start(args.backend, port=args.port, data_dir=args.data)
        try:
            if args.bucket:
                local.create_bucket(args.bucket)
            info = announcement(local, args.bucket)
            out.result(info, *shell_lines(info["env"]))
            if os.environ.get(ENV_DETACHED) == "1":
                _quiet()  # started by --detach: what it says once ready goes nowhere
            out.note(
                f"{local.backend} S3 server at {local.endpoint_url} "
                f"({_where(local, bool(args.data))}).\n"
                "Paste the lines above into another shell to use it; Ctrl-C stops it."
            )
            while not stop.wait(0.5):
                pass
        finally:
            local.stop()
    out.note("server stopped")
    return 0


# -- in the background -----------------------------------------------------------------------


ENV_DETACHED = "OBJMANIFEST_SERVE_DETACHED"
"""Set for the server ``--detach`` starts: once ready, its standard error goes to
``/dev/null`` (until then, to a file the parent reads if it fails to start)."""


def _quiet() -> None:
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
    finally:
        os.close(devnull)


def _child_command(args: argparse.Namespace) -> list[str]:
    """``serve`` itself, in the foreground, announcing itself as JSON."""
    command = [sys.executable, "-m", "objmanifest", "serve", "--json", "--backend", args.backend]
    if args.port:
        command += ["--port", str(args.port)]
    if args.data:
        command += ["--data", os.path.abspath(args.data)]
    if args.bucket:
        command += ["--bucket", args.bucket]
    return command


def detach(args: argparse.Namespace, out: Output) -> int:
    """Start ``serve`` in a session of its own, wait until it announces itself, print its
    lines (plus ``OBJMANIFEST_SERVE_PID``) and return, leaving it running."""
    # The child runs where this package is installed: from the caller's directory, a
    # folder named ``objmanifest`` there (a checkout, say) would be imported instead.
    home = Path(objmanifest.__file__).resolve().parent.parent
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            _child_command(args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,  # what it says before it is ready, in case it is not
            cwd=home,
            env={**os.environ, ENV_DETACHED: "1"},
            start_new_session=True,  # Ctrl-C or a closed terminal does not stop it
        )
        assert proc.stdout is not None
        try:
            line = _first_line(proc, errors)
        except BaseException:
            _terminate(proc)
            raise
        finally:
            proc.stdout.close()
    try:
        info = json.loads(line)
    except ValueError:
        _terminate(proc)
        raise LocalServerError(
            f"the server announced itself in a way not understood: {line!r}"
        ) from None
    if "error" in info:
        code = proc.wait(timeout=STOP_TIMEOUT)
        message = str(info.get("message", "the server could not start"))
        if code == 2:
            raise UsageError(message)
        raise LocalServerError(message)
    info["serve_pid"] = proc.pid
    info["env"][ENV_SERVE_PID] = str(proc.pid)
    out.result(info, *shell_lines(info["env"]))
    out.note(
        f"{info['backend']} S3 server at {info['endpoint_url']} runs in the background "
        f"(pid {proc.pid}); stop it with `objmanifest serve --stop`"
    )
    return 0


def _said(errors: IO[bytes]) -> str:
    """The last line the child wrote to its standard error, if any."""
    errors.seek(0)
    lines = errors.read()[-4096:].decode(errors="replace").strip().splitlines()
    return f": {lines[-1].strip()}" if lines else ""


def _first_line(proc: subprocess.Popen[bytes], errors: IO[bytes]) -> bytes:
    """The child's announcement, or an error (with the last thing it said) once it has
    exited or taken too long."""
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LocalServerError(
                f"the server was not ready within {START_TIMEOUT:.0f}s{_said(errors)}"
            )
        ready, _, _ = select.select([proc.stdout], [], [], min(remaining, 1.0))
        if ready:
            line = proc.stdout.readline()
            if line:
                return line
            code = proc.wait(timeout=STOP_TIMEOUT)
            raise LocalServerError(
                f"the server exited (code {code}) before it was ready{_said(errors)}"
            )


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_detached(out: Output) -> int:
    """Stop the server ``$OBJMANIFEST_SERVE_PID`` names, and wait until it has stopped."""
    raw = os.environ.get(ENV_SERVE_PID, "")
    if not raw:
        raise UsageError(
            f"no server to stop: {ENV_SERVE_PID} is not set "
            '(eval "$(objmanifest serve --detach)" sets it)'
        )
    if not raw.isdigit() or int(raw) < 2:
        raise UsageError(f"{ENV_SERVE_PID}={raw!r} is not the process id of a server")
    pid = int(raw)
    if not _alive(pid):
        out.result({"stopped": None, "pid": pid}, f"no server runs with pid {pid}: already stopped")
        return 0
    if not _is_serve(pid):
        raise UsageError(f"process {pid} is not an objmanifest server; it was left alone")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _alive(pid):
        if time.monotonic() > deadline:
            raise LocalServerError(
                f"the server (pid {pid}) did not stop within {STOP_TIMEOUT:.0f}s"
            )
        time.sleep(0.1)
    out.result({"stopped": pid, "pid": pid}, f"stopped the server (pid {pid})")
    return 0


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an init that never reaps leaves those)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with suppress(OSError, IndexError):
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        return state != "Z"
    return True


def _is_serve(pid: int) -> bool:
    """Is ``pid`` an ``objmanifest serve``? (Where /proc does not exist, it is trusted.)"""
    if not Path("/proc/self").exists():
        return True
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"serve" in words and any(b"objmanifest" in word for word in words)
