"""``objmanifest demo``: it runs end to end, and its verdict of "consistent" means something.

The end-to-end runs start real agent processes and a server, so they are ``heavy``. The
checks that decide the demo's exit code are also exercised on deliberately broken
manifests and files, so a green demo is not a rubber stamp.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import objmanifest as om
from objmanifest.cli.parser import parse
from objmanifest.core.model import Entry
from objmanifest.core.states import State
from objmanifest.demo import parser
from objmanifest.demo import plan as p
from objmanifest.demo.verify import Kill, check_all_consumed, check_manifest
from objmanifest.local import servers
from objmanifest.local.fakegcs import start_fakegcs
from tests.support.stores import backend_names, running

SMALL = ["--files", "6", "--big-mib", "12", "--agents", "2"]
ROOT = Path(__file__).resolve().parent.parent


def run_demo(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "objmanifest.demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


# -- the demo end to end -----------------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.parametrize("backend", ["seaweedfs", "moto"])
def test_demo_runs_consistent(backend: str) -> None:
    done = run_demo(*SMALL, "--backend", backend, "--json")
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    summary = json.loads(done.stdout)
    assert summary["ok"] is True and summary["problems"] == []
    assert summary["backend"] == backend

    entries = summary["entries"]
    assert entries["total"] == 12  # 6 collected, 2 batches + archive, 3 verdicts
    assert entries["states"]["consumed"] == 12
    assert entries["by_stage"]["collect"]["consumed"] == 6
    assert entries["before_audit"]["dead"] == 0

    killed = summary["killed"]
    assert killed["agent"] == "writer-victim" and killed["file_id"] == "out/batch-00"
    [takeover] = summary["takeovers"]
    assert takeover["file_id"] == "out/batch-00"
    assert takeover["agent"] != "writer-victim"
    assert takeover["epoch"] > killed["epoch"]
    assert summary["retries"] >= 1

    assert summary["checksums"] == {"verified": 12, "mismatches": 0}
    big = summary["bytes"]["large_file"]
    assert big["size"] == 12 * p.MiB
    assert big["chunked"] is True and big["parts"] == 2  # 12 MiB in 8 MiB parts
    assert summary["bytes"]["uploaded"] >= 12 * p.MiB
    assert summary["bytes"]["verified"] == summary["bytes"]["uploaded"]
    assert summary["commits"] > 0

    agents = {a["name"]: a for a in summary["agents"]}
    assert agents["writer-victim"]["killed"] is True
    assert all(a["exit_code"] == 0 for n, a in agents.items() if n != "writer-victim")
    assert servers.LOCAL_SECRET_KEY not in done.stdout + done.stderr
    assert "SIGKILL writer-victim" in done.stderr  # progress goes to stderr with --json


@pytest.mark.heavy
def test_demo_runs_on_a_directory_given_by_url_and_removes_its_objects(tmp_path: Path) -> None:
    """``--url file:///DIR``: no server at all; the run's objects go afterwards, and
    ``$OBJMANIFEST_URL`` (another store of the caller's) is not taken for ``--url``."""
    root = tmp_path / "store"
    root.mkdir()
    other = tmp_path / "not-this-one"
    tiny = ["--files", "3", "--big-mib", "9", "--agents", "1", "--work-ms", "0", "--json"]
    done = run_demo(*tiny, "--url", f"file://{root}", env={"OBJMANIFEST_URL": f"file://{other}"})
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    summary = json.loads(done.stdout)
    assert summary["ok"] is True and summary["backend"] == "file"
    assert summary["url"] == f"file://{root}" and summary["endpoint_url"] is None
    assert summary["bytes"]["large_file"]["parts"] == 2  # 9 MiB in 8 MiB parts
    assert os.listdir(root) == [".objmanifest"]  # the run's task is gone
    assert not other.exists()


@pytest.mark.heavy
@pytest.mark.azure
@pytest.mark.skipif(
    "azurite" not in backend_names(), reason="OBJMANIFEST_TEST_BACKENDS does not name azurite"
)
def test_demo_runs_consistent_on_azure_given_by_url() -> None:
    """``--url az://...``: the pipeline on Azurite's container, a chunked large file among
    its blocks, the run's objects removed after, the account key never shown."""
    server = running("azurite")
    url = f"az://{server.bucket}/demo-{uuid.uuid4().hex[:8]}"
    done = run_demo(*SMALL, "--url", url, "--json", env=server.env)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    summary = json.loads(done.stdout)
    assert summary["ok"] is True and summary["backend"] == "az" and summary["url"] == url
    assert summary["checksums"] == {"verified": 12, "mismatches": 0}
    big = summary["bytes"]["large_file"]
    assert big["chunked"] is True and big["parts"] == 2  # 12 MiB in 8 MiB parts
    store = om.connect(url)
    assert list(store.list("")) == [] and list(store.list_uploads("")) == []
    key = server.env["AZURE_STORAGE_CONNECTION_STRING"].split("AccountKey=")[1].split(";")[0]
    assert key not in done.stdout + done.stderr


def test_a_url_the_demo_cannot_open_is_one_clear_error(tmp_path: Path) -> None:
    done = run_demo("--url", f"file://{tmp_path}/missing", timeout=60)
    assert done.returncode != 0
    assert (
        "cannot use the store --url names" in done.stderr and f"{tmp_path}/missing" in done.stderr
    )
    assert "does not exist" in done.stderr and "Traceback" not in done.stderr
    # A URL with a credential in it is refused without showing the credential.
    done = run_demo("--url", "s3://someone:S3cretKey@bucket/x", timeout=60)
    assert done.returncode == 2 and "user info" in done.stderr
    assert "S3cretKey" not in done.stdout + done.stderr


@pytest.mark.heavy
def test_demo_plain_output_ends_with_verdict() -> None:
    tiny = ["--files", "3", "--big-mib", "1", "--agents", "1", "--work-ms", "0"]
    done = run_demo(*tiny, "--backend", "moto")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SIGKILL writer-victim" in done.stdout
    assert "took over out/batch-00" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("OK:")


@pytest.mark.heavy
def test_demo_runs_consistent_on_gcs_given_by_url() -> None:
    """``--url`` runs the same pipeline on a store of another scheme (GCS on fake-gcs-server
    here), its endpoint from the scheme's own variable; the run's objects are removed."""
    with start_fakegcs() as local:
        local.create_bucket("demo-bucket")
        env = {"STORAGE_EMULATOR_HOST": local.endpoint_url}
        done = run_demo(*SMALL, "--url", "gs://demo-bucket/runs", "--json", env=env)
        assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        summary = json.loads(done.stdout)
        assert summary["ok"] is True and summary["problems"] == []
        assert (summary["backend"], summary["url"]) == ("gs", "gs://demo-bucket/runs")
        assert summary["checksums"] == {"verified": 12, "mismatches": 0}
        big = summary["bytes"]["large_file"]
        assert big["chunked"] is True and big["parts"] == 2
        assert summary["takeovers"][0]["file_id"] == "out/batch-00"
        left = om.connect("gs://demo-bucket/runs", endpoint_url=local.endpoint_url)
        assert list(left.list("")) == [] and list(left.list_uploads("")) == []


def test_a_url_the_demo_cannot_use_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    done = run_demo("--url", "memory://x/y", *SMALL, timeout=120)
    assert done.returncode == 2 and "processes of their own" in done.stderr
    unreachable = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{servers.free_port()}"}
    done = run_demo("--url", "gs://demo-bucket/x", *SMALL, env=unreachable, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "cannot use the store --url names" in done.stderr and "gs://demo-bucket" in done.stderr
    assert "Traceback" not in done.stderr
    # $OBJMANIFEST_URL, every other command's store, never sends the demo elsewhere.
    monkeypatch.setenv("OBJMANIFEST_URL", "gs://somewhere/else")
    assert parse(["demo"]).store_url is None
    assert parse(["demo", "--url", "gs://b/p"]).store_url == "gs://b/p"


def test_unreachable_endpoint_is_one_clear_error() -> None:
    secret = "do-not-print-this-secret"
    done = run_demo(
        "--endpoint-url",
        "http://127.0.0.1:9",
        *SMALL,
        env={"AWS_ACCESS_KEY_ID": "someone", "AWS_SECRET_ACCESS_KEY": secret},
        timeout=120,
    )
    assert done.returncode == 2
    assert "objmanifest demo:" in done.stderr and "Traceback" not in done.stderr
    assert secret not in done.stdout + done.stderr


def test_arguments_have_defaults_and_refuse_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    args = parser().parse_args([])
    assert (args.agents, args.files, args.big_mib, args.lease) == (3, 24, 48, 3.0)
    assert args.backend == "seaweedfs" and args.endpoint_url is None
    with pytest.raises(SystemExit, match=r"^2$"):  # argparse's usage error
        parser().parse_args(["--agents", "0"])
    assert (
        "argument --agents: must be a whole number of at least 1, not 0" in capsys.readouterr().err
    )


# -- the consistency checks catch inconsistency --------------------------------------------

PLAN = p.Plan(files=6, big_mib=1)
KILL = Kill(agent="writer-victim", file_id=PLAN.victim_target, epoch=1, at_seconds=2.0)


def finished_manifest() -> dict[str, Entry]:
    """A manifest as a good run leaves it: all consumed, the victim's entry taken over."""
    entries = {}
    for decl in PLAN.declarations():
        fid = decl["file_id"]
        taken = fid == KILL.file_id
        entries[fid] = Entry(
            file_id=fid,
            stage=decl["stage"],
            state=State.consumed,
            owner="writer-1" if taken else "someone",
            epoch=2 if taken else 1,
            retry_count=1 if taken else 0,
            checksum="xxh3-128:00",
            size=1,
            key=f"k/{fid}",
            depends_on=decl["depends_on"],
            consumers=decl["consumers"],
            consumed_by=decl["consumers"],
        )
    return entries


def broken(entries: dict[str, Entry], fid: str, **changes: Any) -> dict[str, Entry]:
    return {**entries, fid: entries[fid].model_copy(update=changes)}


def test_a_good_manifest_passes() -> None:
    assert check_manifest(finished_manifest(), PLAN, KILL) == []
    assert check_all_consumed(finished_manifest()) == []


@pytest.mark.parametrize(
    ("fid", "changes", "expected"),
    [
        ("raw/part-003", {"state": State.dead, "error": "retries exhausted"}, "ended dead"),
        ("out/batch-01", {"state": State.writing}, "ended writing"),
        ("out/batch-00", {"owner": "writer-victim"}, "finished by writer-victim"),
        ("out/batch-00", {"epoch": 1}, "not above the killed holder's epoch"),
        ("out/batch-00", {"retry_count": 0}, "retry_count 0"),
        ("out/batch-01", {"depends_on": ("raw/part-003",)}, "the plan says"),
        ("verdict/batch-01", {"checksum": None}, "without a checksum"),
    ],
)
def test_an_inconsistent_manifest_is_refused(
    fid: str, changes: dict[str, Any], expected: str
) -> None:
    problems = check_manifest(broken(finished_manifest(), fid, **changes), PLAN, KILL)
    assert any(expected in problem for problem in problems), problems


def test_missing_entries_and_a_missing_kill_are_refused() -> None:
    entries = finished_manifest()
    del entries["raw/part-005"]
    assert any("missing" in x for x in check_manifest(entries, PLAN, KILL))
    assert any("no agent was killed" in x for x in check_manifest(finished_manifest(), PLAN, None))
    left = broken(finished_manifest(), "raw/part-000", state=State.ready)
    assert check_all_consumed(left) == [
        "raw/part-000 is still ready after the audit (consumed by writer, auditor)"
    ]


def test_outputs_are_checked_against_their_inputs_and_holder(tmp_path: Path) -> None:
    deps = PLAN.depends_on("out/batch-01")
    inputs = {d: p.part_bytes(d) for d in deps}
    good = tmp_path / "good"
    p.write_batch(good, "out/batch-01", "writer-2", 3, inputs)
    read = p.inspect_file(good)
    assert p.check_output("out/batch-01", deps, read, ("writer-2", 3)) == []

    # Made by another holder than the one the manifest names.
    assert p.check_output("out/batch-01", deps, read, ("writer-1", 2))
    # An input that was not the finished data (e.g. read before it was complete).
    stale = dict(inputs)
    stale[deps[0]] = inputs[deps[0]][:100]
    bad = tmp_path / "bad"
    p.write_batch(bad, "out/batch-01", "writer-2", 3, stale)
    problems = p.check_output("out/batch-01", deps, p.inspect_file(bad), ("writer-2", 3))
    assert any("was not the finished data" in x for x in problems)
    # A byte flipped in the body.
    flipped = bytearray(good.read_bytes())
    flipped[-1] ^= 1
    (tmp_path / "flip").write_bytes(bytes(flipped))
    problems = p.check_output(
        "out/batch-01", deps, p.inspect_file(tmp_path / "flip"), ("writer-2", 3)
    )
    assert any("differs from the expected" in x for x in problems)


def test_archive_and_verdict_checks(tmp_path: Path) -> None:
    deps = PLAN.depends_on(p.ARCHIVE)
    archive = tmp_path / "archive"
    p.write_archive(archive, "writer-3", 1, {d: p.part_bytes(d) for d in deps}, p.MiB + 5)
    read = p.inspect_file(archive)
    assert p.check_output(p.ARCHIVE, deps, read, ("writer-3", 1), p.MiB + 5) == []
    assert p.check_output(p.ARCHIVE, deps, read, ("writer-3", 1), p.MiB)  # wrong size

    verdict = tmp_path / "verdict"
    fid = p.verdict_of(p.ARCHIVE)
    p.write_verdict(verdict, fid, "checker-1", 1, p.ARCHIVE, read, [], 1)
    vread = p.inspect_file(verdict)
    assert p.check_verdict(fid, vread, ("checker-1", 1), read.file_sha256) == []
    assert p.check_verdict(fid, vread, ("checker-1", 1), "0" * 64)  # checked other bytes
    p.write_verdict(verdict, fid, "checker-1", 1, p.ARCHIVE, read, ["bad input"], 1)
    problems = p.check_verdict(fid, p.inspect_file(verdict), ("checker-1", 1), read.file_sha256)
    assert any("the checker found problems" in x for x in problems)


def test_plan_shape() -> None:
    plan = p.Plan(files=7, big_mib=1)
    assert list(plan.batches) == ["out/batch-00", "out/batch-01", "out/batch-02"]
    assert plan.batches["out/batch-02"] == ("raw/part-006",)
    assert len(plan.declarations()) == len(set(plan.all_ids)) == 7 + 4 + 4
    assert p.part_bytes("raw/part-001") == p.part_bytes("raw/part-001")
    with pytest.raises(ValueError, match="the demo needs at least 3 files, not 2"):
        p.Plan(files=2, big_mib=1)
