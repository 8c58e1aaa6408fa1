"""The argument parser: global options, one subcommand per API call, ``serve`` and ``demo``.

Global options work before or after the subcommand (``objmanifest --json status`` and
``objmanifest status --json`` are the same), and a bad command line raises ``UsageError``
instead of exiting, so it is reported like every other error (as JSON with ``--json``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

from objmanifest import __version__

from ..wire.errors import UsageError
from .options import add_agent, add_globals, add_holder, add_wait
from .parser_tools import add_demo, add_mcp, add_serve, add_store_checks, add_web
from .values import (
    age,
    number,
    partition_count,
    positive_int,
    positive_seconds,
    seconds,
    size,
    stage_seconds,
    whole,
)

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


# -- options -----------------------------------------------------------------------------


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
        "several stages; fixed for the life of the task); STAGE=auto: chosen from --agents",
    )
    p.add_argument(
        "--agents",
        type=whole,
        metavar="N",
        help="how many agents you expect: --partitions STAGE=auto gives the stage about two "
        "partitions per agent",
    )
    p.add_argument(
        "--spread",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep each partition's shard and data under key prefixes of their own (S3 "
        "serves a rate per prefix); default: from 64 partitions on. 0.3.0 cannot read a "
        "spread task",
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
        type=age,
        default=86400.0,
        metavar="SECONDS",
        help="archive entries last updated this long ago or more (default 86400, one day; "
        "0 archives every terminal entry)",
    )


def _verbs(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Lifecycle verbs operators need."""
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


def _retention(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Journal retention: ``trim``."""
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
        type=age,
        metavar="SECONDS",
        help="also remove the data of consumed entries unchanged for this many seconds",
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
    add_serve(sub, parents)
    add_demo(sub)
    _retention(sub, parents)
    _gc(sub, parents)
    add_web(sub, parents)
    add_mcp(sub, parents)
    add_store_checks(sub, parents)
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    return build(argv).parse_args(list(argv))
