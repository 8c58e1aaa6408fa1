"""The lifecycle verbs from a shell, on every backend: release, revive, undeclare, tasks,
delete; each with --json and the exit codes of cli/exits.py, hostile input included."""

from __future__ import annotations

import pytest

import objmanifest as om
from tests import test_cli
from tests.test_cli import Cli, E

pytestmark = pytest.mark.one_server  # the CLI, not the backend, is under test

cli = test_cli.cli  # the fixture: the CLI for one test's prefix


def test_release_from_a_shell_is_fenced_like_renew(cli: Cli, task: om.Task) -> None:
    task.declare("a", stage="collect")
    claim = cli.json("claim", "a", "--agent", "w1")
    released = cli.json("release", "a", "--agent", "w1", "--epoch", str(claim["epoch"]))
    assert (released["state"], released["retry_count"], released["owner"]) == ("pending", 0, None)
    human = cli.run("claim", "a", "--agent", "w2")
    assert human.text.split("\t")[:3] == ["a", "collect", "2"]
    stale = cli.json("release", "a", "--agent", "w1", "--epoch", "1", code=E.LEASE_LOST)
    assert stale["error"] == "LeaseLost" and "epoch 1, agent w1" in stale["message"]
    other = cli.json("release", "a", "--agent", "w3", "--epoch", "2", code=E.LEASE_LOST)
    assert "w3" in other["message"]
    assert task.entry("a").owner == "w2"
    cli.json("release", "nope", "--agent", "w1", "--epoch", "1", code=E.NOT_FOUND)
    cli.json("release", "../x", "--agent", "w1", "--epoch", "1", code=E.USAGE)
    cli.run("release", "a", "--agent", "w2", "--epoch", "-1", code=E.USAGE)
    cli.run("release", "a", "--agent", "w2", code=E.USAGE)  # --epoch is required
    text = cli.run("release", "a", "--agent", "w2", "--epoch", "2").text
    assert text == "a is pending again (released by w2, failures 0)\n"


def test_revive_and_undeclare_from_a_shell(cli: Cli, store: om.ObjectStore) -> None:
    task = om.Task.create(store, "job", stages=["collect", "write"], max_retries=0)
    task.declare("d", stage="collect")
    task.declare("p", stage="collect")
    task.declare("w", stage="write", depends_on=["p"])
    agent = task.agent("x")
    claim = agent.claim("d")
    assert claim is not None
    agent.fail(claim, "bad input")
    dead = cli.json("claim", "d", "--agent", "x", code=E.NOTHING_CLAIMABLE)  # max_retries=0
    assert "state dead after 1 failure; last error: bad input" in dead["message"], dead
    not_dead = cli.json("revive", "p", code=E.REFUSED)
    assert not_dead["error"] == "WrongState" and "'p' is pending, not dead" in not_dead["message"]
    revived = cli.json("revive", "d")
    assert (revived["state"], revived["retry_count"]) == ("failed", 0)
    cli.json("revive", "nope", code=E.NOT_FOUND)
    cli.json("revive", "", code=E.USAGE)
    wrong = cli.json("undeclare", "d", code=E.REFUSED)
    assert "'d' is failed, not pending" in wrong["message"]
    needed = cli.json("undeclare", "p", code=E.REFUSED)
    assert needed["error"] == "HasDependents" and needed["dependents"] == ["w"]
    assert needed["message"] == (
        "'p' cannot be undeclared: w depends on it; undeclare that entry first"
    )
    assert cli.json("undeclare", "w") == {"undeclared": "w"}
    assert cli.run("undeclare", "p").text == "undeclared p\n"
    assert sorted(task.index().file_ids()) == ["d"]
    cli.json("undeclare", "p", code=E.NOT_FOUND)
    cli.json("--task", "missing", "undeclare", "p", code=E.NOT_FOUND)


def test_tasks_and_delete_from_a_shell(cli: Cli, store: om.ObjectStore) -> None:
    assert cli.json("tasks") == []
    task = om.Task.create(store, "job", stages=["collect"], lease_seconds=60)
    om.Task.create(store, "other", stages=["collect"])
    assert cli.json("tasks") == ["job", "other"]
    assert cli.run("tasks").text == "job\nother\n"
    task.declare("a", stage="collect")
    claim = cli.json("claim", "a", "--agent", "w")
    no = cli.json("delete", code=E.USAGE)
    assert "add --yes" in no["message"] and "nothing was deleted" in no["message"]
    cli.json("delete", "--force", code=E.USAGE)
    live = cli.json("delete", "--yes", code=E.REFUSED)
    assert live["error"] == "LeasesLive" and live["holders"][0].startswith("a (w, epoch 1")
    assert cli.json("tasks") == ["job", "other"]
    done = cli.json("delete", "--yes", "--force")
    assert done["deleted"] == "job" and done["objects"] > 0
    assert cli.json("tasks") == ["other"]
    cli.json("status", code=E.NOT_FOUND)
    cli.json("delete", "--yes", code=E.NOT_FOUND)
    cli.json("release", "a", "--agent", "w", "--epoch", str(claim["epoch"]), code=E.NOT_FOUND)
    cli.json("--task", "../x", "delete", "--yes", code=E.USAGE)
    text = cli.run("--task", "other", "delete", "--yes").text
    assert text.startswith("deleted task 'other': ")
    assert cli.json("tasks") == []
