"""``objmanifest serve``: a local S3 server on loopback for trying things and for tests.

It prints the environment that points a shell at it, using the server's own local test
credentials (never any from the environment), then runs until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from objmanifest import servers

from .exits import UsageError
from .output import Output


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


def _where(local: servers.LocalS3, persistent: bool) -> str:
    if local.data_dir is None:
        return "data in memory, lost when it stops"
    if persistent:
        return f"data in {local.data_dir}, kept across restarts"
    return "data in a temporary directory, removed when it stops; --data DIR keeps it"


def run(args: argparse.Namespace, out: Output) -> int:
    """Start the server, announce it, wait for a signal, stop it; exit 0 on a clean stop."""
    if args.backend == "moto" and args.data:
        raise UsageError("--data needs --backend seaweedfs: moto keeps its data in memory")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's per-request log lines
    with stop_on_signals() as stop:
        local = servers.start(args.backend, port=args.port, data_dir=args.data)
        try:
            if args.bucket:
                local.create_bucket(args.bucket)
            info = announcement(local, args.bucket)
            lines = [f"export {name}={shlex.quote(value)}" for name, value in info["env"].items()]
            out.result(info, *lines)
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
