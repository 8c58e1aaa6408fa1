"""``objmanifest put-many`` from a shell: the claims ``claim --limit`` printed go back in,
each file's outcome comes out, and the exit code is 0 only when every file is ready."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import objmanifest as om
from objmanifest.cli import batch
from tests import test_cli
from tests.support.internals import engine
from tests.test_cli import Cli, E

pytestmark = pytest.mark.one_server  # the CLI, not the backend, is under test

cli = test_cli.cli  # the fixture: the CLI for one test's prefix


def write(root: Path, file_id: str, data: bytes) -> Path:
    path = root / file_id
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_put_many_finishes_what_claim_limit_printed(
    cli: Cli, task: om.Task, tmp_path: Path
) -> None:
    ids = ["raw/a.json", "raw/b.json", "raw/c.json"]
    task.declare_many([(fid, "collect") for fid in ids])
    claimed = cli.run("claim", "--stage", "collect", "--agent", "w", "--limit", "3").text
    # In the order claim printed them (partition by partition on a split stage).
    order = [line.split("\t")[0] for line in claimed.splitlines()]
    assert sorted(line.split("\t")[:3] for line in claimed.splitlines()) == [
        [fid, "collect", "1"] for fid in ids
    ]
    (tmp_path / "claims.tsv").write_text(claimed)
    out = tmp_path / "out"
    for fid in ids:
        write(out, fid, f"data of {fid}".encode())

    done = cli.run("put-many", "--agent", "w", "--claims", "claims.tsv", "--dir", "out")
    assert done.stderr == ""
    lines = done.text.splitlines()
    assert [line.split(" is ")[0] for line in lines] == order
    assert all(" is ready: " in line for line in lines)
    entries = {e.file_id: e for e in task.entries("collect")}
    assert {fid: (e.state, e.epoch, e.owner) for fid, e in entries.items()} == {
        fid: (om.State.ready, 1, "w") for fid in ids
    }
    finishes = [r for r in task.log() if r.command == "finish_many"]
    shards = {engine(task).shard_key("collect", fid) for fid in ids}
    assert len(finishes) == len(shards), "one commit for the batch per shard"
    assert sorted(t.item for r in finishes for t in r.transitions) == ids
    reader = task.agent("reader")
    assert [reader.consume(fid) for fid in ids] == [f"data of {fid}".encode() for fid in ids]

    # Running it again is a repeat of what landed: each entry is reported, nothing changes.
    again = cli.json("put-many", "--agent", "w", "--claims", "claims.tsv", "--dir", "out")
    assert (again["ready"], again["failed"], again["exit_code"]) == (3, 0, 0)
    assert [r["entry"]["state"] for r in again["results"]] == ["consumed"] * 3


def test_the_json_of_claim_goes_in_with_paths_and_a_fenced_file_is_reported_alone(
    cli: Cli, task: om.Task, tmp_path: Path
) -> None:
    task.declare_many([("a", "collect"), ("b", "collect"), ("c", "collect")])
    claims = cli.json("claim", "--stage", "collect", "--agent", "w", "--limit", "3")["claims"]
    claims.sort(key=lambda c: c["file_id"])
    for claim in claims:
        claim["path"] = str(write(tmp_path, f"in/{claim['file_id']}", claim["file_id"].encode()))
    claims[1]["epoch"] = 7  # not the epoch w holds b at: fenced
    stdin = json.dumps({"claims": claims}).encode()

    got = cli.json("put-many", "--agent", "w", "--claims", "-", stdin=stdin, code=E.LEASE_LOST)
    assert (got["ready"], got["failed"], got["exit_code"]) == (2, 1, 5)
    assert (got["error"], got["message"]) == (
        "LeaseLost",
        "2 of 3 file(s) made ready; 1 not (1 lease lost)",
    )
    a, b, c = got["results"]
    assert (a["file_id"], a["epoch"], a["entry"]["state"]) == ("a", 1, "ready")
    assert (c["file_id"], c["entry"]["key"]) == ("c", "job/data/collect/c@1")
    assert (b["file_id"], b["epoch"], b["error"], b["exit_code"]) == ("b", 7, "LeaseLost", 5)
    assert b["message"].startswith("lease on 'b' (epoch 7, agent w) is lost: the entry is now ")
    assert "entry" not in b
    assert (task.entry("b").state, task.entry("b").epoch) == (om.State.writing, 1)

    # Without --json: the ready files on stdout, each failure and a summary on stderr.
    task.declare("d", stage="collect")
    (d,) = cli.json("claim", "--stage", "collect", "--agent", "w", "--limit", "1")["claims"]
    lines = "".join(
        f"{fid}\tcollect\t{epoch}\tEXPIRY\t{tmp_path / 'in' / 'a'}\n"
        for fid, epoch in (("b", 9), ("d", d["epoch"]))
    )
    human = cli.run("put-many", "--agent", "w", "--claims", "-", stdin=lines.encode(), code=5)
    assert human.text.startswith("d is ready: 1 bytes, xxh3-128:")
    stderr = human.stderr.splitlines()
    assert stderr[0].startswith(
        "objmanifest: b: lease lost: lease on 'b' (epoch 9, agent w) is lost"
    )
    assert stderr[1:] == ["objmanifest: 1 of 2 file(s) made ready; 1 not (1 lease lost)"]


def test_put_many_refuses_bad_input_before_anything_changes(
    cli: Cli, task: om.Task, tmp_path: Path
) -> None:
    task.declare_many([("a", "collect"), ("b", "collect")])
    claimed = cli.run("claim", "--stage", "collect", "--agent", "w", "--limit", "2").text
    claimed = "".join(sorted(claimed.splitlines(keepends=True)))  # a first
    write(tmp_path, "out/a", b"A")

    def refused(code: int, stdin: str, *extra: str) -> str:
        got = cli.json(
            "put-many", "--agent", "w", "--claims", "-", *extra, stdin=stdin.encode(), code=code
        )
        message: str = got["message"]
        return message

    missing = refused(E.ERROR, claimed, "--dir", "out")  # out/b is not there
    assert missing == "cannot read 'out/b': no such file"
    no_path = refused(E.USAGE, claimed)
    assert no_path == (
        "line 1 ('a') gives no PATH for its data: add it as a fifth field, or pass --dir DIR to "
        "read each file from DIR/FILE_ID"
    )
    short = refused(E.USAGE, "a\tcollect\t1\n", "--dir", "out")
    assert short.startswith("line 1 has 3 tab-separated field(s), not 4 or 5: give each claim ")
    twice = refused(
        E.USAGE, "a\tcollect\t1\tX\nb\tcollect\t1\tX\na\tcollect\t1\tX\n", "--dir", "out"
    )
    assert twice == "line 1 and line 3 both name 'a': give each file once"
    epoch = refused(E.USAGE, "a\tcollect\tone\tX\n", "--dir", "out")
    assert epoch == (
        "line 1: the epoch 'one' is not a whole number of at least 1 (the EPOCH `claim` printed)"
    )
    assert "not valid JSON" in refused(E.USAGE, "{nope", "--dir", "out")
    assert "has no file_id" in refused(E.USAGE, '{"claims": [{"epoch": 1}]}', "--dir", "out")
    escape = refused(E.USAGE, "../a\tcollect\t1\tX\n", "--dir", "out")
    assert escape.startswith("invalid file id '../a'")
    stdin_data = refused(E.USAGE, "a\tcollect\t1\tX\t-\n")
    assert stdin_data == "line 1 ('a'): put-many reads no data from stdin; name a file"
    write(tmp_path, "out/zz", b"Z")
    undeclared = refused(E.NOT_FOUND, "zz\tcollect\t1\tX\n", "--dir", "out")
    assert undeclared == "'zz' is not declared in task 'job'"
    not_dir = refused(E.ERROR, claimed, "--dir", "out/a")
    assert not_dir.startswith("--dir 'out/a' is not a directory")
    gone = cli.json("put-many", "--agent", "w", "--claims", "nope.tsv", code=E.ERROR)
    assert gone["message"] == "cannot read --claims 'nope.tsv': no such file"
    cli.run("put-many", "--agent", "w", code=E.USAGE)  # --claims is required
    cli.run("put-many", "--agent", "w", "--claims", "-", "--concurrency", "0", code=E.USAGE)

    assert {e.state for e in task.entries("collect")} == {om.State.writing}
    assert {r.command for r in task.log()} == {"declare", "claim_many"}
    empty = cli.json("put-many", "--agent", "w", "--claims", "-", stdin=b"\n")
    assert empty == {"results": [], "ready": 0, "failed": 0, "exit_code": 0}


def test_failures_of_one_kind_keep_their_exit_code_and_mixed_ones_exit_1() -> None:
    lost, gone = om.LeaseLost("x"), om.StoreError("y")
    assert batch._outcome([lost, om.LeaseLost("z")]) == ("LeaseLost", 5)
    assert batch._outcome([lost, gone]) == ("NotAllReady", 1)
    assert batch._outcome([FileNotFoundError("a"), IsADirectoryError("b")]) == ("NotAllReady", 1)
