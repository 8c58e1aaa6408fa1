"""``python -m objmanifest ARGS`` in a process of its own, without paying for the interpreter
and the imports each time: the CLI suites run thousands of commands.

A fork server (one per test process, started on first use) imports the command line once;
each command is a child forked from it, with its own stdin, stdout and stderr pipes, working
directory, environment and ``sys.argv``, that runs ``objmanifest.cli.main`` and exits with
its code. Nothing passes from one command to the next but what the store holds: the server
never runs a command itself, so each child starts from the same freshly imported state, as
a new interpreter would. What differs from ``subprocess.run`` of ``python -m objmanifest``:
the interpreter's startup (``-X`` options, ``PYTHON*`` and locale variables), so a command
whose environment sets any of those is spawned for real, as is every command when
``OBJMANIFEST_TEST_CLI=spawn`` (CI runs one suite that way).

``run`` answers as ``subprocess.run(..., capture_output=True)`` does: the exit code (minus
the signal that killed it), stdout, stderr; ``subprocess.TimeoutExpired`` after killing a
command that ran past its timeout.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from objmanifest.cli import main

SPAWN = os.environ.get("OBJMANIFEST_TEST_CLI") == "spawn"
STARTUP = ("PYTHON", "LC_", "LANG")
"""Environment variables the interpreter reads as it starts: a command whose environment
differs from the server's in one of them is spawned (but ``PYTHONUNBUFFERED``: a command's
output is read once it has exited, so its buffering changes nothing)."""
UNREAD = {"PYTHONUNBUFFERED"}


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack("!Q", len(payload)) + payload)


def _receive(sock: socket.socket) -> bytes:
    head = _exactly(sock, 8)
    return _exactly(sock, struct.unpack("!Q", head)[0])


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise ConnectionError("the CLI fork server closed the connection")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


# -- the server (a process of its own) -----------------------------------------------------


def serve(path: str) -> None:
    """Accept one connection per command, forever; each is handled by a forked child."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers exit unwaited: reaped at once
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _handle(conn)
            finally:
                os._exit(0)
        conn.close()


def _handle(conn: socket.socket) -> None:
    """Fork the command, feed its stdin, collect its output, answer its exit code."""
    request = json.loads(_receive(conn))
    stdin = _receive(conn)
    fds = [os.pipe() for _ in range(3)]
    pid = os.fork()
    if pid == 0:
        conn.close()
        _command(request, fds)
    for i, (r, w) in enumerate(fds):
        os.close(r if i == 0 else w)
    _send(conn, str(pid).encode())
    out: dict[int, bytes] = {}

    def drain(i: int) -> None:
        with os.fdopen(fds[i][0], "rb") as f:
            out[i] = f.read()

    readers = [threading.Thread(target=drain, args=(i,)) for i in (1, 2)]
    for t in readers:
        t.start()
    try:
        with os.fdopen(fds[0][1], "wb") as f:
            f.write(stdin)
    except BrokenPipeError:
        pass
    _, status = os.waitpid(pid, 0)
    for t in readers:
        t.join()
    code = os.waitstatus_to_exitcode(status)
    _send(conn, json.dumps({"code": code}).encode())
    _send(conn, out[1])
    _send(conn, out[2])


def _command(request: dict[str, Any], fds: list[tuple[int, int]]) -> None:
    """In the command's own process: its descriptors, directory, environment and argv."""
    code = 1
    try:
        for i, (r, w) in enumerate(fds):
            os.dup2(r if i == 0 else w, i)
            os.close(r)
            os.close(w)
        # Streams of their own, as an interpreter opens them: the server's were opened on
        # its own descriptors, and remember what those were (seekable, a terminal).
        sys.stdin = sys.__stdin__ = open(  # noqa: SIM115
            0, encoding=sys.stdin.encoding, errors=sys.stdin.errors, closefd=False
        )
        sys.stdout = sys.__stdout__ = open(  # noqa: SIM115
            1, "w", encoding=sys.stdout.encoding, errors=sys.stdout.errors, closefd=False
        )
        sys.stderr = sys.__stderr__ = open(  # noqa: SIM115
            2,
            "w",
            buffering=1,
            encoding=sys.stderr.encoding,
            errors="backslashreplace",
            closefd=False,
        )
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [request["main"], *request["argv"]]
        code = main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # as an interpreter would: the traceback on stderr, exit 1
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


# -- the client (in the test process) ------------------------------------------------------


class Forks:
    """The test process's handle on its fork server (started on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._path = ""
        self._env: dict[str, str] = {}

    def _server(self) -> str:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                folder = tempfile.mkdtemp(prefix="om-cli-forks-")
                self._path = str(Path(folder) / "socket")
                self._env = dict(os.environ)
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.support.cli_forks", self._path],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    cwd=Path(__file__).resolve().parents[2],
                )
                assert self._proc.stdout is not None
                if self._proc.stdout.readline().strip() != b"ready":
                    raise RuntimeError("the CLI fork server did not start")
                atexit.register(self._proc.kill)
            return self._path

    def forkable(self, env: Mapping[str, str]) -> bool:
        """Whether a command with ``env`` may be forked (rather than spawned)."""
        if SPAWN:
            return False
        self._server()
        keys = {k for k in (*env, *self._env) if k.startswith(STARTUP)} - UNREAD
        return all(env.get(k) == self._env.get(k) for k in keys)

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | os.PathLike[str],
        stdin: bytes = b"",
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[bytes]:
        """``python -m objmanifest ARGV`` as ``subprocess.run(..., capture_output=True)``."""
        command = [sys.executable, "-m", "objmanifest", *argv]
        if not self.forkable(env):
            return subprocess.run(
                command, input=stdin, capture_output=True, env=dict(env), cwd=cwd, timeout=timeout
            )
        request = {
            "argv": list(argv),
            "env": dict(env),
            "cwd": str(cwd),
            "main": str(Path(__file__).resolve().parents[2] / "objmanifest" / "__main__.py"),
        }
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(self._server())
            _send(sock, json.dumps(request).encode())
            _send(sock, stdin)
            pid = int(_receive(sock))
            sock.settimeout(timeout)
            try:
                answer = json.loads(_receive(sock))
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(command, timeout) from None
            sock.settimeout(None)
            stdout, stderr = _receive(sock), _receive(sock)
        return subprocess.CompletedProcess(command, answer["code"], stdout, stderr)


FORKS = Forks()


if __name__ == "__main__":
    serve(sys.argv[1])
