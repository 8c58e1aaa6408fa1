"""The options many commands share: the global ones (store URL, endpoint, task, output) with
their environment variables, and the agent, holder and wait options."""

from __future__ import annotations

import argparse
import os
from typing import Any

from .values import (
    epoch,
    positive_int,
    seconds,
)

ENV_URL = "OBJMANIFEST_URL"


ENV_TASK = "OBJMANIFEST_TASK"


ENV_AGENT = "OBJMANIFEST_AGENT"


ENV_WEB_TOKEN = "OBJMANIFEST_WEB_TOKEN"


GLOBAL_DESTS = ("url", "endpoint_url", "task", "json", "debug", "no_progress", "cas_attempts")


def add_globals(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The options every command takes. On subcommands their defaults are suppressed, so a
    value given before the subcommand is not overwritten by a default after it."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    group = parser.add_argument_group("global options")
    group.add_argument(
        "--url",
        default=default(os.environ.get(ENV_URL)),
        metavar="URL",
        help="where the tasks live: s3://BUCKET/PREFIX, az://CONTAINER/PREFIX, "
        f"gs://BUCKET/PREFIX or file:///DIR (default: ${ENV_URL})",
    )
    group.add_argument(
        "--endpoint-url",
        default=default(None),
        metavar="URL",
        help="the store's endpoint: an S3 endpoint of a non-AWS store (default: "
        "$AWS_ENDPOINT_URL_S3, then $AWS_ENDPOINT_URL), an Azure account URL "
        "($AZURE_STORAGE_ACCOUNT_URL) or a GCS endpoint ($STORAGE_EMULATOR_HOST)",
    )
    group.add_argument(
        "--task",
        default=default(os.environ.get(ENV_TASK)),
        metavar="ID",
        help=f"the task to work on (default: ${ENV_TASK})",
    )
    for switch, meaning in (
        ("--json", "write one JSON object (result or error) instead of text"),
        ("--debug", "print the traceback of an error"),
        ("--no-progress", "no progress bars, even on a terminal"),
    ):
        group.add_argument(switch, action="store_true", default=default(False), help=meaning)
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
        type=epoch,
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
