"""JSON form of the index, as stored in ``index.json``.

Entries are grouped by stage (``{"stages": {stage: {file_id: [deps]}}}``) so the stage name
is written once per shard, not once per entry. Output is deterministic (sorted keys and
lists, no spaces) so equal indexes are byte-equal and diffs between versions are small.
Input is checked strictly: a bad index is reported, never half-read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from shard_index.errors import IndexFormatError, UnsupportedIndexSchema
from shard_index.node import Node

SCHEMA_VERSION: Final = 2
"""2 adds the last commit ids and the journal of the newest versions (``Meta``); an index
at 1 is still read and written as 1 until its owner moves it on."""

_KEYS: Final = {
    1: frozenset({"schema_version", "version", "stages"}),
    2: frozenset({"schema_version", "version", "stages", "commits", "journal_id", "journal"}),
}


@dataclass(frozen=True)
class Meta:
    """What an index of schema 2 carries beside its entries, for the store that keeps it:
    its last commit ids, and its journal (an id, and JSON objects this package does not
    interpret)."""

    schema_version: int = SCHEMA_VERSION
    commits: tuple[str, ...] = ()
    journal_id: str = ""
    journal: tuple[Mapping[str, Any], ...] = ()


def encode(version: int, nodes: Mapping[str, Node], meta: Meta) -> bytes:
    """Serialise to compact, deterministic JSON bytes, at ``meta.schema_version``."""
    stages: dict[str, dict[str, list[str]]] = {}
    for file_id, node in nodes.items():
        stages.setdefault(node.stage, {})[file_id] = sorted(node.depends_on)
    document: dict[str, object] = {
        "schema_version": meta.schema_version,
        "version": version,
        "stages": stages,
    }
    if meta.schema_version >= 2:
        document.update(
            commits=list(meta.commits), journal_id=meta.journal_id, journal=list(meta.journal)
        )
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode("ascii")


def decode(data: bytes) -> tuple[int, dict[str, Node], Meta]:
    """Parse and check ``encode``'s output; return (version, nodes, meta)."""
    document = _load(data)
    if not isinstance(document, dict):
        raise IndexFormatError(f"index must be a JSON object, got {_kind(document)}")
    if "schema_version" not in document:
        raise IndexFormatError("index has no 'schema_version'")
    schema_version = document["schema_version"]
    if not _is_int(schema_version) or schema_version < 1:
        raise IndexFormatError(
            f"'schema_version' must be a positive integer, got {_show(schema_version)}"
        )
    # Checked before the shape: a newer schema may well have another shape.
    if schema_version > SCHEMA_VERSION:
        raise UnsupportedIndexSchema(schema_version, SCHEMA_VERSION)
    keys = _KEYS[schema_version]
    missing = sorted(keys - document.keys())
    if missing:
        raise IndexFormatError(f"index is missing {', '.join(map(repr, missing))}")
    unknown = sorted(document.keys() - keys)
    if unknown:
        raise IndexFormatError(f"index has unknown keys {', '.join(map(repr, unknown))}")
    version = document["version"]
    if not _is_int(version) or version < 0:
        raise IndexFormatError(f"'version' must be an integer >= 0, got {_show(version)}")
    meta = Meta(schema_version=schema_version)
    if schema_version >= 2:
        meta = _decode_meta(document)
    return version, _decode_stages(document["stages"]), meta


def _decode_meta(document: dict[str, Any]) -> Meta:
    commits, journal_id, journal = document["commits"], document["journal_id"], document["journal"]
    if not isinstance(commits, list) or not all(isinstance(c, str) and c for c in commits):
        raise IndexFormatError(f"'commits' must be a list of commit ids, got {_show(commits)}")
    if not isinstance(journal_id, str):
        raise IndexFormatError(f"'journal_id' must be a string, got {_show(journal_id)}")
    if not isinstance(journal, list) or not all(isinstance(r, dict) for r in journal):
        raise IndexFormatError(f"'journal' must be a list of objects, got {_show(journal)}")
    return Meta(2, tuple(commits), journal_id, tuple(journal))


def _load(data: bytes) -> object:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"index data must be bytes, got {type(data).__name__}")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IndexFormatError(f"index is not valid UTF-8: {exc}") from exc
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except IndexFormatError:
        raise
    except RecursionError:
        nested = "index is not valid JSON here: it is nested too deeply to read"
        raise IndexFormatError(nested) from None
    except ValueError as exc:
        raise IndexFormatError(f"index is not valid JSON: {exc}") from exc


def _decode_stages(stages: object) -> dict[str, Node]:
    if not isinstance(stages, dict):
        raise IndexFormatError(f"'stages' must be an object, got {_kind(stages)}")
    nodes: dict[str, Node] = {}
    for stage, entries in stages.items():
        if not stage:
            raise IndexFormatError("'stages' has an empty stage name")
        if not isinstance(entries, dict):
            raise IndexFormatError(f"stages[{stage!r}] must be an object, got {_kind(entries)}")
        for file_id, deps in entries.items():
            if not file_id:
                raise IndexFormatError(f"stages[{stage!r}] has an empty file id")
            if file_id in nodes:
                raise IndexFormatError(
                    f"file id {file_id!r} is in two stages: {nodes[file_id].stage!r} and {stage!r}"
                )
            nodes[file_id] = Node(stage, _decode_deps(stage, file_id, deps))
    return nodes


def _decode_deps(stage: str, file_id: str, deps: object) -> frozenset[str]:
    # The fast path checks everything at once; the message is built only on failure.
    if isinstance(deps, list) and all(isinstance(dep, str) and dep for dep in deps):
        result = frozenset(deps)
        if len(result) == len(deps):
            return result
    where = f"stages[{stage!r}][{file_id!r}]"
    if not isinstance(deps, list):
        raise IndexFormatError(f"{where} must be a list of file ids, got {_kind(deps)}")
    for position, dep in enumerate(deps):
        if not isinstance(dep, str) or not dep:
            raise IndexFormatError(
                f"{where}[{position}] must be a non-empty string, got {_show(dep)}"
            )
    raise IndexFormatError(f"{where} lists a dependency twice")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """Refuse duplicate keys, which json.loads would otherwise resolve silently."""
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise IndexFormatError(f"index has the key {key!r} twice in one object")
        result[key] = value
    return result


def _no_constant(name: str) -> object:
    raise IndexFormatError(f"index is not valid JSON: {name} is not allowed")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: object) -> str:
    """Name a JSON value's type the way the JSON text spells it."""
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names.update({list: "a list", dict: "an object"})
    return names.get(type(value), type(value).__name__)


def _show(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
