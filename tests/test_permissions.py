"""Least privilege: ``objmanifest iam-policy`` names exactly the S3 actions the code uses,
and agents and operators can do their work under their role's policy and no more.

Three ways: the actions each call of the storage seam needs are derived from the S3 requests
``store/s3.py`` sends (its source, read as a syntax tree); every call agents and operators
make while they work (recorded on a ``MemoryStore``) is judged against the policies by a
small IAM evaluator (wildcards, ``StringLike`` conditions, an explicit deny overriding an
allow); and the CLI prints the same documents docs/stores.md shows.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import objmanifest as om
from objmanifest.cli import main
from objmanifest.store import PROBE_PREFIX, permissions
from objmanifest.store.probe import probe_store
from tests.support.internals import engine
from tests.support.stores import ManualClock

ROOT = Path(__file__).resolve().parent.parent
S3_PY = ROOT / "objmanifest" / "store" / "s3.py"
MiB = 1024 * 1024

# -- the actions, from the code -----------------------------------------------------------------


def s3store_methods() -> dict[str, ast.FunctionDef]:
    """S3Store's methods by the store call each implements (``put`` is ``Writes.put``,
    which hands its arguments to the store's ``write``)."""
    tree = ast.parse(S3_PY.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "S3Store")
    return {
        "put" if n.name == "write" else n.name: n
        for n in cls.body
        if isinstance(n, ast.FunctionDef)
    }


def client_calls() -> dict[str, set[str]]:
    """S3Store method -> the boto3 client methods it uses, through its own helpers too
    (``self.client.X`` called or passed on, as ``partial(self.client.list_objects_v2)``); a
    call given a ``VersionId`` is a request of one version, ``X+VersionId``."""
    methods = s3store_methods()
    direct: dict[str, set[str]] = {}
    helpers: dict[str, set[str]] = {}
    for name, fn in methods.items():
        direct[name], helpers[name] = set(), set()
        versioned = set()
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and any(k.arg == "VersionId" for k in node.keywords)
            ):
                versioned.add(id(node.func))
                direct[name].add(f"{node.func.attr}+VersionId")
        for node in ast.walk(fn):
            if not isinstance(node, ast.Attribute) or id(node) in versioned:
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id == "self" and node.attr in methods:
                helpers[name].add(node.attr)  # self.helper
            elif (
                isinstance(owner, ast.Attribute)
                and isinstance(owner.value, ast.Name)
                and owner.value.id == "self"
                and owner.attr == "client"
                and node.attr != "meta"
            ):
                direct[name].add(node.attr)  # self.client.request
    closed: dict[str, set[str]] = {}
    for name in methods:
        seen, todo, calls = {name}, [name], set()
        while todo:
            current = todo.pop()
            calls |= direct[current]
            for helper in helpers[current] - seen:
                seen.add(helper)
                todo.append(helper)
        closed[name] = calls
    return closed


def test_each_store_call_needs_exactly_the_actions_of_the_requests_it_sends() -> None:
    calls = client_calls()
    public = {name for name, used in calls.items() if used and not name.startswith("_")}
    assert public == set(permissions.STORE_ACTIONS), "a store call without its actions"
    for op, used in calls.items():
        unknown = used - set(permissions.CLIENT_ACTIONS)
        assert unknown == set(), f"{op} sends {unknown}: add them to CLIENT_ACTIONS"
        if op in public:
            derived = {permissions.CLIENT_ACTIONS[c] for c in used}
            assert derived == permissions.STORE_ACTIONS[op], op
    everything = set().union(*calls.values())
    assert everything == set(permissions.CLIENT_ACTIONS), "CLIENT_ACTIONS names a request not sent"


def test_the_policies_name_exactly_the_actions_the_code_uses() -> None:
    used = set().union(*permissions.STORE_ACTIONS.values())
    admin = permissions.policy("work", "jobs", "admin")
    agent = permissions.policy("work", "jobs", "agent")
    assert permissions.actions(admin) == used
    # An agent never lists the bucket's uploads (S3 cannot scope that to a prefix), nor
    # reads the versions a versioned bucket keeps (repair does).
    admin_only = {"s3:ListBucketMultipartUploads", "s3:ListBucketVersions", "s3:GetObjectVersion"}
    assert permissions.actions(agent) == used - admin_only


# -- a small IAM evaluator --------------------------------------------------------------------


def pattern(text: str) -> re.Pattern[str]:
    """An IAM pattern: ``*`` any run of characters (``/`` too), ``?`` one, ``${*}`` a
    literal ``*`` (and ``${?}``, ``${$}``)."""
    out = []
    for token in re.findall(r"\$\{[*?$]\}|\*|\?|[^*?$]+|\$", text):
        if token.startswith("${"):
            out.append(re.escape(token[2]))
        elif token == "*":
            out.append(".*")
        elif token == "?":
            out.append(".")
        else:
            out.append(re.escape(token))
    return re.compile("".join(out), re.DOTALL)


def listify(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def applies(statement: dict[str, Any], action: str, resource: str, context: dict[str, str]) -> bool:
    if action not in statement["Action"]:
        return False
    if not any(pattern(r).fullmatch(resource) for r in listify(statement["Resource"])):
        return False
    for operator, keys in statement.get("Condition", {}).items():
        assert operator == "StringLike", operator
        for key, values in keys.items():
            if key not in context or not any(pattern(v).fullmatch(context[key]) for v in values):
                return False
    return True


def allowed(policy: dict[str, Any], action: str, resource: str, context: dict[str, str]) -> bool:
    statements = policy["Statement"]
    if any(s["Effect"] == "Deny" and applies(s, action, resource, context) for s in statements):
        return False
    return any(s["Effect"] == "Allow" and applies(s, action, resource, context) for s in statements)


BUCKET = "work"
PREFIX = "jobs"


def requests(op: str, key: str) -> Iterator[tuple[str, str, dict[str, str]]]:
    """The IAM checks one store call (``op`` on ``key``, relative to PREFIX) meets."""
    full = f"{PREFIX}/{key}"
    for action in sorted(permissions.STORE_ACTIONS[op]):
        if action in permissions.PREFIX_SCOPED:
            yield action, f"arn:aws:s3:::{BUCKET}", {"s3:prefix": full}
        elif action in permissions.BUCKET_ACTIONS:
            yield action, f"arn:aws:s3:::{BUCKET}", {}
        else:
            yield action, f"arn:aws:s3:::{BUCKET}/{full}", {}
    if op in ("get", "head", "open"):
        # For a missing key S3 answers 404 only to a caller that may list it (else 403).
        yield "s3:ListBucket", f"arn:aws:s3:::{BUCKET}", {"s3:prefix": full}


def refused(policy: dict[str, Any], calls: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    return [
        (op, key, action)
        for op, key in calls
        for action, resource, context in requests(op, key)
        if not allowed(policy, action, resource, context)
    ]


def test_the_evaluator_reads_wildcards_conditions_and_denials() -> None:
    agent = permissions.policy(BUCKET, PREFIX, "agent")
    data = f"arn:aws:s3:::{BUCKET}/{PREFIX}/job/data/collect/a@1"
    assert allowed(agent, "s3:DeleteObject", data, {})
    # A file id with a data/ segment and an @: its upload state matches */data/*@* too;
    # the denial is what keeps an agent from deleting it.
    state = f"arn:aws:s3:::{BUCKET}/{PREFIX}/job/uploads/collect/raw/data/a@1.json"
    assert allowed(agent, "s3:PutObject", state, {})
    assert not allowed(agent, "s3:DeleteObject", state, {})
    no_denial = {"Statement": [s for s in agent["Statement"] if s["Effect"] == "Allow"]}
    assert allowed(no_denial, "s3:DeleteObject", state, {})
    damaged = f"arn:aws:s3:::{BUCKET}/{PREFIX}/job/damaged/shards/a.json@20300101T000000Z"
    assert not allowed(agent, "s3:PutObject", damaged, {})
    bucket = f"arn:aws:s3:::{BUCKET}"
    assert allowed(agent, "s3:ListBucket", bucket, {"s3:prefix": f"{PREFIX}/"})
    assert not allowed(agent, "s3:ListBucket", bucket, {"s3:prefix": ""})
    assert not allowed(agent, "s3:ListBucket", bucket, {"s3:prefix": "jobsx/"})
    assert not allowed(agent, "s3:ListBucket", bucket, {})
    assert not allowed(agent, "s3:GetObject", f"arn:aws:s3:::{BUCKET}/other/x", {})


# -- agents and operators at work, judged by the policies --------------------------------------


@contextmanager
def recording(store: om.MemoryStore) -> Iterator[list[tuple[str, str]]]:
    calls: list[tuple[str, str]] = []

    def hook(op: str, key: str) -> None:
        calls.append((op, key))

    store.faults.hooks.append(hook)
    try:
        yield calls
    finally:
        store.faults.hooks.remove(hook)


def agents_at_work(store: om.MemoryStore, clock: ManualClock) -> om.Task:
    """Every agent command: create (with its probe), declare, claim, renew, put (one object
    and chunked), a fenced put, fail until dead, release, revive, undeclare, consume, the
    views, reap, and the doctor's whole probe."""
    task = om.Task.create(store, "job", stages=["collect", "write"], lease_seconds=60)
    task.declare("raw/data/a.csv", "collect")  # a file id with a data/ segment
    task.declare_many([("big", "collect"), ("c", "collect"), ("d", "collect"), ("e", "collect")])
    task.declare("out", "write", depends_on=["raw/data/a.csv"], consumers=["reviewer"])
    maker = task.agent("maker")
    claim = maker.claim("raw/data/a.csv")
    assert claim is not None
    maker.renew(claim)
    maker.put(claim, b"a,b\n1,2\n")
    claim = maker.claim("big")
    assert claim is not None
    maker.put(claim, b"x" * (11 * MiB), threshold=MiB, part_size=5 * MiB)
    # A holder stalls past its lease, is taken over, and comes back: fenced, its bytes go.
    stalled = maker.claim("c")
    assert stalled is not None
    clock.now += timedelta(seconds=120)
    other = task.agent("other").claim("c")
    assert other is not None
    with pytest.raises(om.LeaseLost):
        maker.put(stalled, b"late")
    task.agent("other").put(other, b"on time")
    # An entry failed until dead (its upload aborted), revived; another released.
    for _ in range(task.max_retries + 1):
        claim = maker.claim("d")
        assert claim is not None
        maker.fail(claim, "broken")
    task.revive("d")
    claim = maker.claim("e")
    assert claim is not None
    maker.release(claim)
    task.declare("gone", "collect")
    task.undeclare("gone")
    reader = task.agent("reader")
    reader.consume("raw/data/a.csv")
    reader.consume("big")
    claim = task.agent("w").claim("out")
    assert claim is not None
    task.agent("w").put(claim, b"report")
    task.agent("rev", role="reviewer").consume("out")
    clock.now += timedelta(seconds=120)
    task.agent("slow").claim("d")
    clock.now += timedelta(seconds=120)
    task.reap()
    task.status()
    task.entry("big")
    task.log()
    task.history("big")
    task.lineage("out")
    task.migrate()
    om.Task.list(store)
    om.Task.open(store, "job")
    assert probe_store(store, PROBE_PREFIX + "doctor").safe
    return task


def store_with(clock: ManualClock) -> om.MemoryStore:
    return om.MemoryStore(f"perm-{uuid.uuid4().hex[:8]}", PREFIX, clock=clock)


def test_agents_at_work_need_nothing_beyond_the_agent_policy() -> None:
    clock = ManualClock()
    store = store_with(clock)
    with recording(store) as calls:
        agents_at_work(store, clock)
    ops = {op for op, _ in calls}
    assert {"put", "get", "delete", "abort_upload", "upload_part", "open", "list"} <= ops
    deleted = [key for op, key in calls if op == "delete"]
    assert any("/data/collect/c@" in key for key in deleted), "no fenced bytes removed"
    assert refused(permissions.policy(BUCKET, PREFIX, "agent"), calls) == []


def admin_commands(task: om.Task) -> dict[str, Any]:
    """What only an operator runs, each a function of the task."""

    def repair(task: om.Task) -> None:
        task.store.put(engine(task).shard_key("write"), b"{not json")
        assert task.repair().objects

    def trim(task: om.Task) -> None:
        agent = task.agent("renewer")
        task.declare("r", "collect")
        claim = agent.claim("r")
        assert claim is not None
        for _ in range(70):
            agent.renew(claim)
        task.flush_journal()
        assert task.trim_journal(keep_versions=1)

    return {
        "gc": lambda t: t.gc(),
        "sweep_uploads": lambda t: t.sweep_uploads(),
        "archive": lambda t: t.archive(older_than=0),
        "trim": trim,
        "repair": repair,
        "delete": lambda t: t.delete(force=True),
    }


def test_operators_need_the_admin_policy_and_an_agent_cannot_do_their_work() -> None:
    agent_policy = permissions.policy(BUCKET, PREFIX, "agent")
    admin_policy = permissions.policy(BUCKET, PREFIX, "admin")
    clock = ManualClock()
    store = store_with(clock)
    task = agents_at_work(store, clock)
    clock.now += timedelta(days=2)
    needs: dict[str, list[tuple[str, str, str]]] = {}
    for name, command in admin_commands(task).items():
        with recording(store) as calls:
            command(task)
        assert calls, name
        assert refused(admin_policy, calls) == [], name
        needs[name] = refused(agent_policy, calls)
    assert all(needs.values()), [n for n, r in needs.items() if not r]
    kinds = {name: {action for _, _, action in refusals} for name, refusals in needs.items()}
    assert kinds["gc"] == kinds["sweep_uploads"] == {"s3:ListBucketMultipartUploads"}
    assert kinds["archive"] == {"s3:PutObject"}  # archive/
    # damaged/, and the versions a versioned bucket keeps of what it repairs
    assert kinds["repair"] == {"s3:PutObject", "s3:ListBucketVersions"}
    assert "s3:DeleteObject" in kinds["trim"] and "s3:DeleteObject" in kinds["delete"]


# -- the documents ------------------------------------------------------------------------------


def test_a_url_without_a_prefix_lists_the_bucket_and_wildcards_are_taken_literally() -> None:
    bare = permissions.policy("work", "", "agent")
    listing = bare["Statement"][0]
    assert listing["Resource"] == "arn:aws:s3:::work" and "Condition" not in listing
    assert "arn:aws:s3:::work/*/data/*@*" in bare["Statement"][3]["Resource"]
    odd = permissions.policy("work", "a*b/c?d/$x", "admin")
    assert odd["Statement"][0]["Condition"]["StringLike"]["s3:prefix"] == ["a${*}b/c${?}d/${$}x/*"]
    assert odd["Statement"][2]["Resource"] == ["arn:aws:s3:::work/a${*}b/c${?}d/${$}x/*"]
    resource = "arn:aws:s3:::work/a*b/c?d/$x/job/task.json"
    assert allowed(odd, "s3:PutObject", resource, {})
    assert not allowed(odd, "s3:PutObject", "arn:aws:s3:::work/aXb/cXd/$x/job/task.json", {})


def test_the_cli_prints_each_policy_and_the_docs_show_the_agents(capsys: Any) -> None:
    for role in ("agent", "admin"):
        assert main(["iam-policy", "--for", role, "--url", "s3://work/jobs"]) == 0
        assert json.loads(capsys.readouterr().out) == permissions.policy("work", "jobs", role)
        assert main(["iam-policy", "--json", "--for", role, "--url", "s3://work/jobs"]) == 0
        assert json.loads(capsys.readouterr().out) == permissions.policy("work", "jobs", role)
    assert main(["iam-policy", "--url", "memory://m/x"]) == 2
    assert "there is no cloud access policy for memory://m/x" in capsys.readouterr().err
    page = (ROOT / "docs" / "stores.md").read_text()
    shown = page.split("objmanifest iam-policy --url s3://work/jobs\n```\n\n```json\n")[1]
    assert json.loads(shown.split("\n```")[0]) == permissions.policy("work", "jobs", "agent")
