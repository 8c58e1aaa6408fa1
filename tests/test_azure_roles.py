"""Least privilege on Azure: the custom roles ``objmanifest iam-policy --url az://...`` prints
name exactly the data actions the code uses (derived from the SDK calls ``store/azure.py``
makes, read as a syntax tree), and their assignment conditions confine each action to the
paths the role's work needs (checked with a small evaluator of the condition's patterns)."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
from pathlib import Path

import pytest

from objmanifest.cli import main
from objmanifest.core.layout import TaskLayout
from objmanifest.errors import InvalidInput
from objmanifest.store import PROBE_PREFIX, access_needed, azure_roles
from objmanifest.store.azure_roles import ADD, DELETE, READ, WRITE
from objmanifest.store.azure_uploads import marker

STORE = Path(__file__).resolve().parent.parent / "objmanifest" / "store"
AZURE_PY = STORE / "azure.py"
BLOCKS_PY = STORE / "azure_blocks.py"
BASE_PY = STORE / "base.py"


def sdk_calls() -> dict[str, set[str]]:
    """AzureStore method -> the SDK calls it makes, through its own helpers and the
    multipart calls it hands to ``BlockUploads`` (``self.uploads.X``, through the methods
    it inherits from ``HandsOnUploads``; ``self.store.X``); ``put`` is ``Writes.put``, which
    hands its arguments to the store's ``write``."""
    classes = [
        ("AzureStore", "HandsOnUploads", BASE_PY),
        ("AzureStore", "AzureStore", AZURE_PY),
        ("BlockUploads", "BlockUploads", BLOCKS_PY),
    ]
    methods: dict[tuple[str, str], ast.FunctionDef] = {}
    for owner, defined_in, path in classes:
        tree = ast.parse(path.read_text())
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == defined_in)
        for node in cls.body:
            if isinstance(node, ast.FunctionDef):
                name = "put" if (owner, node.name) == ("AzureStore", "write") else node.name
                methods[owner, name] = node
    known = set(azure_roles.CLIENT_ACTIONS)
    other = {"AzureStore": ("uploads", "BlockUploads"), "BlockUploads": ("store", "AzureStore")}
    direct: dict[tuple[str, str], set[str]] = {}
    helpers: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for (owner, name), fn in methods.items():
        direct[owner, name], helpers[owner, name] = set(), set()
        attribute, peer = other[owner]
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute):
                target = node.value
                if isinstance(target, ast.Name) and target.id == "self":
                    if (owner, node.attr) in methods:
                        helpers[owner, name].add((owner, node.attr))
                elif (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                    and target.attr == attribute
                    and (peer, node.attr) in methods
                ):
                    helpers[owner, name].add((peer, node.attr))
                if node.attr in known:
                    direct[owner, name].add(node.attr)
            elif isinstance(node, ast.Name) and node.id in known:
                direct[owner, name].add(node.id)
    closed: dict[str, set[str]] = {}
    for key in methods:
        seen, todo, calls = {key}, [key], set()
        while todo:
            current = todo.pop()
            calls |= direct[current]
            for helper in helpers[current] - seen:
                seen.add(helper)
                todo.append(helper)
        if key[0] == "AzureStore":
            closed[key[1]] = calls
    return closed


def test_each_store_call_needs_exactly_the_data_actions_of_its_sdk_calls() -> None:
    calls = sdk_calls()
    public = {name for name, used in calls.items() if used and not name.startswith("_")}
    assert public == set(azure_roles.DATA_ACTIONS), "a store call without its data actions"
    for op in public:
        derived = set().union(*(azure_roles.CLIENT_ACTIONS[c] for c in calls[op]))
        assert derived == azure_roles.DATA_ACTIONS[op], op
    assert set().union(*calls.values()) == set(azure_roles.CLIENT_ACTIONS), "one is not used"


def allows(condition: str, action: str, path: str, listing: str | None = None) -> bool:
    """Whether ``condition`` allows ``action`` on ``path`` (a List Blobs with prefix
    ``listing`` when given): each parenthesised block says '!(guard) OR (allowed)'."""
    blocks = condition.split("\nAND\n")
    for block in blocks:
        guard, allowed = re.fullmatch(
            r"\(\n \(\n  !\((.*)\)\n \)\n OR\n \(\n  (.*)\n \)\n\)", block, re.S
        ).groups()  # type: ignore[union-attr]
        actions = set(re.findall(r"ActionMatches\{'([^']+)'\}", guard))
        if action not in actions:
            continue
        is_list = "AND SubOperationMatches{'Blob.List'}" in guard
        if "NOT SubOperationMatches" in guard and listing is not None:
            continue
        if is_list and listing is None:
            continue
        if not holds(allowed, path if listing is None else listing):
            return False
    return True


def holds(expression: str, value: str) -> bool:
    """The truth of an 'allowed' part: StringLike / StringStartsWith terms joined by OR, and
    at most one 'AND NOT (...)'."""
    positive, _, negative = expression.partition(" AND NOT ")

    def any_term(text: str) -> bool:
        for kind, pattern in re.findall(r"(StringLike|StringStartsWith) '([^']*)'", text):
            if kind == "StringStartsWith" and value.startswith(pattern):
                return True
            if kind == "StringLike" and fnmatch.fnmatchcase(value, pattern):
                return True
        return False

    return any_term(positive) and not (negative and any_term(negative))


def test_the_agent_may_write_and_delete_only_what_agents_do() -> None:
    agent = azure_roles.condition("jobs", "agent")
    layout = TaskLayout("t1")
    data = f"jobs/{layout.data('collect', 'raw/a.json', 3)}"
    shard = f"jobs/{layout.shard('collect')}"
    for path in (data, shard, f"jobs/{layout.header}", f"jobs/{marker('t1/x', 'a' * 24)}"):
        assert allows(agent, WRITE, path), path
        assert allows(agent, READ, path), path
    assert allows(agent, DELETE, data)
    assert allows(agent, DELETE, f"jobs/{PROBE_PREFIX}x")
    for path in (shard, f"jobs/{layout.header}", f"jobs/{layout.index}"):
        assert not allows(agent, DELETE, path), path
    # A file id that makes a shard key look like data is still not deletable.
    odd = f"jobs/{layout.upload_state('collect', 'data/x@1')}"
    assert fnmatch.fnmatchcase(odd, "jobs/*/data/*@*")
    assert not allows(agent, DELETE, odd)
    # Nothing outside the prefix, listing included.
    for action in (READ, WRITE, DELETE):
        assert not allows(agent, action, "other/t1/data/collect/x@1")
    assert allows(agent, READ, "", listing="jobs/t1/shards/")
    assert not allows(agent, READ, "", listing="other/")
    assert not allows(agent, READ, "", listing="")


def test_the_admin_may_do_anything_under_the_prefix_only() -> None:
    admin = azure_roles.condition("jobs", "admin")
    layout = TaskLayout("t1")
    for action in (READ, WRITE, ADD, DELETE):
        assert allows(admin, action, f"jobs/{layout.shard('collect')}")
        assert not allows(admin, action, f"jobsx/{layout.shard('collect')}")


def test_the_role_document_is_a_custom_role_scoped_to_the_container() -> None:
    document = azure_roles.policy("work", "jobs", "agent")
    definition = document["roleDefinition"]
    assert definition["IsCustom"] is True and definition["Actions"] == []
    assert set(definition["DataActions"]) == set().union(*azure_roles.DATA_ACTIONS.values())
    assert definition["AssignableScopes"][0].endswith("/blobServices/default/containers/work")
    assert document["conditionVersion"] == "2.0"
    assert set(document["dataActions"]) == set(definition["DataActions"])
    assert any("account key" in note for note in document["notConfined"])
    with pytest.raises(InvalidInput, match="cannot be written in an Azure role condition"):
        azure_roles.policy("work", "jo*bs", "agent")
    with pytest.raises(InvalidInput, match="unknown role"):
        azure_roles.policy("work", "jobs", "root")  # type: ignore[arg-type]


def test_a_refused_call_is_reported_with_the_data_actions_it_needs() -> None:
    said = azure_roles.needed("complete_upload", "az://work/jobs/t/data/s/f@1")
    for action in (READ, WRITE, ADD, DELETE):
        assert action in said
    assert "az://work/jobs/t/data/s/f@1" in said
    assert azure_roles.needed("get", "az://work/k").startswith(f"{READ} on az://work/k")


def test_the_cli_prints_the_azure_roles(capsys: pytest.CaptureFixture[str]) -> None:
    for role in ("agent", "admin"):
        for json_flag in ([], ["--json"]):
            argv = ["iam-policy", *json_flag, "--for", role, "--url", "az://work/jobs"]
            assert main(argv) == 0
            printed = json.loads(capsys.readouterr().out)
            assert printed == azure_roles.policy("work", "jobs", role)  # type: ignore[arg-type]
    assert main(["iam-policy", "--url", "az://Work/jobs"]) == 2
    assert "container name" in capsys.readouterr().err
    assert access_needed("put", "az://work/jobs/k") == azure_roles.needed("put", "az://work/jobs/k")
    assert access_needed("put", "file:///tmp/k") is None
