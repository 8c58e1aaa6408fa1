"""The structure ARCHITECTURE.md describes, checked on the code itself (no server needed).

* Layers: a module imports only from its own layer or the layers below it; each module's
  layer is its package's row in ARCHITECTURE.md's table (the one copy of the layers).
* Faces use the public API: a module above the public face imports, of the library below
  it, only public names (see ``test_a_face_imports_only_public_names``).
* ``Task`` and ``Agent`` offer exactly the members the API reference presents.
* No import cycle hidden behind ``TYPE_CHECKING``, no private name imported from another
  module.
* No import inside a function (one documented exception: the demo's run machinery).
* botocore and boto3 stay in the S3 store (and the tooling that starts local servers); the
  Azure SDK stays in the Azure store.
* Exceptions are defined in an ``errors.py`` only: the public tree at the root, each
  layer's own outcomes in its package (``store/errors.py``, ``wire/errors.py`` ...).
* Conditional updates of manifest objects are written by the CAS loop only.
* ``shard_index`` knows nothing of ``objmanifest``.
* ``objmanifest.aio`` makes no blocking call on its event loop.


* The core takes its threads, clock, sleeps, randomness and ids from its ``Runtime`` only.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import importlib
import re
import threading
import types
import uuid
from pathlib import Path

import pytest

import objmanifest as om
import objmanifest.errors as public_errors
from objmanifest.aio import AsyncAgent, AsyncTask
from objmanifest.store import errors as outcomes

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "objmanifest"


def layer_table() -> dict[str, int]:
    """The layer of each package (or root module), as ARCHITECTURE.md's code map gives it:
    its table's rows ``| N | `core/` ... |``, bottom to top."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    table = text[text.index("## Code map") : text.index("Module by module")]
    layers: dict[str, int] = {}
    for number, names in re.findall(r"^\| (\d+) \| ([^|]+) \|", table, re.MULTILINE):
        for name in re.findall(r"`([^`]+)`", names):
            layers[name.removesuffix("/").removesuffix(".py")] = int(number)
    return layers


LAYER = layer_table()
"""A module's package, the first part of its name below ``objmanifest``, decides its layer;
a package imports only its own modules and the packages below it."""

FUNCTION_IMPORTS = {
    ("objmanifest/demo/__init__.py", "main"),
    ("objmanifest/local/servers.py", "start_moto"),
}
"""Imports inside a function that are there on purpose, none of them to dodge a cycle: the
demo's run machinery (startup time of every other command) and moto (an optional extra).
The web server's framework and the MCP SDK (optional extras too) are imported by name, by
``cli.extras.load_extra``, as ``store.connect`` imports a cloud's SDK."""

BOTO_ALLOWED = {
    "objmanifest/store/s3.py",
    "objmanifest/store/s3_client.py",
    "objmanifest/store/s3_answers.py",
    "objmanifest/local/servers.py",
    "objmanifest/demo/target.py",
}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top(name: str) -> str:
    """``objmanifest.data.chunked.engine`` -> ``data``; ``objmanifest`` -> ``__init__``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported(path: Path) -> list[tuple[str, ast.AST]]:
    """Every objmanifest module ``path`` imports (relative imports resolved)."""
    return imported_source(path.read_text(), path)


def imported_source(source: str, path: Path) -> list[tuple[str, ast.AST]]:
    """Every objmanifest module ``source`` (the text of ``path``) imports."""
    tree = ast.parse(source)
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: list[tuple[str, ast.AST]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node) for a in node.names if a.name.startswith("objmanifest")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith("objmanifest"):
                continue
            if node.module is None or target == "objmanifest":
                found += [(f"{target}.{a.name}", node) for a in node.names]
            else:
                found.append((target, node))
    return found


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_module_has_a_layer() -> None:
    assert len(set(LAYER.values())) >= 10 and LAYER["core"] < LAYER["engine"] < LAYER["cli"]
    unknown = {top(module_name(p)) for p in modules()} - set(LAYER)
    assert unknown == set(), f"add these to ARCHITECTURE.md's layer table: {unknown}"


@pytest.mark.parametrize("path", modules(), ids=rel)
def test_imports_only_run_down(path: Path) -> None:
    mine = LAYER[top(module_name(path))]
    upward = []
    for target, node in imported(path):
        if target == "objmanifest":
            theirs = LAYER["__init__"]
        else:
            name = top(target)
            if name not in LAYER:  # ``from objmanifest import X`` where X is a name
                continue
            theirs = LAYER[name]
        if theirs > mine:
            upward.append(f"line {node.lineno}: {target} (layer {theirs} > {mine})")
    assert upward == [], f"{rel(path)} imports from a layer above it: {upward}"


@pytest.mark.parametrize("path", modules(), ids=rel)
def test_no_import_inside_a_function(path: Path) -> None:
    tree = ast.parse(path.read_text())
    inside = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    inside.append((rel(path), fn.name))
    assert [i for i in inside if i not in FUNCTION_IMPORTS] == []


@pytest.mark.parametrize("path", modules(), ids=rel)
def test_botocore_stays_in_the_s3_store(path: Path) -> None:
    text = path.read_text()
    uses = any(line.startswith(("import boto", "from boto")) for line in text.splitlines())
    assert not uses or rel(path) in BOTO_ALLOWED


AZURE_ALLOWED = {
    "objmanifest/store/azure.py",
    "objmanifest/store/azure_client.py",
    "objmanifest/store/azure_answers.py",
    "objmanifest/store/azure_blocks.py",
}


@pytest.mark.parametrize("path", modules(), ids=rel)
def test_the_azure_sdk_stays_in_the_azure_store(path: Path) -> None:
    lines = path.read_text().splitlines()
    uses = any(line.startswith(("import azure", "from azure")) for line in lines)
    assert not uses or rel(path) in AZURE_ALLOWED


# -- the faces use the public API -------------------------------------------------------------

FACE = LAYER["task"]
"""The public face's layer: ``Task``, ``Agent``, ``metrics`` and the package itself."""

PUBLIC_MODULES = ("objmanifest", "objmanifest.errors", "objmanifest.metrics")
"""Modules of the library a face may import whole; the packages above the public face (aio,
local, wire and the faces) are open to each other too."""

PUBLIC_TYPES = {
    "Shard": "Task.shard, Task.shards",
    "TaskHeader": "Task.header",
    "EntryNote": "TaskStatus.blocked, .overdue, .dead ...",
    "IndexNote": "TaskStatus.unfinished, .unindexed",
    "DamageNote": "TaskStatus.damaged",
    "Deleted": "Task.delete",
    "WaitPlan": "Task.wait_plan",
    "Source": "Agent.put",
    "Progress": "Agent.put, Agent.consume",
    "Repeating": "Runtime.every",
}
"""Types the public calls take or return that ``objmanifest.__all__`` does not name: a face
may import them from their modules to annotate with them (each is checked to be named by a
public signature or field)."""

FACE_TOOLS: dict[tuple[str, str | None], str] = {
    ("objmanifest.core.names", "check_file_id"): "a file id checked before it names a path "
    "(put-many --dir, the MCP server's --root)",
    ("objmanifest.core.settings", "check_settings"): "init checks its options before its "
    "first request (--exist-ok reads the task first)",
    ("objmanifest.core.settings", "check_retention"): "init, as above",
    ("objmanifest.core.settings", "check_timing"): "init compares --retry-backoff and "
    "--deadline with an existing task's, as create would take them",
    ("objmanifest.core.ages", "age_problem"): "archive --older-than, gc "
    "--consumed-older-than and log --since refuse an age past the API's bound before a "
    "request",
    ("objmanifest.core.ages", "AGE_RULE"): "log --since, as above",
    ("objmanifest.core.ages", "MAX_AGE_DAYS"): "log --since, as above",
    ("objmanifest.core.leases", "Renewer"): "the demo's worker holds its claim while it works",
    ("objmanifest.core.pacing", "Pace"): "a face's wait (aio's, --wait's) paces its looks as "
    "Task.wait does",
    ("objmanifest.core.layout", "resolve_partitions"): "init --exist-ok compares "
    "--partitions STAGE=auto with an existing task's, as create would take them",
    ("objmanifest.store", "PROBE_PREFIX"): "doctor: the probe of the store itself, no task",
    ("objmanifest.store", "access_policy"): "iam-policy prints the access policy of a URL",
    ("objmanifest.store", "access_needed"): "doctor names the permission a refused call "
    "lacked, in its cloud's terms",
    ("objmanifest.store", "without_credentials"): "the demo shows the URL or endpoint a user "
    "typed before it opens it",
    ("objmanifest.store.probe", "Check"): "doctor",
    ("objmanifest.store.probe", "ProbeReport"): "doctor",
    ("objmanifest.store.probe", "probe_store"): "doctor",
    ("objmanifest.core.plain", "jsonable"): "the faces' JSON shapes convert records to plain "
    "data as the library's reports do, one conversion for both",
}
"""What faces take from inside the library besides the public API, each with its reason:
the library's own rules for what a user types (one rule, one message, before a request),
the tools of the commands about the store itself (``doctor``, ``iam-policy``), and what
the demo holds a claim with."""


def face_modules() -> list[Path]:
    """Every module above the public face, and the face's own ``metrics``."""
    return [p for p in modules() if LAYER[top(module_name(p))] > FACE or p.stem == "metrics"]


def open_to(path: Path, target: str) -> bool:
    """Whether ``path`` may import the module ``target`` whole: a public module, or one of
    the packages above the public face (the face's own, aio, local, wire, other faces)."""
    if target in PUBLIC_MODULES:
        return True
    name = top(target)
    return name in LAYER and LAYER[name] > FACE and target != "objmanifest"


def library_imports(path: Path, source: str | None = None) -> list[tuple[str, str | None, int]]:
    """What ``path`` (or ``source``, as if it were at ``path``) imports of the library:
    (module, name, line), with name None for a module imported whole (``import
    objmanifest.x``, ``from objmanifest import wire``)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if top_level(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [base])])
            if not top_level(base):
                continue
            for alias in node.names:
                value = getattr(importlib.import_module(base), alias.name, None)
                if isinstance(value, types.ModuleType):
                    found.append((f"{base}.{alias.name}", None, node.lineno))
                else:
                    found.append((base, alias.name, node.lineno))
    return found


def top_level(module: str) -> bool:
    return module == "objmanifest" or module.startswith("objmanifest.")


def face_imports(path: Path, source: str | None = None) -> list[str]:
    """What ``path`` imports from inside the library that is not public: ``module.name``."""
    exported = {*om.__all__, "__version__"}
    found = []
    for module, name, line in library_imports(path, source):
        if open_to(path, module):
            continue
        if name is None:
            if (module, None) not in FACE_TOOLS:
                found.append(f"{module} (line {line})")
            continue
        value = getattr(importlib.import_module(module), name, None)
        public = name in exported and value is getattr(om, name, object())
        if not (public or name in PUBLIC_TYPES or (module, name) in FACE_TOOLS):
            found.append(f"{module}.{name} (line {line})")
    return found


@pytest.mark.parametrize("path", face_modules(), ids=rel)
def test_a_face_imports_only_public_names(path: Path) -> None:
    """A face (aio, local, wire, cli, web, mcp, demo, and metrics) imports, of the library
    below it, only the package itself and ``objmanifest.errors`` and ``objmanifest.metrics``
    whole, and from any other module only names of ``objmanifest.__all__`` (the same
    objects), the types public signatures name (``PUBLIC_TYPES``), or what ``FACE_TOOLS``
    lists with its reason. Nothing of ``engine``, ``cas``, ``journal``, ``data`` or ``ops``
    but the public names they define."""
    assert face_imports(path) == [], f"{rel(path)} reaches past the public API"


@pytest.mark.parametrize("path", face_modules(), ids=rel)
def test_a_face_uses_only_exported_names_of_the_package(path: Path) -> None:
    """``om.NAME`` in a face names something of ``objmanifest.__all__``."""
    tree = ast.parse(path.read_text())
    aliases = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
        if a.name == "objmanifest"
    }
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
    }
    dunders = {name for name in used if name.startswith("__")}
    assert used - dunders - set(om.__all__) == set(), rel(path)


def public_annotations() -> str:
    """The text of every annotation of the public API: signatures of the members of the
    classes ``objmanifest`` exports and of ``objmanifest.aio``, and their models' fields."""
    texts = []
    classes = [getattr(om, n) for n in om.__all__ if isinstance(getattr(om, n), type)]
    for cls in [*classes, AsyncTask, AsyncAgent]:
        for member in vars(cls).values():
            if isinstance(member, property):
                member = member.fget
            member = getattr(member, "__func__", member)
            texts += [str(a) for a in getattr(member, "__annotations__", {}).values()]
        for field in getattr(cls, "model_fields", {}).values():
            texts.append(str(field.annotation))
    return "\n".join(texts)


def test_the_public_types_a_face_may_import_are_named_by_the_public_api() -> None:
    text = public_annotations()
    unnamed = [name for name in PUBLIC_TYPES if not re.search(rf"\b{name}\b", text)]
    assert unnamed == []
    assert not set(PUBLIC_TYPES) & set(om.__all__)


def test_the_face_tools_are_still_used() -> None:
    """Each entry of ``FACE_TOOLS`` is imported by some face (an unused one is removed)."""
    used = {(module, name) for path in face_modules() for module, name, _ in library_imports(path)}
    assert set(FACE_TOOLS) <= used


def test_the_checker_sees_a_face_reaching_into_the_engine() -> None:
    planted = (
        "from ..engine.status import look\nfrom ..core.model import Entry, Shard\n"
        "from objmanifest.cas.policy import Codec\nimport objmanifest.journal.history\n"
        "from ..wire.shapes import iso\nfrom .. import Task, errors\n"
    )
    found = face_imports(PACKAGE / "web" / "planted.py", planted)
    assert [f.split(" ")[0] for f in found] == [
        "objmanifest.engine.status.look",
        "objmanifest.cas.policy.Codec",
        "objmanifest.journal.history",
    ]


REFERENCE = ROOT / "docs" / "reference.md"


def presented(name: str) -> set[str]:
    """The members the API reference presents for ``objmanifest.NAME``."""
    found = re.search(
        rf"::: objmanifest\.{name}\n    options:\n      members:\n((?:        - \w+\n)+)",
        REFERENCE.read_text(),
    )
    assert found, f"docs/reference.md lists no members of {name}"
    return set(re.findall(r"- (\w+)", found.group(1)))


def public_members(obj: object) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_task_and_agent_offer_exactly_the_members_the_reference_presents() -> None:
    """A helper made public on ``Task`` or ``Agent`` (on the class or on an object) is an
    API nobody documented: it fails here until the reference presents it (and aio has its
    twin), or it is made private."""
    store = om.MemoryStore("architecture", f"members-{uuid.uuid4().hex}")
    task = om.Task.create(store, "t", ["a"], lease_seconds=30)
    agent = task.agent("p")
    assert public_members(om.Task) == public_members(task) == presented("Task")
    assert public_members(om.Agent) == public_members(agent) == presented("Agent")


@pytest.mark.parametrize("path", modules(), ids=rel)
def test_no_import_cycle_hides_behind_type_checking(path: Path) -> None:
    """An import of the library under ``if TYPE_CHECKING:`` is a cycle the layers do not
    show (only third-party stubs may sit there)."""
    tree = ast.parse(path.read_text())
    hidden = [
        target
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in node.body
        for target, _ in imported_in(inner, path)
    ]
    assert hidden == [], rel(path)


def imported_in(node: ast.AST, path: Path) -> list[tuple[str, ast.AST]]:
    """The library modules the import ``node`` names (none if it is not one)."""
    if not isinstance(node, (ast.Import, ast.ImportFrom)):
        return []
    probe = ast.Module(body=[node], type_ignores=[])
    return [(t, n) for t, n in imported_source(ast.unparse(probe), path)]


def import_graph() -> dict[str, set[str]]:
    """Each module of the library -> the modules it imports at its top level (a package
    imported, or imported from, stands for its ``__init__``)."""
    known = {module_name(p) for p in modules()}
    graph: dict[str, set[str]] = {}
    for path in modules():
        tree = ast.parse(path.read_text())
        inside = {
            id(node)
            for fn in ast.walk(tree)
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(fn)
        }
        edges = set()
        for target, node in imported(path):
            if id(node) in inside:
                continue  # the documented optional extras, loaded when a command runs
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            edges.add(target)
        graph[module_name(path)] = edges - {module_name(path)}
    return graph


def test_no_module_imports_one_that_imports_it_back() -> None:
    """The modules of the library form no cycle (the engine's modules once imported
    ``Manifest`` back from the module that imported them)."""
    graph = import_graph()
    done: set[str] = set()

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for target in sorted(graph.get(module, ())):
            found = cycle_from(target, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    cycles = [c for m in sorted(graph) if (c := cycle_from(m, []))]
    assert cycles == []


PRIVATE_IMPORTS = {("objmanifest/core/operator_changes.py", "objmanifest.core.changes")}
"""``core.operator_changes`` shares the holder check and the entry update of ``core.changes`` (and
``scripts/mutants.py`` plants its bugs in them by name)."""


@pytest.mark.parametrize("path", modules(), ids=rel)
def test_no_private_name_is_imported_from_another_module(path: Path) -> None:
    private = [
        f"{target}.{alias.name}"
        for target, node in imported(path)
        if isinstance(node, ast.ImportFrom) and (rel(path), target) not in PRIVATE_IMPORTS
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert private == [], rel(path)


GCS_MODULES = {
    f"store/{name}.py"
    for name in ("gcs", "gcs_client", "gcs_answers", "gcs_uploads", "gcs_versions")
}
"""The only modules that see google-cloud-storage, google-auth, google-api-core or their
transport (``gcs_permissions.py`` needs none of them)."""


@pytest.mark.parametrize("path", modules(), ids=rel)
def test_the_gcs_sdk_stays_in_the_gcs_store(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported = [
        name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for name in (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
    ]
    uses = any(name.split(".")[0] in ("google", "google_crc32c") for name in imported)
    assert not uses or rel(path).removeprefix("objmanifest/") in GCS_MODULES


ERROR_MODULES = sorted(PACKAGE.rglob("errors.py"))
"""The public tree (``objmanifest/errors.py``) and each layer's own outcomes."""


def exception_names() -> set[str]:
    """Builtin exceptions and every class an ``errors.py`` defines."""
    names = {
        n
        for n in dir(builtins)
        if isinstance(getattr(builtins, n), type)
        and issubclass(getattr(builtins, n), BaseException)
    }
    for path in ERROR_MODULES:
        tree = ast.parse(path.read_text())
        names |= {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    return names


@pytest.mark.parametrize("path", modules(), ids=rel)
def test_exceptions_are_defined_in_errors_modules_only(path: Path) -> None:
    if path in ERROR_MODULES:
        return
    known = exception_names()
    tree = ast.parse(path.read_text())
    defined = [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(
            (isinstance(b, ast.Name) and b.id in known)
            or (isinstance(b, ast.Attribute) and b.attr in known)
            for b in node.bases
        )
    ]
    assert defined == [], f"{rel(path)} defines exceptions outside an errors.py: {defined}"


def test_the_public_tree_holds_only_errors_users_catch() -> None:
    """Store outcomes and the faces' own outcomes live with their layers, never in the
    public ``objmanifest.errors`` (whose classes all derive from ``ObjManifestError``)."""
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    public = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    outside = [n for n in public if not issubclass(getattr(public_errors, n), om.ObjManifestError)]
    assert outside == []


def test_store_outcomes_are_one_hierarchy_of_their_own() -> None:
    classes = [
        v
        for v in vars(outcomes).values()
        if isinstance(v, type) and v.__module__ == outcomes.__name__
    ]
    assert len(classes) >= 5
    assert all(issubclass(c, outcomes.StoreOutcome) for c in classes)
    assert not any(issubclass(c, om.ObjManifestError) for c in classes)


def test_the_faces_share_the_wire_and_mcp_never_imports_the_cli() -> None:
    for path in (PACKAGE / "mcp").rglob("*.py"):
        targets = [t for t, _ in imported(path)]
        assert not [t for t in targets if t.startswith("objmanifest.cli")], rel(path)


@pytest.mark.parametrize("path", modules(), ids=rel)
def test_only_the_cas_loop_writes_conditional_updates(path: Path) -> None:
    if rel(path) in ("objmanifest/cas/loop.py", "objmanifest/store/probe.py"):
        return
    text = path.read_text()
    store_module = rel(path).startswith("objmanifest/store/")
    assert "PutMode.update(" not in text or store_module


def test_shard_index_knows_nothing_of_objmanifest() -> None:
    for path in (ROOT / "shard_index").rglob("*.py"):
        assert "objmanifest" not in {t.split(".")[0] for t, _ in imported(path)}, rel(path)
        assert "import objmanifest" not in path.read_text()


# -- objmanifest.aio: no blocking call on the event loop -----------------------------------------

SYNC_OBJECTS = {"task", "agent", "store", "Task", "Agent", "Manifest"}
"""Names whose methods do I/O: the sync Task, Agent and store a coroutine wraps."""

PURE_ON_THE_LOOP = {"wait_plan", "shard_names"}
"""Methods of the sync task that only check arguments or build an error (no I/O)."""


def dotted(node: ast.AST) -> list[str]:
    """``self.task.entry`` -> ["self", "task", "entry"]; [] for anything else."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        inner = dotted(node.value)
        return [*inner, node.attr] if inner else []
    return []


def calls_on_the_loop(fn: ast.AsyncFunctionDef) -> list[ast.Call]:
    """The calls a coroutine's own body makes (not those of a lambda or nested function,
    which it hands to the executor)."""
    found: list[ast.Call] = []
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.Call):
            found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


def blocking_calls(source: str) -> tuple[list[str], int]:
    """Calls of the sync API made on the loop by the coroutines of ``source``, and how many
    calls they hand to the pool (``….run(...)`` / ``….settle(...)``, or a method made by
    ``in_pool(...)``, whose coroutine runs it in the pool)."""
    bad, pooled = [], 0
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.Call) and dotted(fn.func) == ["in_pool"]:
            pooled += 1
        if not isinstance(fn, ast.AsyncFunctionDef):
            continue
        for call in calls_on_the_loop(fn):
            name = dotted(call.func)
            if name[-1:] in (["run"], ["settle"]) and name[-2:-1] in (["_pool"], ["pool"]):
                pooled += 1
            elif SYNC_OBJECTS & set(name[:-1] or name) and name[-1] not in PURE_ON_THE_LOOP:
                bad.append(f"line {call.lineno}: {'.'.join(name)}() in {fn.name}")
    return bad, pooled


def test_the_checker_sees_a_sync_call_made_on_the_loop() -> None:
    planted = (
        "async def status(self):\n    return self.task.status()\n"
        "async def claim(self):\n    return await self._pool.run(lambda: self.agent.claim())\n"
        "async def put(self, claim):\n    return Agent.put(self.agent, claim)\n"
        "class AsyncAgent:\n    renew = in_pool(Agent.renew)\n"
    )
    bad, pooled = blocking_calls(planted)
    assert [b.split(" in ")[1] for b in bad] == ["status", "put"] and pooled == 2


def test_aio_coroutines_reach_the_sync_api_only_through_the_pool() -> None:
    bad, pooled = [], 0
    for path in sorted((PACKAGE / "aio").glob("*.py")):
        found, handed = blocking_calls(path.read_text())
        bad += [f"{rel(path)} {b}" for b in found]
        pooled += handed
    assert bad == [], f"objmanifest/aio blocks its event loop: {bad}"
    assert pooled >= 30  # every call of the API, handed over


def test_an_async_run_makes_no_store_call_on_the_loop_thread(tmp_path: Path) -> None:
    """Every store call of a round trip (create, declare, claim, put, put_many, consume,
    wait, status) is made from a pool thread, never the loop's."""
    store = om.MemoryStore("architecture", f"aio-{uuid.uuid4().hex}")
    threads: set[int] = set()
    store.faults.hooks.append(lambda op, key: threads.add(threading.get_ident()))

    async def main() -> int:
        async with await AsyncTask.create(store, "t", ["a"], lease_seconds=30) as task:
            await task.declare_many([(f"f{i}", "a") for i in range(3)])
            agent = task.agent("p")
            claim = await agent.claim("f0")
            assert claim is not None
            await agent.put(claim, b"x")
            await agent.put_many(await agent.claim_many("a", limit=2), [b"y", b"z"])
            await task.wait(["a"], timeout=30)
            assert await agent.consume("f0") == b"x"
            await agent.consume("f1", dest=tmp_path / "f1")
            await task.status()
            return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert threads and loop_thread not in threads


NONDETERMINISTIC = re.compile(
    r"\b(ThreadPoolExecutor|threading\.Thread|time\.sleep|time\.monotonic|time\.time"
    r"|uuid\.uuid4|random\.(random|uniform|choice|randint|shuffle))\b"
)
OUTSIDE_THE_CORE = (
    "objmanifest.core.runtime",
    "objmanifest.local",
    "objmanifest.wire.polling",
    "objmanifest.cli",
    "objmanifest.demo",
    "objmanifest.web",
    "objmanifest.mcp.stdio",
    "objmanifest.__main__",
)
"""The runtime itself, and what runs processes and servers rather than the protocol."""


def test_the_core_takes_threads_time_and_randomness_from_its_runtime() -> None:
    """Everything nondeterministic comes from ``store.runtime``, so a simulation replays a
    seed exactly (a pool of threads of its own in ``read_shards`` hung the simulation)."""
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in modules()
        if not any(
            module_name(path) == m or module_name(path).startswith(m + ".")
            for m in OUTSIDE_THE_CORE
        )
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if NONDETERMINISTIC.search(line)
    ]
    assert found == []


# -- the file list shows the architecture --------------------------------------------------

ROOT_MODULES = {"__init__", "__main__", "task", "agent", "errors", "metrics"}
"""The public face: everything else lives in a package named for its concern."""


def test_the_root_holds_only_the_public_face() -> None:
    found = {p.stem for p in PACKAGE.glob("*.py")}
    assert found <= ROOT_MODULES and len(found) <= 8, found - ROOT_MODULES


@pytest.mark.parametrize(
    "package",
    sorted(p.parent for top in (PACKAGE, ROOT / "shard_index") for p in top.rglob("__init__.py")),
    ids=rel,
)
def test_every_package_says_what_it_owns_and_what_it_must_never_do(package: Path) -> None:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
    assert doc and len(doc.split()) >= 8, f"{rel(package)}/__init__.py needs a docstring"
    assert re.search(r"\bnever\b", doc, re.IGNORECASE), (
        f"{rel(package)}/__init__.py: its docstring says what it owns; say what it must never do"
    )


def test_library_modules_stay_under_600_lines() -> None:
    long = {rel(p) for p in modules() if len(p.read_text().splitlines()) > 600}
    assert long == set(), f"split these by concern: {sorted(long)}"
