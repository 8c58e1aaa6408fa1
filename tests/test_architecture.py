"""The structure ARCHITECTURE.md describes, checked on the code itself (no server needed).

* Layers: a module imports only from its own layer or the layers below it.
* No import inside a function (one documented exception: the demo's run machinery).
* botocore and boto3 stay in the S3 store (and the tooling that starts local servers).
* Exceptions are defined in ``errors.py`` only.
* Conditional updates of manifest objects are written by the CAS loop only.
* ``shard_index`` knows nothing of ``objmanifest``.
* ``objmanifest.aio`` makes no blocking call on its event loop.


* The core takes its threads, clock, sleeps, randomness and ids from its ``Runtime`` only.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import re
import threading
import uuid
from pathlib import Path

import pytest

import objmanifest as om
from objmanifest.aio import AsyncTask

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "objmanifest"

LAYERS: list[tuple[str, ...]] = [
    ("errors", "runtime", "checksum", "events"),
    ("store",),
    ("model", "layout", "sources", "permissions"),
    ("cas", "codecs"),
    ("states", "leases", "changes", "verbs"),
    ("transfer", "uploads", "deletion"),
    ("effects", "history", "archive", "retention", "gc", "manifest", "repair", "journal_repair"),
    ("agent", "task", "chunks", "metrics", "aio"),
    ("__init__", "servers", "styles"),
    ("cli", "demo", "web", "mcp", "__main__"),
]
"""Bottom to top: the first part of a module's name below ``objmanifest`` decides its layer."""

LAYER = {name: n for n, names in enumerate(LAYERS) for name in names}

FUNCTION_IMPORTS = {
    ("objmanifest/demo/__init__.py", "main"),
    ("objmanifest/servers.py", "start_moto"),
    ("objmanifest/cli/web.py", "load_server"),
    ("objmanifest/cli/mcp.py", "load_server"),
}
"""Imports inside a function that are there on purpose, none of them to dodge a cycle: the
demo's run machinery (startup time of every other command), moto, the web server's
framework and the MCP SDK (optional extras)."""

BOTO_ALLOWED = {"objmanifest/store/s3.py", "objmanifest/servers.py", "objmanifest/demo/target.py"}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top(name: str) -> str:
    """``objmanifest.uploads.engine`` -> ``uploads``; ``objmanifest`` -> ``__init__``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported(path: Path) -> list[tuple[str, ast.AST]]:
    """Every objmanifest module ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
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
    unknown = {top(module_name(p)) for p in modules()} - set(LAYER)
    assert unknown == set(), f"add these to LAYERS (and to ARCHITECTURE.md): {unknown}"


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


def exception_names() -> set[str]:
    """Builtin exceptions and every class ``errors.py`` defines."""
    names = {
        n
        for n in dir(builtins)
        if isinstance(getattr(builtins, n), type)
        and issubclass(getattr(builtins, n), BaseException)
    }
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    return names | {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


@pytest.mark.parametrize("path", modules(), ids=rel)
def test_exceptions_are_defined_in_errors_only(path: Path) -> None:
    if path == PACKAGE / "errors.py":
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
    assert defined == [], f"{rel(path)} defines exceptions outside errors.py: {defined}"


@pytest.mark.parametrize("path", modules(), ids=rel)
def test_only_the_cas_loop_writes_conditional_updates(path: Path) -> None:
    if rel(path) in ("objmanifest/cas.py", "objmanifest/store/probe.py"):
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

PURE_ON_THE_LOOP = {"_wait_plan", "_wait_timeout"}
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
    calls they hand to the pool (``….run(...)`` / ``….settle(...)``)."""
    bad, pooled = [], 0
    for fn in ast.walk(ast.parse(source)):
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
    )
    bad, pooled = blocking_calls(planted)
    assert [b.split(" in ")[1] for b in bad] == ["status", "put"] and pooled == 1


def test_aio_coroutines_reach_the_sync_api_only_through_the_pool() -> None:
    bad, pooled = blocking_calls((PACKAGE / "aio.py").read_text())
    assert bad == [], f"objmanifest/aio.py blocks its event loop: {bad}"
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
OUTSIDE_THE_CORE = ("runtime", "servers", "cli", "demo", "web", "__main__")
"""The runtime itself, and what runs processes and servers rather than the protocol."""


def test_the_core_takes_threads_time_and_randomness_from_its_runtime() -> None:
    """Everything nondeterministic comes from ``store.runtime``, so a simulation replays a
    seed exactly (a pool of threads of its own in ``read_shards`` hung the simulation)."""
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in modules()
        if top(module_name(path)) not in OUTSIDE_THE_CORE
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if NONDETERMINISTIC.search(line)
    ]
    assert found == []
