"""The structure ARCHITECTURE.md describes, checked on the code itself (no server needed).

* Layers: a module imports only from its own layer or the layers below it.
* No import inside a function (one documented exception: the demo's run machinery).
* botocore and boto3 stay in the S3 store (and the tooling that starts local servers).
* Exceptions are defined in ``errors.py`` only.
* Conditional updates of manifest objects are written by the CAS loop only.
* ``shard_index`` knows nothing of ``objmanifest``.
* The core takes its threads, clock, sleeps, randomness and ids from its ``Runtime`` only.
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "objmanifest"

LAYERS: list[tuple[str, ...]] = [
    ("errors", "runtime", "checksum", "events"),
    ("store",),
    ("model", "layout", "sources", "permissions"),
    ("cas", "codecs"),
    ("states", "leases", "changes", "verbs"),
    ("transfer", "uploads", "deletion"),
    ("effects", "history", "archive", "retention", "gc", "manifest", "repair"),
    ("agent", "task", "chunks", "metrics"),
    ("__init__", "servers", "styles"),
    ("cli", "demo", "web", "__main__"),
]
"""Bottom to top: the first part of a module's name below ``objmanifest`` decides its layer."""

LAYER = {name: n for n, names in enumerate(LAYERS) for name in names}

FUNCTION_IMPORTS = {
    ("objmanifest/demo/__init__.py", "main"),
    ("objmanifest/servers.py", "start_moto"),
    ("objmanifest/cli/web.py", "load_server"),
}
"""Imports inside a function that are there on purpose, none of them to dodge a cycle: the
demo's run machinery (startup time of every other command), moto and the web server's
framework (optional extras)."""

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
