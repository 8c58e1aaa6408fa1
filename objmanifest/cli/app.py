"""Entry point: parse, dispatch, and turn every error into one line and an exit code."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType

from .. import demo
from ..local.errors import Stopped
from ..wire.errors import UsageError
from ..wire.exits import ExitCode
from . import batch, commands, history, init, mcp, serve, storecheck, web
from .context import Context
from .output import Output
from .parser import parse

Handler = Callable[[Context], int]

HANDLERS: dict[str, Handler] = {
    "init": init.cmd_init,
    "declare": commands.cmd_declare,
    "claim": commands.cmd_claim,
    "put": commands.cmd_put,
    "put-many": batch.cmd_put_many,
    "renew": commands.cmd_renew,
    "fail": commands.cmd_fail,
    "consume": commands.cmd_consume,
    "status": commands.cmd_status,
    "show": commands.cmd_show,
    "wait": commands.cmd_wait,
    "reap": commands.cmd_reap,
    "repair": commands.cmd_repair,
    "log": history.cmd_log,
    "lineage": history.cmd_lineage,
    "migrate": history.cmd_migrate,
    "trim": history.cmd_trim,
    "gc": commands.cmd_gc,
    "archive": commands.cmd_archive,
    "release": commands.cmd_release,
    "revive": commands.cmd_revive,
    "undeclare": commands.cmd_undeclare,
    "tasks": commands.cmd_tasks,
    "delete": commands.cmd_delete,
    "web": web.cmd_web,
    "mcp": mcp.cmd_mcp,
    "doctor": storecheck.cmd_doctor,
    "iam-policy": storecheck.cmd_iam_policy,
}


@contextmanager
def stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM raises ``Stopped`` like Ctrl-C raises KeyboardInterrupt, so a command that is
    stopped cleans up on its way out (an upload no upload state records is aborted)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Stopped(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may handle signals (main() called from a thread)
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


SDK_LOGGERS = ("azure", "google", "urllib3")
"""The clouds' SDKs, whose warnings (each credential azure-identity tried, a response it
could not decode) would print on stderr beside the command's one line of error."""


@dataclass
class _KeptBack:
    """The commands of this process running with the SDKs' warnings kept back (``main`` may
    run in several threads at once), and the loggers' levels before the first of them."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    commands: int = 0
    levels: list[int] = field(default_factory=list)


_kept_back = _KeptBack()


@contextmanager
def sdk_warnings_kept_back(debug: bool) -> Iterator[None]:
    """While a command runs, the SDKs' warnings are kept back unless ``--debug`` asks for
    them (what they say is in the command's error). Commands running at once in one process
    share it: the levels are set by the first and put back by the last."""
    if debug:
        yield
        return
    loggers = [logging.getLogger(name) for name in SDK_LOGGERS]
    with _kept_back.lock:
        if not _kept_back.commands:
            _kept_back.levels = [logger.level for logger in loggers]
            for logger in loggers:
                if logger.level == logging.NOTSET:
                    logger.setLevel(logging.ERROR)
        _kept_back.commands += 1
    try:
        yield
    finally:
        with _kept_back.lock:
            _kept_back.commands -= 1
            if not _kept_back.commands:
                for logger, level in zip(loggers, _kept_back.levels, strict=True):
                    logger.setLevel(level)


def dispatch(args: argparse.Namespace, out: Output) -> int:
    if args.command == "serve":
        return serve.run(args, out)
    if args.command == "demo":
        return demo.main(args)
    with stopped_by_sigterm():
        return HANDLERS[args.command](Context(args, out))


def _stdout_closed(out: Output) -> int:
    """The reader of stdout went away (``| head``): say so once, without a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    out.stderr.write("objmanifest: stdout was closed before all output was written\n")
    return int(ExitCode.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (the console script exits with it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out = Output(json_mode="--json" in argv)
    try:
        args = parse(argv)
    except SystemExit as e:  # --help and --version
        return e.code if isinstance(e.code, int) else 0
    except UsageError as e:
        return out.error(e)
    out.json_mode = bool(args.json)
    if out.stdout_closed:
        return out.error(
            UsageError(
                "stdout is closed: objmanifest writes its result (or the data) there. Redirect "
                "it instead (>/dev/null to discard it); nothing was done"
            )
        )
    try:
        with sdk_warnings_kept_back(bool(args.debug)):
            return dispatch(args, out)
    except BrokenPipeError:
        return _stdout_closed(out)
    except (Exception, KeyboardInterrupt, Stopped) as e:
        return out.error(e, debug=bool(args.debug))
