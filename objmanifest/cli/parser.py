"""The argument parser: global options, one subcommand per API call, ``serve`` and ``demo``.

Global options work before or after the subcommand (``objmanifest --json status`` and
``objmanifest status --json`` are the same), and a bad command line raises ``UsageError``
instead of exiting, so it is reported like every other error (as JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Sequence
from typing import Any, NoReturn

from objmanifest import __version__, demo
from objmanifest.local import servers

from ..wire.errors import UsageError

ENV_URL = "OBJMANIFEST_URL"
ENV_TASK = "OBJMANIFEST_TASK"
ENV_AGENT = "OBJMANIFEST_AGENT"
ENV_WEB_TOKEN = "OBJMANIFEST_WEB_TOKEN"

GLOBAL_DESTS = ("url", "endpoint_url", "task", "json", "debug", "no_progress", "cas_attempts")
_VALUE_OPTIONS = {"--url", "--endpoint-url", "--task", "--cas-attempts"}

EPILOG = """\
exit codes:
  0 ok                          7 conflict retries exhausted   13 store error (network,
  1 error                       8 not found                       credentials, permissions)
  2 usage or invalid input      9 already exists / conflicts  130 interrupted
  3 nothing claimable          10 already consumed
  4 not ready                  11 not a consumer
  5 lease lost                 12 unsupported store, corrupt
  6 checksum mismatch             manifest, newer schema or an
                                  optional extra not installed

With --json every command writes one JSON object to stdout, errors included
({"error", "message", "exit_code", ...}); `consume -o -` writes it to stderr instead.
See docs/cli.md for every command's output.
"""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that raises ``UsageError`` instead of printing and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.format_usage())


# -- value types -------------------------------------------------------------------------


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def port(text: str) -> int:
    value = _int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is from 1 to 65535, not {value}")
    return value


def number(text: str) -> float:
    """Any number; the command checks its range (``init --lease``, with the API's rule)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


def partition_count(text: str) -> tuple[str, int]:
    """``STAGE=N`` of ``init --partitions``; the API checks the stage and the range."""
    stage, eq, count = text.partition("=")
    if not eq or not stage:
        raise argparse.ArgumentTypeError(f"write STAGE=N (like collect=16), not {text!r}")
    return stage, _int(count)


def stage_seconds(text: str) -> tuple[str, float]:
    """``STAGE=SECONDS`` of ``init --deadline``; the API checks the stage and the range."""
    stage, eq, seconds = text.partition("=")
    if not eq or not stage:
        raise argparse.ArgumentTypeError(f"write STAGE=SECONDS (like collect=600), not {text!r}")
    return stage, number(seconds)


def whole(text: str) -> int:
    """Any whole number; the command checks its range (``init --retries``)."""
    return _int(text)


def positive_seconds(text: str) -> float:
    """A polling interval: from 0.05 to 3600 seconds (the one message for any other)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be from 0.05 to 3600 seconds, not {text!r}")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds, 0 or more (``--wait``, ``--older-than`` ...)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds, 0 or more, not {text!r}"
        )
    return value


_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def size(text: str) -> int:
    """Bytes, with an optional binary unit: ``8388608``, ``8MiB``, ``8M``, ``512k``."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 8MiB or 8388608)")
    unit = (match.group(2) or "").lower()[:1]
    value = int(match.group(1)) * _UNITS[unit]
    if value < 1:
        raise argparse.ArgumentTypeError("a size must be at least 1 byte")
    return value


# -- options -----------------------------------------------------------------------------


def add_globals(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The options every command takes. On subcommands their defaults are suppressed, so a
    value given before the subcommand is not overwritten by a default after it."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    group = parser.add_argument_group("global options")
    group.add_argument(
        "--url",
        default=default(os.environ.get(ENV_URL)),
        metavar="s3://BUCKET/PREFIX",
        help=f"where the tasks live (default: ${ENV_URL})",
    )
    group.add_argument(
        "--endpoint-url",
        default=default(None),
        metavar="URL",
        help="S3 endpoint of a non-AWS store (default: $AWS_ENDPOINT_URL_S3, then "
        "$AWS_ENDPOINT_URL)",
    )
    group.add_argument(
        "--task",
        default=default(os.environ.get(ENV_TASK)),
        metavar="ID",
        help=f"the task to work on (default: ${ENV_TASK})",
    )
    group.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="write one JSON object (result or error) instead of text",
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=default(False),
        help="print the traceback of an error",
    )
    group.add_argument(
        "--no-progress",
        action="store_true",
        default=default(False),
        help="no progress bars, even on a terminal",
    )
    group.add_argument(
        "--cas-attempts",
        type=positive_int,
        default=default(None),
        metavar="N",
        help="lost races a manifest change tolerates before giving up (default: 100)",
    )


def add_agent(parser: argparse.ArgumentParser, role: bool = False) -> None:
    agent = os.environ.get(ENV_AGENT)
    parser.add_argument(
        "--agent",
        default=agent,
        required=agent is None,
        metavar="NAME",
        help=f"this agent's name (default: ${ENV_AGENT})",
    )
    if role:
        parser.add_argument(
            "--role",
            metavar="ROLE",
            help="consumer role, for entries declared with --consumer (default: agent name)",
        )


def add_holder(parser: argparse.ArgumentParser) -> None:
    """``FILE_ID --agent NAME --epoch N``: the claim an earlier process printed."""
    parser.add_argument("file_id", metavar="FILE_ID")
    add_agent(parser)
    parser.add_argument(
        "--epoch",
        type=non_negative_int,
        required=True,
        metavar="N",
        help="the epoch `claim` printed (the fencing token)",
    )


def add_wait(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--wait",
        type=seconds,
        default=0.0,
        metavar="SECONDS",
        help=f"poll up to SECONDS for {what} instead of failing at once",
    )


# -- subcommands -------------------------------------------------------------------------


def _init(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("init", parents=parents, help="create a task with its stages")
    p.add_argument("stages", nargs="+", metavar="STAGE", help="stage names, in order")
    p.add_argument(
        "--lease",
        type=number,
        default=300.0,
        metavar="SECONDS",
        help="lease length, above 0 and at most 30 days (default: 300)",
    )
    p.add_argument(
        "--retries",
        type=whole,
        default=3,
        metavar="N",
        help="failures allowed before an entry is dead, 0 to 1000 (default: 3)",
    )
    p.add_argument(
        "--exist-ok", action="store_true", help="succeed if the task exists with the same settings"
    )
    p.add_argument(
        "--journal-keep-seconds",
        type=number,
        metavar="SECONDS",
        help="journal retention: `trim` may drop records older than this (default: keep all)",
    )
    p.add_argument(
        "--journal-keep-versions",
        type=whole,
        metavar="N",
        help="journal retention: `trim` may drop all but the newest N records of each "
        "manifest object (default: keep all)",
    )
    p.add_argument(
        "--partitions",
        type=partition_count,
        action="append",
        metavar="STAGE=N",
        help="split a hot stage into N hash partitions, each a shard of its own (repeat for "
        "several stages; fixed for the life of the task)",
    )
    p.add_argument(
        "--layout",
        choices=["stage", "task"],
        default="stage",
        help="'stage': one shard per stage, split by --partitions (default); 'task': one "
        "shard for the whole task (a baseline to compare against)",
    )
    p.add_argument(
        "--retry-backoff",
        type=number,
        default=0.0,
        metavar="SECONDS",
        help="a failed entry may be claimed again only this long after its failure, doubling "
        "per retry (default 0: at once)",
    )
    p.add_argument(
        "--retry-backoff-max",
        type=number,
        metavar="SECONDS",
        help="the longest retry backoff (default 64 times --retry-backoff)",
    )
    p.add_argument(
        "--deadline",
        type=stage_seconds,
        action="append",
        metavar="STAGE=SECONDS",
        help="seconds an entry of STAGE may stay writing (from its claim) or ready (until "
        "consumed) before status lists it as late (repeat for several stages)",
    )


def _declare(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "declare",
        parents=parents,
        help="declare files (one, or a batch with --from)",
        description="Declare one file, or many with --from: a JSON array of objects, or "
        "lines that are each a JSON object or a bare file id. Objects have file_id and "
        "optionally stage, depends_on, consumers; the options fill in what they omit.",
    )
    p.add_argument("file_id", nargs="?", metavar="FILE_ID")
    p.add_argument("--stage", metavar="STAGE", help="the stage that produces the file")
    p.add_argument(
        "--depends-on",
        action="append",
        default=[],
        metavar="FILE_ID",
        help="a file that must be ready first (repeatable)",
    )
    p.add_argument(
        "--consumer",
        action="append",
        default=[],
        metavar="ROLE",
        help="a role that must consume it (repeatable; none: a queue entry)",
    )
    p.add_argument(
        "--from", dest="source", metavar="PATH", help="read declarations from PATH ('-' for stdin)"
    )


def _claim(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "claim",
        parents=parents,
        help="claim a file, or any claimable file of a stage",
        description="Prints FILE_ID, STAGE, EPOCH and LEASE_EXPIRES_AT, tab-separated, one "
        "line per claim; pass --agent and --epoch to put, renew or fail to act as holder.",
    )
    p.add_argument("file_id", nargs="?", metavar="FILE_ID")
    p.add_argument("--stage", metavar="STAGE", help="claim any claimable entry of STAGE")
    add_agent(p, role=True)
    p.add_argument(
        "--limit",
        type=positive_int,
        metavar="N",
        help="claim up to N entries of --stage in one commit",
    )
    add_wait(p, "a claimable entry")


def _holder_commands(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("put", parents=parents, help="upload the data of a claimed file")
    add_holder(p)
    p.add_argument("path", metavar="PATH", help="the file to upload ('-' for stdin)")
    p.add_argument(
        "--part-size", type=size, metavar="SIZE", help="part size of a chunked upload (e.g. 8MiB)"
    )
    p.add_argument("--concurrency", type=positive_int, metavar="N", help="parts uploaded at once")
    p.add_argument(
        "--threshold",
        type=size,
        metavar="SIZE",
        help="larger data goes as a chunked entry (default: 64MiB)",
    )
    p = sub.add_parser(
        "put-many",
        parents=parents,
        help="upload the data of many claimed files, then one commit per stage",
        description="Reads claims as `claim --stage S --limit N` printed them (FILE_ID STAGE "
        "EPOCH LEASE_EXPIRES_AT, tab-separated, or its --json object), each optionally with a "
        "fifth field PATH; without one the data is DIR/FILE_ID. Uploads the files in parallel, "
        "then makes them ready with one commit per stage. Each file's outcome is reported; "
        "the exit code is 0 only if every file was made ready.",
    )
    add_agent(p)
    p.add_argument(
        "--claims",
        required=True,
        metavar="PATH",
        help="the claims, as `claim` printed them ('-' for stdin)",
    )
    p.add_argument("--dir", metavar="DIR", help="read each file's data from DIR/FILE_ID")
    p.add_argument(
        "--part-size", type=size, metavar="SIZE", help="part size of a chunked upload (e.g. 8MiB)"
    )
    p.add_argument(
        "--concurrency", type=positive_int, metavar="N", help="files (or parts) uploaded at once"
    )
    p.add_argument(
        "--threshold",
        type=size,
        metavar="SIZE",
        help="larger data goes as a chunked entry (default: 64MiB)",
    )
    p = sub.add_parser("renew", parents=parents, help="move a claim's lease forward")
    add_holder(p)
    p = sub.add_parser("fail", parents=parents, help="give a claimed file up")
    add_holder(p)
    p.add_argument("reason", metavar="REASON", help="why, recorded in the entry")


def _consume(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "consume",
        parents=parents,
        help="download, verify and mark a ready file consumed",
        description="Nothing is written unless the checksum matches: a file output appears "
        "only once verified, and stdout receives the bytes only after verification.",
    )
    p.add_argument("file_id", metavar="FILE_ID")
    add_agent(p, role=True)
    p.add_argument(
        "-o",
        "--output",
        default="-",
        metavar="PATH",
        help="where to write the data ('-', the default, for stdout); a file is replaced "
        "only once verified, a device or FIFO is written into",
    )
    p.add_argument(
        "--parents",
        action="store_true",
        help="create the missing parent directories of -o PATH",
    )
    p.add_argument(
        "--part-size", type=size, metavar="SIZE", help="bytes per ranged GET of a chunked file"
    )
    p.add_argument("--concurrency", type=positive_int, metavar="N", help="parts downloaded at once")
    add_wait(p, "the file to become ready")


def _views(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    sub.add_parser(
        "status",
        parents=parents,
        help="entries per stage and state; blocked, overdue and dead entries",
    )
    p = sub.add_parser(
        "wait",
        parents=parents,
        help="wait until every entry of some stages is ready (or consumed)",
        description="Return once every entry of the stages (default: all), including entries "
        "declared meanwhile, is at least --until: ready (ready or consumed) or consumed. "
        "Exits 15 on --timeout, naming the entries not there yet, and 16 at once when an "
        "entry waited for is dead.",
    )
    p.add_argument(
        "--stage", action="append", default=[], metavar="STAGE", help="a stage (repeatable)"
    )
    p.add_argument("--until", choices=["ready", "consumed"], default="ready")
    p.add_argument(
        "--timeout",
        type=seconds,
        metavar="SECONDS",
        help="give up after this long (default: never)",
    )
    p = sub.add_parser("show", parents=parents, help="one entry, every field")
    p.add_argument("file_id", metavar="FILE_ID")
    sub.add_parser("reap", parents=parents, help="release every expired lease of the task")
    p = sub.add_parser(
        "repair",
        parents=parents,
        help="rebuild a deleted or corrupt stage shard or index (corrupt bytes kept aside)",
        description="A stage shard that was deleted or is corrupt is rebuilt from its journal "
        "(and the index), the index from the shards; a corrupt object is first copied to "
        "TASK/damaged/. An entry the journal may have lost track of is fenced: any claim "
        "given out on it is refused from now on. An index that lacks file ids the shards hold "
        "gets them back. The report says what was restored and what could not be.",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="say what would be repaired; write nothing"
    )


def _history(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "log",
        parents=parents,
        help="the task's journal, or one entry's history",
        description="Every committed version of the task's manifest objects, oldest first: "
        "the command, the agent, the store's time, and what it did to each entry. With "
        "FILE_ID, that entry's transitions across takeovers. --follow keeps printing new "
        "records (one JSON object per line with --json) until Ctrl-C.",
    )
    p.add_argument("file_id", nargs="?", metavar="FILE_ID", help="one entry's history")
    p.add_argument("--stage", metavar="STAGE", help="only the objects of this stage")
    p.add_argument("--by", metavar="AGENT", help="only what this agent committed")
    p.add_argument(
        "--since",
        metavar="TIME|DURATION",
        help="only records from this store time on (2030-01-01T12:00:00Z), or from this long "
        "ago (90s, 10m, 2h, 1d)",
    )
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new records")
    p.add_argument(
        "--interval",
        type=positive_seconds,
        default=2.0,
        metavar="SECONDS",
        help="with --follow: how often to look (default 2; an unchanged object costs a 304)",
    )
    p = sub.add_parser(
        "lineage",
        parents=parents,
        help="the entries a file was made from, with their producers and checksums",
    )
    p.add_argument("file_id", metavar="FILE_ID")
    sub.add_parser(
        "migrate",
        parents=parents,
        help="move the task to this release's format (run once every agent runs it)",
        description="Moves the task header, every shard, the index and every upload state to "
        "this release's schema, so every change from then on is journaled. Older releases "
        "then refuse the task and change nothing: run it once every agent runs this release.",
    )
    p = sub.add_parser(
        "archive",
        parents=parents,
        help="move old consumed and dead entries out of the live shards",
        description="Moves every consumed or dead entry last updated at least SECONDS ago "
        "(the store's clock) into write-once archive objects, one commit per shard. Safe "
        "while agents work; entry, log, lineage, status and dependency checks still find them.",
    )
    p.add_argument(
        "--older-than",
        type=seconds,
        default=86400.0,
        metavar="SECONDS",
        help="archive entries last updated this long ago or more (default 86400, one day)",
    )


def _verbs(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Lifecycle verbs operators need (issue 10)."""
    p = sub.add_parser(
        "release",
        parents=parents,
        help="give a claim back without spending a retry",
        description="The entry becomes pending again (failed, if it failed before) with its "
        "retry count unchanged; a stale --epoch is refused (exit 5) and changes nothing. A "
        "chunked entry's upload is kept for the next holder to adopt.",
    )
    add_holder(p)
    p = sub.add_parser(
        "revive", parents=parents, help="a dead entry back to failed, its retries reset"
    )
    p.add_argument("file_id", metavar="FILE_ID")
    p = sub.add_parser(
        "undeclare", parents=parents, help="remove a pending entry nobody depends on"
    )
    p.add_argument("file_id", metavar="FILE_ID")
    sub.add_parser("tasks", parents=parents, help="list the task ids under the store's prefix")
    p = sub.add_parser(
        "delete",
        parents=parents,
        help="delete the task: manifest, data, journal and uploads",
        description="Removes everything under the task (multipart uploads aborted), the "
        "header last. Refused while leases are live unless --force; refused without --yes, "
        "so a typo in a shell deletes nothing. Run it again to finish a delete that crashed.",
    )
    p.add_argument("--force", action="store_true", help="delete even while leases are live")
    p.add_argument("--yes", action="store_true", help="yes, delete the task and its data")


def _serve(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        parents=parents,
        help="run a local S3 server on loopback",
        description="Starts a local S3 server on 127.0.0.1, prints the environment to use it "
        "(its own local test credentials), and runs until Ctrl-C or SIGTERM. With --detach it "
        'runs in the background and the command returns: eval "$(objmanifest serve --detach)" '
        "sets up the shell, `objmanifest serve --stop` stops it.",
    )
    p.add_argument(
        "--backend",
        choices=servers.BACKENDS,
        default="moto",
        help="moto (in memory, starts fast) or seaweedfs (a real store on disk)",
    )
    p.add_argument("--port", type=port, metavar="N", help="S3 port (default: a free one)")
    p.add_argument(
        "--data",
        metavar="DIR",
        help="seaweedfs: keep data in DIR across restarts (default: temporary)",
    )
    p.add_argument("--bucket", metavar="NAME", help="create this bucket once it runs")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--detach",
        action="store_true",
        help="run the server in the background: print the export lines (with "
        "OBJMANIFEST_SERVE_PID) once it is ready, and return",
    )
    mode.add_argument(
        "--stop",
        action="store_true",
        help="stop the server a --detach started (the one $OBJMANIFEST_SERVE_PID names)",
    )


def web_port(text: str) -> int:
    """``web --port``: a TCP port, or 0 for any free one."""
    value = _int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is from 0 (any free) to 65535, not {value}")
    return value


def _web(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """The status page (issue 13)."""
    p = sub.add_parser(
        "web",
        parents=parents,
        help="a live, read-only status page of the tasks (needs objmanifest[web])",
        description="Serves a status page: with --task, that task's board at /; without, "
        "the tasks under --url. Boards, a stage's entries, an entry's history and lineage, "
        "updated live; a JSON API under /api for each view. Read-only. It binds to "
        f"127.0.0.1 unless told otherwise; any other address needs a token (${ENV_WEB_TOKEN} "
        "or --token), checked on every request.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port", type=web_port, default=8321, metavar="N", help="port (default 8321; 0: any free)"
    )
    p.add_argument(
        "--token",
        default=os.environ.get(ENV_WEB_TOKEN),
        metavar="TOKEN",
        help=f"require this token on every request (default: ${ENV_WEB_TOKEN}; needed for a "
        "non-loopback --host; prefer the variable: `ps` shows arguments)",
    )
    p.add_argument(
        "--interval",
        type=positive_seconds,
        default=2.0,
        metavar="SECONDS",
        help="how often pages refresh; the store is read at most this often per view (default 2)",
    )


def _mcp(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """The MCP server for LLM agents (issue 14)."""
    p = sub.add_parser(
        "mcp",
        parents=parents,
        help="serve the task as MCP tools for an LLM agent (needs objmanifest[mcp])",
        description="A Model Context Protocol server on stdio (or streamable HTTP on "
        "127.0.0.1 with --http): status, show, declare, claim, put, renew, fail, release, "
        "consume, log and lineage as tools, for one agent. The server keeps its claims' "
        "epochs and renews their leases, for at most --max-hold seconds each, then releases "
        "them (no retry spent) and tells the model; local paths stay inside --root, inline "
        "content within 1 MiB of UTF-8. Claims still held when it stops are released.",
    )
    add_agent(p, role=True)
    p.add_argument(
        "--root",
        default=".",
        metavar="DIR",
        help="the directory the tools may read and write files in (default: the working "
        "directory); paths outside it, '..' and symlinks leading out are refused",
    )
    p.add_argument(
        "--max-hold",
        type=hold_seconds,
        default=900.0,
        metavar="SECONDS",
        help="release a claim held this long, without spending a retry (default 900)",
    )
    p.add_argument(
        "--http",
        type=web_port,
        metavar="PORT",
        help="serve streamable HTTP at http://127.0.0.1:PORT/mcp instead of stdio (0: any "
        "free port, printed once it listens)",
    )


def hold_seconds(text: str) -> float:
    """``mcp --max-hold``: above 0, at most a day (one message for every value outside)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 86400 seconds, not {text}")
    return value


def _demo(sub: Any) -> None:
    """``demo`` takes its options from ``objmanifest.demo``.

    Of the global options only ``--debug`` applies to it here; ``--json`` and
    ``--endpoint-url`` are the demo's own, and given before ``demo`` they still count.
    """
    p = sub.add_parser(
        "demo",
        help="run a multi-agent pipeline against an embedded S3 server",
        description="The whole idea at work: agent processes, three stages, a large chunked "
        "file and an agent killed mid-work, then every checksum verified.",
        conflict_handler="resolve",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the traceback of an error",
    )
    demo.add_arguments(p)
    for action in p._actions:  # the demo's copies of global options must not reset them
        if action.dest in GLOBAL_DESTS and action.default in (None, False):
            action.default = argparse.SUPPRESS


def _retention(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Journal retention (issue 10): ``trim``."""
    p = sub.add_parser(
        "trim",
        parents=parents,
        help="drop the journal blocks beyond the task's retention, and say what was dropped",
        description="Deletes whole journal blocks beyond the task's retention (init "
        "--journal-keep-seconds / --journal-keep-versions, or the options here): never a "
        "record still inside a live manifest object or not yet in a block. What is dropped "
        "is recorded first, so `log` says records were dropped.",
    )
    p.add_argument(
        "--keep-seconds", type=number, metavar="SECONDS", help="instead of the task's setting"
    )
    p.add_argument("--keep-versions", type=whole, metavar="N", help="instead of the task's setting")
    p.add_argument("--dry-run", action="store_true", help="say what would be dropped, drop nothing")


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (skipping global options and their values)."""
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token in _VALUE_OPTIONS:
            skip = True
        elif not token.startswith("-"):
            return token
    return None


def _gc(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Cleanup."""
    p = sub.add_parser(
        "gc",
        parents=parents,
        help="remove data, uploads and probe objects no entry references any more",
        description="Removes the data of fenced holders, objects completed by fenced uploads, "
        "multipart uploads nobody can adopt and finished probe objects; never anything a live "
        "entry references, and safe while agents work. Keys of an unknown shape are reported, "
        "never removed. With --consumed-older-than, also the data of consumed entries last "
        "changed that long ago (they are marked first; reading them again then fails with "
        "'data removed').",
    )
    p.add_argument("--dry-run", action="store_true", help="report what would go, remove nothing")
    p.add_argument(
        "--consumed-older-than",
        type=seconds,
        metavar="SECONDS",
        help="also remove the data of consumed entries unchanged for this many seconds",
    )


def racers(text: str) -> int:
    value = _int(text)
    if not 2 <= value <= 64:
        raise argparse.ArgumentTypeError(f"a race has 2 to 64 writers, not {value}")
    return value


def _store_checks(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """What the store enforces (``doctor``) and the permissions objmanifest needs."""
    p = sub.add_parser(
        "doctor",
        parents=parents,
        help="check what the store enforces: conditional writes, races, multipart, Date ...",
        description="Writes, races and reads a few probe objects under --url's prefix (all "
        "removed after) and prints what the store enforces and how it answers. Exit 0: safe "
        "(create-only and If-Match writes enforced, also by concurrent writers, conditional "
        "multipart completion, a usable Date, ranged reads, listing); 12: a required check "
        "failed; 13: a required check could not be asked (a refused call names the "
        "permission it lacked). Digest verification, 409 vs 412 and clock skew are reported.",
    )
    p.add_argument(
        "--racers",
        type=racers,
        default=8,
        metavar="N",
        help="concurrent writers in each race (default: 8)",
    )
    p = sub.add_parser(
        "iam-policy",
        parents=parents,
        help="print the least-privilege AWS IAM policy for --url's bucket and prefix",
        description="Prints the IAM policy document a role needs for --url's bucket and "
        "prefix; sends no request. 'agent' (the default): every command but gc, repair, "
        "delete, archive and trim; lists only under the prefix, deletes only data and probe "
        "objects. 'admin': those five too.",
    )
    p.add_argument(
        "--for",
        dest="role",
        choices=["agent", "admin"],
        default="agent",
        help="whose policy (default: agent)",
    )


def build(argv: Sequence[str] = ()) -> Parser:
    """The full parser."""
    parser = Parser(
        prog="objmanifest",
        description="Hand files between agents through one S3 bucket, safely: a manifest "
        "of stages, leases, checksums and dependencies, changed only by compare-and-swap.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"objmanifest {__version__}")
    add_globals(parser, suppress=False)
    common = Parser(add_help=False)
    add_globals(common, suppress=True)
    parents: list[argparse.ArgumentParser] = [common]
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _init(sub, parents)
    _declare(sub, parents)
    _claim(sub, parents)
    _holder_commands(sub, parents)
    _consume(sub, parents)
    _views(sub, parents)
    _history(sub, parents)
    _verbs(sub, parents)
    _serve(sub, parents)
    _demo(sub)
    _retention(sub, parents)
    _gc(sub, parents)
    _web(sub, parents)
    _mcp(sub, parents)
    _store_checks(sub, parents)
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    return build(argv).parse_args(list(argv))
