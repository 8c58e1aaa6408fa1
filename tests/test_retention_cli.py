"""Journal retention from the command line: ``init --journal-keep-*``, ``trim`` and what
``log`` says of dropped records."""

from __future__ import annotations

import pytest

import objmanifest as om
from tests import test_cli
from tests.support.internals import engine
from tests.test_cli import Cli

pytestmark = pytest.mark.one_server  # the CLI, not the backend, is under test

cli = test_cli.cli  # the fixture


@pytest.mark.layouts
def test_init_trim_and_log_say_what_retention_dropped(cli: Cli, store: om.ObjectStore) -> None:
    cli.run("--task", "r", "init", "collect", "--journal-keep-seconds", "inf", code=2)
    cli.run("--task", "r", "init", "collect", "--journal-keep-versions", "0", code=2)
    made = cli.json("--task", "r", "init", "collect", "--journal-keep-versions", "40")
    assert (made["journal_keep_versions"], made.get("journal_keep_seconds")) == (40, None)
    again = ("--task", "r", "init", "collect", "--exist-ok")
    assert cli.json(*again, "--journal-keep-versions", "40")["created"] is False
    assert cli.json(*again)["created"] is False
    cli.run(*again, "--journal-keep-versions", "41", code=9)
    task = om.Task.open(store, "r")
    task.declare("f", stage="collect")
    agent = task.agent("a")
    claim = agent.claim("f")
    assert claim is not None
    for _ in range(100):  # the shard at v102
        agent.renew(claim)
    task.flush_journal()
    agent.renew(claim)  # v103 carries 97..103 only
    task.flush_journal()
    key = engine(task).shard_key("collect", "f")

    dry = cli.json("--task", "r", "trim", "--dry-run")
    assert dry["dry_run"] and dry["records"] == 32
    assert cli.json("--task", "r", "log", "f")["dropped"] == []
    trimmed = cli.json("--task", "r", "trim")
    assert [(d["object_key"], d["first"], d["last"]) for d in trimmed["dropped"]] == [(key, 1, 32)]
    history = cli.json("--task", "r", "log", "f")
    assert history["history"][0]["version"] == 33
    assert [(d["first"], d["last"], d["records"]) for d in history["dropped"]] == [(1, 32, 32)]
    text = cli.run("--task", "r", "log").text
    assert f"records before version 33 of {key} were dropped by retention" in text
    assert "dropped 0 journal record(s)" in cli.run("--task", "r", "trim").text

    cli.run("init", "collect")  # a task without retention: trim needs a bound
    refused = cli.json("trim", code=2)
    assert "--keep-versions" in refused["message"]
    assert cli.json("trim", "--keep-versions", "10")["dropped"] == []


@pytest.mark.parametrize("server", ["moto"], indirect=True)
def test_trim_options_are_checked_before_any_request(cli: Cli) -> None:
    cli.run("init", "collect")
    assert "journal_keep_seconds" in cli.json("trim", "--keep-seconds", "-1", code=2)["message"]


@pytest.mark.layouts
def test_log_of_an_entry_whose_records_were_all_dropped_says_so_never_migrate(
    cli: Cli, store: om.ObjectStore
) -> None:
    """Every record of ``f0`` dropped by retention: ``log f0`` says what was dropped, not
    that the task keeps no journal (which would send the user to ``migrate``)."""
    cli.run("init", "collect", "--journal-keep-versions", "1")
    task = om.Task.open(store, "job")
    task.declare("f0", "collect")
    home = task.shard_names("collect", "f0")
    beside = (f"h{n}" for n in range(10_000) if task.shard_names("collect", f"h{n}") == home)
    for _, file_id in zip(range(70), beside, strict=False):  # more than two blocks
        task.declare(file_id, "collect")
    task.flush_journal()
    dropped = cli.json("trim")["dropped"]
    assert dropped, "retention dropped nothing"
    text = cli.run("log", "f0").text
    assert "were dropped by retention" in text
    assert "no journal records for f0 left (the lines above say what was dropped or lost)" in text
    assert "migrate" not in text
    assert cli.json("log", "f0")["history"] == []
