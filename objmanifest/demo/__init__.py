"""``objmanifest demo``: the whole idea working, on one machine, in well under a minute.

With no arguments it starts an embedded S3 server, runs a three-stage pipeline (collect ->
write -> check) with several agent processes per stage, one large chunked upload and one
agent killed mid-work whose entry another agent takes over, then verifies everything and
exits 0 only if it is all consistent. ``--endpoint-url`` runs it against any S3, ``--url``
against any store (``s3://``, ``az://``, ``gs://``, ``file:///DIR``).

The command line calls ``add_arguments`` and ``main``; ``python -m objmanifest.demo`` runs
it standalone. It is a user of the library like any other: it never changes the manifest
but through ``Task`` and ``Agent``, and never deletes anything in a store of yours but the
objects under its own run's task.
"""

from __future__ import annotations

import argparse
import sys

from objmanifest.local import servers

DEFAULTS = {"agents": 3, "files": 24, "big_mib": 48, "lease": 3.0, "work_ms": 200}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options, shared by ``objmanifest demo`` and ``python -m objmanifest.demo``."""
    scale = parser.add_argument_group("scale")
    scale.add_argument(
        "--agents",
        type=_positive_int,
        default=DEFAULTS["agents"],
        help="agent processes per stage (default %(default)s)",
    )
    scale.add_argument(
        "--files",
        type=_positive_int,
        default=DEFAULTS["files"],
        help="files made by the collect stage; the write stage packs them in "
        "groups of 3 (default %(default)s, at least 3)",
    )
    scale.add_argument(
        "--big-mib",
        type=_positive_int,
        default=DEFAULTS["big_mib"],
        help="size of the large artifact, uploaded in 8 MiB parts (default %(default)s)",
    )
    scale.add_argument(
        "--lease",
        type=_positive_float,
        default=DEFAULTS["lease"],
        help="lease seconds of the demo task; the killed agent's entry is "
        "taken over about lease + 2 s after it was claimed (default %(default)s)",
    )
    scale.add_argument(
        "--work-ms",
        type=_non_negative_int,
        default=DEFAULTS["work_ms"],
        help="simulated processing time per entry (default %(default)s)",
    )
    scale.add_argument(
        "--timeout",
        type=_positive_float,
        default=600.0,
        help="give up if the pipeline has not finished after this many "
        "seconds (default %(default)s)",
    )
    where = parser.add_argument_group("where")
    where.add_argument(
        "--backend",
        choices=servers.BACKENDS,
        default="seaweedfs",
        help="embedded S3 server to start (default %(default)s)",
    )
    where.add_argument(
        "--endpoint-url",
        metavar="URL",
        default=None,
        help="run against this S3 endpoint instead of an embedded server "
        "(credentials from the usual AWS environment or profile)",
    )
    where.add_argument(
        "--url",
        dest="store_url",
        metavar="URL",
        default=None,
        help="run against this store instead of an embedded server: s3://BUCKET/PREFIX, "
        "az://CONTAINER/PREFIX, gs://BUCKET/PREFIX or file:///DIR (with --endpoint-url "
        "for its endpoint, if it needs one); only this option names it, not $OBJMANIFEST_URL",
    )
    where.add_argument(
        "--bucket",
        default="objmanifest-demo",
        help="bucket to use, created if missing (default %(default)s); each "
        "run uses its own task id inside it",
    )
    where.add_argument(
        "--keep",
        action="store_true",
        help="keep the run's objects: against --endpoint-url or --url they are deleted "
        "otherwise; the embedded SeaweedFS keeps its data directory",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the summary as JSON on stdout (progress goes to stderr)",
    )


def main(args: argparse.Namespace) -> int:
    """Run the demo with parsed arguments; 0 only if everything was consistent.

    The run machinery (process pools, the live display) is imported here, when the demo
    runs, so that every other command starts without it.
    """
    from .run import run
    from .target import Settings

    return run(Settings.from_args(args), sys.stdout, sys.stderr)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m objmanifest.demo",
        description="Run a multi-process pipeline through an objmanifest task on an embedded "
        "S3 server, kill one agent mid-work, and verify that everything stays consistent.",
    )
    add_arguments(ap)
    return ap


__all__ = ["add_arguments", "main", "parser"]
