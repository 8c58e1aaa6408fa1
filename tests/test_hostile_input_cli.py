"""Hostile input through the command line: one line, the right exit code, nothing touched.
The attack table in docs/cli.md lists what was tried.

What needs no store runs ``main()`` in this process; everything else runs ``python -m
objmanifest`` as a child process against the real servers of ``tests.support.stores``, the
way a shell step runs it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import objmanifest as om
from objmanifest.cas.blocks import BLOCK
from objmanifest.cli import main
from tests.support import rawstore
from tests.support.cli_forks import FORKS
from tests.support.faults import FaultProxy
from tests.support.internals import engine
from tests.support.stores import Server
from tests.test_cli import in_layout
from tests.test_hostile_input import not_s3

pytestmark = pytest.mark.one_server  # the CLI, not the backend, is under test

ROOT = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024
USAGE, NOT_FOUND, CLAIM, STORE, UNSUPPORTED, IO, INTERRUPTED = 2, 8, 3, 13, 12, 1, 130


@dataclass
class Ran:
    code: int
    stdout: bytes
    stderr: str

    @property
    def out(self) -> str:
        return self.stdout.decode()

    def __str__(self) -> str:
        return f"exit {self.code}\nstdout: {self.out}\nstderr: {self.stderr}"


@dataclass
class Cli:
    env: dict[str, str]
    cwd: Path

    def run(self, *args: str, code: int = 0, stdin: bytes = b"", shell: str = "") -> Ran:
        """``objmanifest ARGS`` (or a bash line with ``om`` for it) in a child process."""
        env = {**self.env, "PY": sys.executable}
        if shell:
            proc = subprocess.run(
                ["bash", "-c", f'om() {{ "$PY" -m objmanifest "$@"; }}\n{shell}'],
                input=stdin,
                capture_output=True,
                env=env,
                cwd=self.cwd,
                timeout=120,
            )
        else:
            proc = FORKS.run(in_layout(args), stdin=stdin, env=env, cwd=self.cwd, timeout=120)
        ran = Ran(proc.returncode, proc.stdout, proc.stderr.decode())
        assert ran.code == code, str(ran)
        assert "Traceback" not in ran.stderr, str(ran)
        return ran

    def json(self, *args: str, code: int = 0) -> Any:
        return json.loads(self.run("--json", *args, code=code).stdout)


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OBJMANIFEST_", "AWS_"))}
    env.update(COLUMNS="200", PYTHONUNBUFFERED="1")
    return env


@pytest.fixture
def cli(server: Server, prefix: str, tmp_path: Path) -> Cli:
    env = {
        **clean_env(),
        **server.env,
        "OBJMANIFEST_URL": server.url(prefix),
        "OBJMANIFEST_TASK": "job",
    }
    return Cli(env, tmp_path)


MOTO_ONLY = pytest.mark.parametrize("server", ["moto"], indirect=True)
"""For what the command line does the same on every store."""


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line(text: str) -> str:
    assert text.endswith("\n") and text.count("\n") == 1, repr(text)
    return text


# -- no store needed ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["0", "-5", "-0", "inf", "-inf", "nan", "1e12", "2592001", "1e400"]
)
def test_init_refuses_every_bad_lease_with_one_message(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = in_process(
        capsys, "--url", "s3://work/p", "--task", "t", "init", "a", f"--lease={value}"
    )
    assert code == USAGE and out == ""
    assert one_line(err).startswith(
        "objmanifest: invalid input: lease_seconds must be a number of seconds above 0 and at "
        "most 2592000 (30 days), not "
    )


INTEGER_FLAGS = [
    (
        ("put", "f", "-", "--agent", "w", "--epoch", "{}"),
        "--epoch",
        "of at least 1 (the epoch `claim` printed)",
    ),
    (
        ("renew", "f", "--agent", "w", "--epoch", "{}"),
        "--epoch",
        "of at least 1 (the epoch `claim` printed)",
    ),
    (
        ("fail", "f", "--agent", "w", "--reason", "r", "--epoch", "{}"),
        "--epoch",
        "of at least 1 (the epoch `claim` printed)",
    ),
    (("--cas-attempts", "{}", "status"), "--cas-attempts", "of at least 1"),
    (("claim", "--stage", "a", "--agent", "w", "--limit", "{}"), "--limit", "of at least 1"),
    (
        ("put", "f", "-", "--agent", "w", "--epoch", "1", "--concurrency", "{}"),
        "--concurrency",
        "of at least 1",
    ),
    (("doctor", "--racers", "{}"), "--racers", "from 2 to 64 (writers in a race)"),
    (("serve", "--port", "{}"), "--port", "from 1 to 65535 (a TCP port)"),
    (("web", "--port", "{}"), "--port", "from 0 to 65535 (a TCP port; 0: any free one)"),
]


@pytest.mark.parametrize(("args", "flag", "bound"), INTEGER_FLAGS, ids=lambda v: str(v)[:40])
def test_every_integer_flag_says_one_bound_whatever_the_value_below_it(
    args: tuple[str, ...], flag: str, bound: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--epoch -1`` and ``--epoch 0`` are refused with the same words (and so is every
    value below or above any integer option's range), the bound the API holds too."""
    low = int(bound.split()[1 if bound.startswith("from") else 3])
    for value in (
        str(low - 1),
        str(low - 2),
        "-99999999999999999999",
        "70000" if "65535" in bound else str(low - 1),
    ):
        code, out, err = in_process(
            capsys, "--url", "s3://work/p", "--task", "t", *(a.format(value) for a in args)
        )
        assert code == USAGE and out == ""
        assert err.splitlines()[-1] == (
            f"objmanifest: error: argument {flag}: must be a whole number {bound}, not {int(value)}"
        ), err


@pytest.mark.parametrize(
    ("args", "value"),
    [
        (("archive", "--older-than"), "7e10"),
        (("archive", "--older-than"), "1e308"),
        (("archive", "--older-than"), "inf"),
        (("gc", "--consumed-older-than"), "1e11"),
        (("gc", "--consumed-older-than"), "1e308"),
        (("gc", "--consumed-older-than"), "nan"),
        (("gc", "--consumed-older-than"), "-1"),
    ],
)
def test_an_age_past_1000_years_is_a_usage_error_naming_the_bound(
    args: tuple[str, ...], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = in_process(capsys, "--url", "s3://work/p", "--task", "t", *args, value)
    assert code == USAGE and out == ""
    assert err.splitlines()[-1] == (
        f"objmanifest: error: argument {args[1]}: must be a finite number of seconds from 0 "
        f"to 31557600000 (1000 years), not {value!r}"
    ), err


@pytest.mark.parametrize("value", ["-1", "1001"])
def test_init_refuses_retries_out_of_range_with_the_apis_message(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = in_process(
        capsys, "--url", "s3://work/p", "--task", "t", "init", "a", f"--retries={value}"
    )
    assert code == USAGE
    assert one_line(err).startswith(
        "objmanifest: invalid input: max_retries must be a whole number from 0 to 1000"
    )


@pytest.mark.parametrize("port", ["70000", "0", "-1", "65536"])
def test_serve_refuses_a_port_out_of_range(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = in_process(capsys, "serve", f"--port={port}")
    assert code == USAGE and out == ""
    assert err.endswith(
        "objmanifest: error: argument --port: must be a whole number from 1 to 65535 (a TCP "
        f"port), not {int(port)}\n"
    )


@pytest.mark.parametrize("url", ["s3://Bad_Bucket!!/x", "s3://a b/x", "s3://x:1/p"])
def test_a_malformed_bucket_name_is_one_line_and_exit_2(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = in_process(capsys, "--url", url, "--task", "t", "status")
    assert code == USAGE
    assert one_line(err).startswith("objmanifest: invalid input: invalid bucket name")


def test_an_endpoint_that_is_not_s3_is_said_plainly(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    with not_s3(404) as endpoint:
        for command in (["status"], ["show", "a"], ["init", "a"]):
            code, _, err = in_process(
                capsys, "--url", "s3://work/p", "--task", "t", "--endpoint-url", endpoint, *command
            )
            assert code == STORE, err
            assert f"store error: {endpoint} does not behave like S3" in one_line(err)
    code, _, err = in_process(capsys, "--url", "s3://w/p", "--task", "t", "--endpoint-url", "x")
    assert code == USAGE


def test_endpoint_url_help_names_both_variables(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "$AWS_ENDPOINT_URL_S3, then $AWS_ENDPOINT_URL" in text


def install_hint(extra: str) -> str:
    """The advice a command needing ``extra`` gives when it is missing, run from this
    checkout (an editable install): pip of this Python, the checkout's path and the extra."""
    target = shlex.quote(f"{ROOT}[{extra}]")
    return (
        "install it into this Python from the checkout it runs from: "
        f"{shlex.quote(sys.executable)} -m pip install -e {target}"
    )


def test_serve_without_the_servers_extra_says_how_to_install_it(tmp_path: Path) -> None:
    code = (
        "import sys\nsys.modules['moto'] = None\n"
        "from objmanifest.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "--json", "serve", "--bucket", "work"],
        capture_output=True,
        env=clean_env(),
        cwd=tmp_path,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == UNSUPPORTED, proc.stderr
    refused = json.loads(proc.stdout)
    assert refused["error"] == "ExtraMissing"
    assert refused["message"].startswith(
        "objmanifest serve needs the optional extra objmanifest[servers] (module 'moto"
    )
    assert refused["message"].endswith(install_hint("servers")), refused["message"]


def test_serve_stop_without_a_detached_server_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OBJMANIFEST_SERVE_PID", raising=False)
    code, _, err = in_process(capsys, "serve", "--stop")
    assert code == USAGE and "OBJMANIFEST_SERVE_PID is not set" in err
    monkeypatch.setenv("OBJMANIFEST_SERVE_PID", str(os.getpid()))
    code, _, err = in_process(capsys, "serve", "--stop")
    assert code == USAGE and "is not an objmanifest server; it was left alone" in err


# -- against a store ------------------------------------------------------------------------


@MOTO_ONLY
def test_init_of_an_existing_task_points_at_exist_ok(cli: Cli) -> None:
    cli.run("init", "a")
    err = cli.run("init", "a", code=9).stderr
    assert "pass --exist-ok" in one_line(err) and "Task.open" not in err
    assert cli.json("init", "a", "--exist-ok")["created"] is False


@MOTO_ONLY
@pytest.mark.parametrize("file_id", ["", "../x", "/etc/passwd", "a//b", "a\tb"])
def test_show_of_an_invalid_file_id_is_a_usage_error(cli: Cli, file_id: str) -> None:
    cli.run("init", "a")
    err = cli.run("show", file_id, code=USAGE).stderr
    assert one_line(err).startswith("objmanifest: invalid input: invalid file id")


@MOTO_ONLY
def test_declare_from_says_what_is_wrong_with_the_batch(cli: Cli, tmp_path: Path) -> None:
    cli.run("init", "a", "b")
    err = cli.run("declare", "--from", "-", stdin=b'{"a": 1}\n', code=USAGE).stderr
    assert "item 1 of the --from input has no file_id: {'a': 1}" in err
    err = cli.run(
        "declare", "--from", "-", "--stage", "a", stdin=b'{"file_id": "x", "stag": "b"}', code=USAGE
    ).stderr
    assert "unknown keys ['stag']" in err
    twice = cli.run("declare", "--from", "-", "--stage", "a", stdin=b"x\nx\n").out
    assert twice == "declared x in stage a (pending) (1 repeated in the input)\n"
    empty = cli.run("declare", "--from", "-", stdin=b"\n\n").out
    assert empty == "nothing to declare: the input has no declarations\n"
    two_stages = b'{"file_id": "y", "stage": "a"}\n{"file_id": "y", "stage": "b"}\n'
    err = cli.run("declare", "--from", "-", stdin=two_stages, code=9).stderr
    assert "the batch declares 'y' twice, differently (stage: 'a' vs 'b')" in err
    assert "already declared differently" not in err
    cli.run("show", "y", code=NOT_FOUND)
    (tmp_path / "d").mkdir()
    assert "is a directory" in cli.run("declare", "--from", "d", code=IO).stderr
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    assert "is not UTF-8 text" in cli.run("declare", "--from", "bin", code=USAGE).stderr


@MOTO_ONLY
def test_claim_by_stage_says_when_the_stage_has_no_entries(cli: Cli) -> None:
    cli.run("init", "a", "b")
    cli.run("declare", "x", "--stage", "a")
    err = cli.run("claim", "--stage", "b", "--agent", "w", code=CLAIM).stderr
    assert "stage 'b' has no entries" in one_line(err)
    cli.run("claim", "--stage", "a", "--agent", "w")
    err = cli.run("claim", "--stage", "a", "--agent", "w", code=CLAIM).stderr
    assert "all are taken, done, or waiting" in err


@MOTO_ONLY
@pytest.mark.parametrize("name", ["ev\nil", "x" * 300, " ", "esc\x1b[2J"])
def test_an_agent_name_with_control_characters_or_too_long_is_refused(cli: Cli, name: str) -> None:
    cli.run("init", "a")
    cli.run("declare", "x", "--stage", "a")
    err = cli.run("claim", "x", "--agent", name, code=USAGE).stderr
    assert one_line(err).startswith("objmanifest: invalid input: invalid agent name")
    assert cli.json("show", "x")["state"] == "pending"


@MOTO_ONLY
def test_separators_and_invisible_characters_are_refused_in_every_name_and_every_input(
    cli: Cli, tmp_path: Path
) -> None:
    """U+2028 is refused like a newline, naming the character: as a file id (an argument,
    a line of ``declare --from``, a line of ``put-many --claims``), an agent name and a
    consumer role; a file of such ids declares nothing, never two entries. Every other
    character refused is tried in ``tests/test_input_properties.py``."""
    cli.run("init", "a")
    (tmp_path / "data").write_bytes(b"data")
    said = "line or paragraph separator (U+2028)"
    bad = "x\u2028y"
    err = cli.run("declare", bad, "--stage", "a", code=USAGE).stderr
    assert said in one_line(err) and "invalid file id" in err
    (tmp_path / "ids").write_text(f"ok\n{bad}\n", encoding="utf-8")
    err = cli.run("declare", "--from", "ids", "--stage", "a", code=USAGE).stderr
    assert said in one_line(err)
    (tmp_path / "ids").write_text("x\u2028\nz\n", encoding="utf-8")  # not stripped off
    err = cli.run("declare", "--from", "ids", "--stage", "a", code=USAGE).stderr
    assert said in one_line(err)
    err = cli.run("declare", "ok", "--stage", "a", "--consumer", bad, code=USAGE).stderr
    assert said in one_line(err) and "invalid consumer role" in err
    err = cli.run("claim", "--stage", "a", "--agent", "w\u200b", code=USAGE).stderr
    assert "invisible format character (U+200B)" in one_line(err) and "agent name" in err
    line = f"{bad}\ta\t1\t2030-01-01T00:00:00+00:00\tdata\n"
    err = cli.run("put-many", "--claims", "-", "--agent", "w", stdin=line.encode(), code=USAGE)
    assert said in one_line(err.stderr)
    assert cli.json("status")["totals"]["pending"] == 0


@MOTO_ONLY
@pytest.mark.layouts
def test_a_deleted_shard_is_damage_until_repair_and_no_declare_papers_it_over(
    cli: Cli, store: om.ObjectStore
) -> None:
    """The shard of a ready entry deleted by hand: ``status`` exits 12 naming it and the
    repair; ``declare`` into it (the entry again, or another) and ``show`` exit 12 and
    write nothing; ``repair`` rebuilds it and the task is sound again."""
    cli.run("init", "a", "b")
    cli.run("declare", "f", "--stage", "a")
    cli.run("claim", "f", "--agent", "p")
    cli.run("put", "f", "-", "--agent", "p", "--epoch", "1", stdin=b"hi\n")
    task = om.Task.open(store, "job")
    key = engine(task).shard_key("a", "f")
    address = store.describe(key)
    other = next(f"g{n}" for n in range(10_000) if engine(task).shard_key("a", f"g{n}") == key)
    rawstore.delete(store, key)
    damaged = cli.json("status", code=UNSUPPORTED)
    assert damaged["error"] == "CorruptShard" and damaged["address"] == address
    assert "objmanifest repair" in damaged["message"]
    text = cli.run("status", code=UNSUPPORTED).stdout.decode()
    assert "rerun the declare" not in text
    for file_id in ("f", other):
        err = cli.run("declare", file_id, "--stage", "a", code=UNSUPPORTED).stderr
        assert address in one_line(err) and "it was deleted" in err
        assert "objmanifest repair" in err and "delete it" not in err
    assert address in one_line(cli.run("show", "f", code=UNSUPPORTED).stderr)
    assert rawstore.keys(store, key) == []
    repaired = cli.json("repair")
    assert [(o["key"], o["action"]) for o in repaired["objects"]] == [(key, "rebuilt")]
    assert cli.json("status")["totals"]["pending"] == 1
    cli.run("declare", other, "--stage", "a")


@MOTO_ONLY
@pytest.mark.layouts
def test_repair_puts_back_a_shard_and_an_index_nested_thousands_deep(
    cli: Cli, store: om.ObjectStore
) -> None:
    """A shard and the index raw-PUT as ``{"x":`` 50,000 times: ``status`` exits 12, and
    ``repair`` exits 0 rebuilding both from what the journal's blocks kept (the records the
    objects carried went with them), after which the task is sound and its entries there."""
    cli.run("init", "a", "--lease", "600")
    ids = [f"f{n:02d}" for n in range(2 * BLOCK)]  # a block of each object's records stored
    for file_id in ids:
        cli.run("declare", file_id, "--stage", "a")
    task = om.Task.open(store, "job")
    shard, index = engine(task).shard_key("a", ids[0]), engine(task).layout.index
    for key in (shard, index):
        rawstore.put(store, key, b'{"x":' * 50_000)
    cli.run("status", code=UNSUPPORTED)
    repaired = cli.json("repair")
    assert {(o["key"], o["action"]) for o in repaired["objects"]} == {
        (shard, "rebuilt"),
        (index, "rebuilt"),
    }
    # What a stored block held is back (a partition's own shard may have had none stored).
    assert cli.json("status")["totals"]["pending"] >= BLOCK - 1


@MOTO_ONLY
def test_ninety_declares_each_a_process_keep_the_shard_journal_bounded(
    cli: Cli, store: om.ObjectStore
) -> None:
    """Ninety ``objmanifest declare`` processes, one commit each: every journaled object
    carries fewer than ``2 * BLOCK`` records, and ``trim`` can let old ones go."""
    cli.run("init", "a", "--journal-keep-versions", "40")
    for n in range(90):
        cli.run("declare", f"f{n:03d}", "--stage", "a")
    task = om.Task.open(store, "job")
    for key, codec in engine(task).journaled_objects():
        journal = codec.journal(engine(task).docs.read(key, codec))
        assert journal is not None and len(journal[1]) < 2 * BLOCK, key
    assert sum(d.records for d in task.trim_journal()) >= BLOCK


@MOTO_ONLY
@pytest.mark.layouts
def test_a_corrupt_marker_or_archive_object_is_named_by_every_command_until_repair(
    cli: Cli, store: om.ObjectStore
) -> None:
    """A retention marker raw-PUT as ``[]`` and an archive object nested 50,000 deep:
    ``status``, ``log``, ``show``, ``consume``, ``lineage`` and ``gc`` exit 12 naming the
    object by its s3:// address and ``objmanifest repair``; ``repair`` mends both and the
    archived data can be freed."""
    cli.run("init", "a")
    for file_id in ("q1", "q2"):
        cli.run("declare", file_id, "--stage", "a")
        cli.run("claim", file_id, "--agent", "p")
        cli.run("put", file_id, "-", "--agent", "p", "--epoch", "1", stdin=b"hi\n")
    cli.run("consume", "q1", "--agent", "c", "-o", os.devnull)
    [archive] = cli.json("archive", "--older-than", "0")["objects"]
    task = om.Task.open(store, "job")
    marker = engine(task).layout.journal_retention(engine(task).shard_key("a", "q2"))
    rawstore.put(store, marker, b"[]")
    rawstore.put(store, archive, b'{"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")
    for key, args in (
        (marker, ("log",)),
        (archive, ("show", "q1")),
        (archive, ("consume", "q1", "--agent", "c", "-o", os.devnull)),
        (archive, ("lineage", "q1")),
        (archive, ("gc", "--consumed-older-than", "0")),
    ):
        err = cli.run(*args, code=UNSUPPORTED).stderr
        assert store.describe(key) in one_line(err) and "objmanifest repair" in err, args
        assert store.describe(key).startswith("s3://")
    status = cli.run("status", code=UNSUPPORTED).stdout.decode()
    assert "retention marker" in status and "archive object" in status
    done = cli.json("repair")
    assert {(o["key"], o["action"]) for o in done["objects"]} >= {
        (marker, "rebuilt"),
        (archive, "rebuilt"),
    }
    assert cli.json("show", "q1")["state"] == "consumed"
    assert cli.json("gc", "--consumed-older-than", "0")["removed"]["consumed_data"]["count"] == 1
    cli.run("log")
    cli.run("status")


@MOTO_ONLY
def test_a_corrupt_upload_state_is_named_by_its_s3_address(
    cli: Cli, store: om.ObjectStore, tmp_path: Path
) -> None:
    cli.run("init", "a")
    cli.run("declare", "big", "--stage", "a")
    cli.run("claim", "big", "--agent", "w")
    (tmp_path / "big").write_bytes(b"b" * (6 * MiB))
    cli.run("put", "big", "big", "--agent", "w", "--epoch", "1", "--threshold", "5MiB")
    key = om.Task.open(store, "job").entry("big").parts_key
    assert key is not None
    rawstore.put(store, key, b"{ not json")
    damaged = cli.json("status", code=UNSUPPORTED)
    assert damaged["address"] == store.describe(key) and damaged["address"].startswith("s3://")
    assert "objmanifest repair" in damaged["message"]


@MOTO_ONLY
def test_a_long_fail_reason_is_stored_cut(cli: Cli) -> None:
    cli.run("init", "a")
    cli.run("declare", "x", "--stage", "a")
    cli.run("claim", "x", "--agent", "w")
    failed = cli.json("fail", "x", "r" * 120_000, "--agent", "w", "--epoch", "1")
    assert len(failed["error"]) == 1024 and failed["error"].endswith("of 120000 characters]")


@MOTO_ONLY
def test_put_streams_a_pipe_a_fifo_or_dev_stdin_and_refuses_a_directory(
    cli: Cli, tmp_path: Path
) -> None:
    cli.run("init", "a")
    for n in range(4):
        cli.run("declare", f"f{n}", "--stage", "a")
        cli.run("claim", f"f{n}", "--agent", "w")
    err = cli.run("put", "f0", str(tmp_path), "--agent", "w", "--epoch", "1", code=IO).stderr
    assert "it is a directory; put one file" in one_line(err)
    assert cli.json("show", "f0")["state"] == "writing"
    err = cli.run("put", "nosuch", str(tmp_path), "--agent", "w", "--epoch", "1", code=IO).stderr
    assert "it is a directory" in err  # found before the file id is looked up
    cli.run(shell='om put f0 <(printf "from a process") --agent w --epoch 1')
    cli.run(shell="printf 'from stdin' | om put f1 /dev/stdin --agent w --epoch 1")
    os.mkfifo(tmp_path / "fifo")
    cli.run(shell="(printf 'from a fifo' > fifo &) ; om put f2 fifo --agent w --epoch 1")
    err = cli.run(shell="om put f3 - --agent w --epoch 1 <&-", code=USAGE).stderr
    assert "stdin is closed" in err
    for n, data in enumerate([b"from a process", b"from stdin", b"from a fifo"]):
        assert cli.run("consume", f"f{n}", "--agent", "r").stdout == data


@MOTO_ONLY
def test_consume_writes_into_devices_and_fifos_and_refuses_directories(
    cli: Cli, tmp_path: Path
) -> None:
    cli.run("init", "a")
    for n in range(3):
        cli.run("declare", f"f{n}", "--stage", "a")
        cli.run("claim", f"f{n}", "--agent", "w")
        cli.run("put", f"f{n}", "-", "--agent", "w", "--epoch", "1", stdin=b"data %d" % n)
    (tmp_path / "null").symlink_to("/dev/null")
    cli.run("consume", "f0", "--agent", "r", "-o", "null")
    assert os.readlink(tmp_path / "null") == "/dev/null"
    (tmp_path / "dir").mkdir()
    err = cli.run("consume", "f1", "--agent", "r", "-o", "dir", code=IO).stderr
    assert "cannot write 'dir': it is a directory" in one_line(err)
    err = cli.run("consume", "f1", "--agent", "r", "-o", "no/such/f", code=IO).stderr
    assert "does not exist" in err and "--parents" in err
    assert not (tmp_path / "no").exists()
    assert cli.json("show", "f1")["state"] == "ready"
    cli.run("consume", "f1", "--agent", "r", "-o", "no/such/f", "--parents")
    assert (tmp_path / "no" / "such" / "f").read_bytes() == b"data 1"
    os.mkfifo(tmp_path / "fifo")
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append((tmp_path / "fifo").read_bytes()))
    reader.daemon = True
    reader.start()
    cli.run("consume", "f2", "--agent", "r", "-o", "fifo")
    reader.join(30)
    assert got == [b"data 2"] and (tmp_path / "fifo").is_fifo()


@MOTO_ONLY
def test_consume_with_stdout_closed_marks_nothing(cli: Cli) -> None:
    cli.run("init", "a")
    cli.run("declare", "x", "--stage", "a")
    cli.run("claim", "x", "--agent", "w")
    cli.run("put", "x", "-", "--agent", "w", "--epoch", "1", stdin=b"precious")
    for line in ("om consume x --agent r >&-", "om --json consume x --agent r -o out >&-"):
        err = cli.run(shell=line, code=USAGE).stderr
        assert "stdout is closed" in err and "nothing was done" in err
    assert cli.json("show", "x")["state"] == "ready"


@MOTO_ONLY
def test_a_corrupt_shard_is_named_by_its_full_address(cli: Cli, store: om.ObjectStore) -> None:
    cli.run("init", "a")
    key = "job/shards/a.json"
    rawstore.put(store, key, b'{"schema_version": 0, "task_id": "job", "stage": "a"}')
    err = cli.json("claim", "--stage", "a", "--agent", "w", code=UNSUPPORTED)
    assert err["key"] == key and err["address"] == store.describe(key)
    assert err["message"].startswith(f"manifest object {store.describe(key)} is corrupt")
    assert "journal" not in err["message"]
    # status reports the rest, lists it (where it is, what to do), and exits 12 as well.
    damage = cli.json("status", code=UNSUPPORTED)
    assert (damage["key"], damage["address"]) == (key, store.describe(key))
    assert "shard: " in damage["message"] and "objmanifest repair" in damage["message"]
    human = cli.run("status", code=UNSUPPORTED)
    assert store.describe(key) in human.out and "objmanifest repair" in human.out
    assert "stage" in human.out  # the report itself, before the error
    assert store.describe(key) in one_line(human.stderr)


@MOTO_ONLY
def test_status_flags_damage_and_repair_puts_the_index_back(
    cli: Cli, store: om.ObjectStore
) -> None:
    cli.run("init", "a", "b")
    cli.run("declare", "x", "--stage", "a")
    cli.run("declare", "y", "--stage", "b")
    store.delete("job/index.json")
    store.delete("job/shards/b.json")
    err = cli.run("declare", "x", "--stage", "b", code=UNSUPPORTED).stderr
    assert "lacks 'x', which shard 'a' holds" in err and "objmanifest repair" in err
    status = cli.json("status")
    assert [(n["file_id"], n["stage"]) for n in status["unindexed"]] == [("x", "a")]
    assert status["unfinished"] == []
    human = cli.run("status").out
    assert "damaged" in human and "objmanifest repair" in human
    repaired = cli.json("repair")  # the index is rebuilt from shard a; b left nothing
    assert repaired["added"] == ["x"]
    assert [(o["key"], o["action"]) for o in repaired["objects"]] == [("job/index.json", "rebuilt")]
    cli.run("declare", "y", "--stage", "b")  # y is lost with its shard: declared again
    assert cli.json("status")["unindexed"] == []
    assert cli.run("declare", "x", "--stage", "b", code=9).stderr.count("\n") == 1


# -- uploads nobody records --------------------------------------------------------------------


class HoldingProxy(FaultProxy):
    """Holds the first request whose method and target match until ``release``; then
    answers it 503 without forwarding it (as if it never reached the store)."""

    def __init__(self, upstream_url: str, method: str, pattern: str) -> None:
        super().__init__(upstream_url)
        self.match = (method, re.compile(pattern))
        self.holding = threading.Event()
        self.released = threading.Event()
        self._taken = False

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        if not self._taken and method == self.match[0] and self.match[1].search(target):
            self._taken = True
            self.holding.set()
            self.released.wait(120)
            return 503, "Service Unavailable", [("Content-Length", "0")], b""
        return super()._forward(method, target, headers, body)


@MOTO_ONLY
@pytest.mark.parametrize(
    ("held", "left"),
    [
        ("PUT /.*/job/uploads/", 0),  # the upload state that records it: the upload is aborted
        ("PUT /.*/job/data/.*partNumber=1", 1),  # a part of a recorded upload: it stays
    ],
)
def test_a_put_stopped_by_sigterm_leaves_only_a_recorded_upload(
    cli: Cli, store: om.ObjectStore, held: str, left: int
) -> None:
    cli.run("init", "a")
    cli.run("declare", "big", "--stage", "a")
    cli.run("claim", "big", "--agent", "w")
    method, pattern = held.split(" ", 1)
    source = cli.cwd / "big.bin"
    source.write_bytes(os.urandom(6 * MiB))
    with (
        HoldingProxy(cli.env["AWS_ENDPOINT_URL"], method, pattern) as proxy,
        source.open("rb") as stdin,
    ):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "objmanifest",
                "--endpoint-url",
                proxy.endpoint_url,
                "put",
                "big",
                "-",
                "--agent",
                "w",
                "--epoch",
                "1",
                "--threshold",
                "1MiB",
                "--part-size",
                "5MiB",
            ],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cli.env,
            cwd=cli.cwd,
        )
        try:
            assert proxy.holding.wait(60), "the request to hold never came"
            proc.send_signal(signal.SIGTERM)
            time.sleep(1)
            proxy.released.set()  # a part in flight ends (503, sent again), then it stops
            out, err = proc.communicate(timeout=60)
        finally:
            proxy.released.set()
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    try:
        assert proc.returncode == INTERRUPTED, err
        assert err.decode() == "objmanifest: stopped by SIGTERM\n" and out == b""
        uploads = rawstore.multipart_uploads(store, "job/")
        assert len(uploads) == left
        if left:  # it is the one the upload state records, for the next holder to adopt
            state = json.loads(rawstore.get(store, "job/uploads/a/big.json"))
            assert (state["key"], state["upload_id"], state["status"]) == (*uploads[0], "open")
    finally:
        rawstore.abort_uploads(store, "job/")


# -- the README and the docs ---------------------------------------------------------------


def readme_quick_start() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    found = [b for b in blocks if "serve --detach" in b]
    assert len(found) == 1, "the README's command-line quick start uses `serve --detach`"
    return found[0]


REAL_AWS = {
    "AWS_ACCESS_KEY_ID": "AKIA-REAL-KEY",
    "AWS_SECRET_ACCESS_KEY": "real-secret",
    "AWS_SESSION_TOKEN": "real-session",
    "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9",  # where real requests would go: nothing
}


@pytest.mark.parametrize("shell", [{}, REAL_AWS], ids=["no-aws-settings", "real-aws-settings"])
def test_the_readme_quick_start_works_when_pasted(tmp_path: Path, shell: dict[str, str]) -> None:
    """Pasted into a shell with no AWS settings, or with real ones, the block runs to the
    end, talks to the server it started (never to AWS), and leaves nothing running."""
    block = readme_quick_start()
    assert "serve --stop" in block
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    env = {**clean_env(), **shell, "PATH": path}
    script = (
        "set -euo pipefail\n"
        # a safety net for this test only: the block stops its server itself
        "trap 'objmanifest serve --stop >/dev/null 2>&1 || true' EXIT\n"
        f"{block}\n"
        'echo "served by $AWS_ENDPOINT_URL"\n'
    )
    proc = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"served by http://127\.0\.0\.1:\d+", proc.stdout)
    assert (tmp_path / "a.json").read_bytes()
    assert "stopped the server" in proc.stdout
    pid = re.search(r"\(pid (\d+)\)", proc.stderr)
    assert pid is not None
    assert not running(int(pid.group(1)))


def running(pid: int) -> bool:
    """The process exists and is not a zombie (an init that does not reap leaves those)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_serve_detach_reports_a_server_that_cannot_start(tmp_path: Path) -> None:
    env = clean_env()
    with subprocess.Popen(
        [sys.executable, "-m", "objmanifest", "serve", "--detach"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as first:
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    exports = dict(line.removeprefix("export ").split("=", 1) for line in out.decode().splitlines())
    port = exports["AWS_ENDPOINT_URL"].rsplit(":", 1)[1]
    stop_env = {**env, "OBJMANIFEST_SERVE_PID": exports["OBJMANIFEST_SERVE_PID"]}
    try:
        busy = subprocess.run(
            [sys.executable, "-m", "objmanifest", "serve", "--detach", "--port", port],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert busy.returncode == 1 and busy.stdout == ""
        assert (
            busy.stderr == f"objmanifest: server error: cannot start moto: 127.0.0.1:{port} "
            "is already in use\n"
        )
    finally:
        stopped = subprocess.run(
            [sys.executable, "-m", "objmanifest", "serve", "--stop"],
            capture_output=True,
            text=True,
            env=stop_env,
            timeout=90,
        )
    assert stopped.returncode == 0 and "stopped the server" in stopped.stdout
    again = subprocess.run(
        [sys.executable, "-m", "objmanifest", "serve", "--stop"],
        capture_output=True,
        text=True,
        env=stop_env,
        timeout=30,
    )
    assert again.returncode == 0 and "already stopped" in again.stdout


def test_the_documented_layout_names_every_kind_of_key() -> None:
    """The bucket layout (docs/layout.md) has a line for every kind of key a task writes."""
    text = (ROOT / "docs" / "layout.md").read_text()
    layout = text[text.index("# Layout in the bucket") :]
    layout = layout[: layout.index("```", layout.index("```") + 3)]
    for key in (
        "task.json",
        "index.json",
        "shards/STAGE.json",
        "uploads/STAGE/FILE_ID.json",
        "data/STAGE/FILE_ID@EPOCH",
        "data/STAGE/FILE_ID@EPOCH~N",
        ".objmanifest-probe/",
    ):
        assert key in layout, key


def test_main_may_be_called_from_a_thread(capsys: pytest.CaptureFixture[str]) -> None:
    """Only the main thread may handle SIGTERM; from another thread a command still runs."""
    codes: list[int] = []
    args = ["--url", "s3://work/p", "--task", "t", "init", "a", "--lease", "0"]
    thread = threading.Thread(target=lambda: codes.append(main(args)))
    thread.start()
    thread.join(30)
    assert codes == [USAGE]
    assert "lease_seconds must be" in capsys.readouterr().err


CREDENTIAL = "PW-sEcReT-41x"


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (("--endpoint-url", f"http://user:{CREDENTIAL}@127.0.0.1:9"), {}, "carries user info"),
        (("--endpoint-url", f"https://{CREDENTIAL}@s3.example.com"), {}, "carries user info"),
        (("--endpoint-url", f"ftp://u:{CREDENTIAL}@host"), {}, "carries user info"),
        (("--endpoint-url", f"http://h:9/?X-Amz-Signature={CREDENTIAL}"), {}, "invalid S3"),
        ((), {"AWS_ENDPOINT_URL": f"http://u:{CREDENTIAL}@h:9"}, "carries user info"),
        ((), {"AWS_ENDPOINT_URL_S3": f"http://u:{CREDENTIAL}@h:9"}, "carries user info"),
        (("--url", f"s3://AKIA:{CREDENTIAL}@work/p"), {}, "names no credentials"),
        (("--url", f"s3://{CREDENTIAL}@work"), {}, "names no credentials"),
        (("--url", f"s3://work/p?token={CREDENTIAL}"), {}, "no query"),
    ],
)
@pytest.mark.parametrize("json_out", [False, True])
def test_a_url_that_carries_a_credential_is_refused_without_showing_it(
    args: tuple[str, ...],
    env: dict[str, str],
    says: str,
    json_out: bool,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    given = ("--json",) if json_out else ()
    for command in (("status",), ("doctor",), ("claim", "--stage", "a", "--agent", "x")):
        code, out, err = in_process(
            capsys, *given, "--url", "s3://work/p", "--task", "t", *args, *command
        )
        assert code == USAGE, (command, out, err)
        assert CREDENTIAL not in out + err
        said = json.loads(err or out)["message"] if json_out else err
        assert says in said
        if says in ("carries user info", "names no credentials"):
            assert "AWS_ACCESS_KEY_ID" in said and "***@" in said


# -- the paths a newcomer tried ------------------------------------------------------------


@MOTO_ONLY
def test_input_read_whole_is_bounded_and_nesting_refused(cli: Cli, tmp_path: Path) -> None:
    cli.run("init", "a")
    too_big = b"x" * (64 * MiB + 1)
    (tmp_path / "big").write_bytes(too_big)
    for args in (("declare", "--from", "big", "--stage", "a"), ("put-many", "--claims", "big")):
        err = (
            cli.run(*args, "--agent", "w", code=USAGE).stderr
            if args[0] == "put-many"
            else (cli.run(*args, code=USAGE).stderr)
        )
        assert "holds more than 64 MiB, the most read at once" in one_line(err)
    err = cli.run(shell="head -c 80M /dev/zero | om declare --from - --stage a", code=USAGE).stderr
    assert "--from stdin holds more than 64 MiB" in err
    err = cli.run(shell="om put-many --claims /dev/zero --agent w", code=USAGE).stderr
    assert "--claims '/dev/zero' holds more than 64 MiB" in err
    deep = b"[" * 100_000
    err = cli.run("declare", "--from", "-", "--stage", "a", stdin=deep, code=USAGE).stderr
    assert "is nested too deeply to read" in one_line(err)
    claims = b'{"claims": ' + b"[" * 100_000
    err = cli.run("put-many", "--claims", "-", "--agent", "w", stdin=claims, code=USAGE).stderr
    assert "is nested too deeply to read" in one_line(err)
    long_id = b"y" * (10 * MiB) + b"\n"
    err = cli.run("declare", "--from", "-", "--stage", "a", stdin=long_id, code=USAGE).stderr
    assert "it is longer than 512 bytes" in one_line(err) and len(err) < 1000
    assert cli.json("status")["totals"]["pending"] == 0


@MOTO_ONLY
def test_log_since_past_year_one_and_unbounded_waits_are_usage_errors(cli: Cli) -> None:
    cli.run("init", "a")
    for since in ("99999999d", "9" * 400 + "d"):
        err = cli.run("log", "--since", since, code=USAGE).stderr
        assert "reaches back more than 1000 years: give a duration of at most 365250d" in one_line(
            err
        )
    assert cli.run("log", "--since", "1d").code == 0
    for value in ("-1", "0", "0.01", "nan", "inf", "3601"):
        err = cli.run("log", "--follow", "--interval", value, code=USAGE).stderr
        assert f"must be from 0.05 to 3600 seconds, not '{value}'" in err
    err = cli.run("wait", "--timeout", "inf", code=USAGE).stderr
    assert "--timeout: must be a finite number of seconds, 0 or more, not 'inf'" in err
    for args in (
        ("archive", "--older-than", "inf"),
        ("claim", "x", "--agent", "w", "--wait", "inf"),
    ):
        err = cli.run(*args, code=USAGE).stderr
        assert "finite number of seconds" in err


@MOTO_ONLY
def test_empty_logs_say_why_and_a_backoff_is_named_when_nothing_is_claimable(
    cli: Cli,
) -> None:
    cli.run("init", "a", "--retry-backoff", "600", "--lease", "600")
    cli.run("declare", "f0", "--stage", "a")
    assert cli.run("log", "--by", "nobody").out == "no journal records match --by nobody\n"
    since = cli.run("log", "--since", "2030-01-01").out
    assert since == "no journal records match --since 2030-01-01\n"
    assert cli.run("log", "f0", "--by", "nobody").out == (
        "no journal records for f0 match --by nobody\n"
    )
    assert "migrate" not in since
    cli.run("claim", "f0", "--agent", "w")
    cli.run("fail", "f0", "flaky", "--agent", "w", "--epoch", "1")
    err = cli.run("claim", "--stage", "a", "--agent", "w", code=CLAIM).stderr
    assert "1 failed entry waits out a retry backoff ('f0' is claimable again at " in err


@MOTO_ONLY
def test_serve_refuses_a_bad_bucket_name_before_it_starts(cli: Cli) -> None:
    for bucket in ("Bad Bucket!", "b", "UPPER", "-x-", "a" * 64):
        err = cli.run("serve", f"--bucket={bucket}", code=USAGE).stderr
        assert "is not a bucket name S3 accepts" in one_line(err), bucket
        assert "Error" not in err  # no SDK exception


def test_serve_detach_works_beside_a_folder_named_objmanifest(tmp_path: Path) -> None:
    """A checkout named ``objmanifest`` in the directory ``serve --detach`` runs from must
    not be imported by the server it starts."""
    shadow = tmp_path / "objmanifest"
    shadow.mkdir()
    (shadow / "pyproject.toml").write_text('[project]\nname = "objmanifest"\n')
    script = Path(sys.executable).parent / "objmanifest"  # as a user runs it: the script
    env = clean_env()
    started = subprocess.run(
        [str(script), "--json", "serve", "--detach", "--backend", "moto"],
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr.decode()
    info = json.loads(started.stdout)
    try:
        assert info["endpoint_url"].startswith("http://127.0.0.1:")
    finally:
        stop_env = {**env, "OBJMANIFEST_SERVE_PID": str(info["serve_pid"])}
        stopped = subprocess.run(
            [str(script), "serve", "--stop"], env=stop_env, cwd=tmp_path, timeout=60
        )
        assert stopped.returncode == 0


@MOTO_ONLY
def test_doctor_on_a_missing_bucket_is_one_error(cli: Cli) -> None:
    err = cli.run("--url", "s3://no-such-bucket-here/p", "doctor", code=STORE).stderr
    assert one_line(err).startswith(
        "objmanifest: store error: bucket 'no-such-bucket-here' does not"
    )
    assert "create it first" in err and "Date header" not in err
    assert "iam-policy" not in err and "IAM" not in err  # a missing bucket is no permission
    refused = cli.json("--url", "s3://no-such-bucket-here/p", "doctor", code=STORE)
    assert refused["error"] == "StoreError"
    gone = cli.run("--endpoint-url", "http://127.0.0.1:1", "doctor", code=STORE).stderr
    assert "no answer from http://127.0.0.1:1" in one_line(gone)
    assert "EndpointConnectionError" not in gone


@MOTO_ONLY
def test_repair_dry_run_names_a_corrupt_journal_block(cli: Cli, store: om.ObjectStore) -> None:
    cli.run("init", "a", "--lease", "600")
    cli.run("declare", "f", "--stage", "a")
    task = om.Task.open(store, "job")
    agent = task.agent("w")
    claim = agent.claim("f")
    assert claim is not None
    for _ in range(40):
        claim = agent.renew(claim)
    task.flush_journal()
    agent.renew(claim)
    (block,) = [k for k in rawstore.keys(store, "job/journal/shards/") if "-000000000032" in k]
    rawstore.put(store, block, b"\x00 not a block")
    err = cli.run("log", "f", code=UNSUPPORTED).stderr
    assert store.describe(block).startswith("s3://") and store.describe(block) in one_line(err)
    assert "objmanifest repair" in err
    dry = cli.run("repair", "--dry-run").out
    assert f"{block}: corrupt (not JSON" in dry and "would record as lost" in dry
    assert rawstore.get(store, block) == b"\x00 not a block"
    report = cli.json("repair")
    (obj,) = report["objects"]
    assert (obj["key"], obj["kind"], obj["action"]) == (block, "journal block", "recorded as lost")
    said = cli.run("log", "f").out
    assert "records 1..32 of job/shards/a.json were lost with a damaged journal block" in said
    assert "nothing is damaged" in cli.run("repair").out
