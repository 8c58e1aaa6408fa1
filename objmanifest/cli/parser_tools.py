"""The subcommands that run a tool rather than a task command: ``serve``, ``web``, ``mcp``,
``demo``, ``doctor`` and ``iam-policy``."""

from __future__ import annotations

import argparse
import os
from typing import Any

from objmanifest import demo
from objmanifest.local import servers

from .options import ENV_WEB_TOKEN, GLOBAL_DESTS, add_agent
from .values import (
    hold_seconds,
    port,
    positive_seconds,
    racers,
    web_port,
)


def add_serve(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
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


def add_web(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """The status page."""
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


def add_mcp(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """The MCP server for LLM agents."""
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


def add_demo(sub: Any) -> None:
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


def add_store_checks(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
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
        help="print the least-privilege access policy for --url's bucket and prefix",
        description="Prints the access policy a role needs for --url's bucket and prefix, in "
        "its cloud's own form (s3://: an AWS IAM policy document; gs://: a GCS custom role "
        "and its binding, with a condition on the prefix and what GCS cannot confine); sends "
        "no request. 'agent' (the default): every command but gc, repair, delete, archive "
        "and trim. 'admin': those five too.",
    )
    p.add_argument(
        "--for",
        dest="role",
        choices=["agent", "admin"],
        default="agent",
        help="whose policy (default: agent)",
    )
