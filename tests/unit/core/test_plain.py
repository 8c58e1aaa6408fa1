"""How deep a JSON body nests, found before a parser that recurses is given it."""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from objmanifest.cas.codecs import IndexCodec, load_json
from objmanifest.core.plain import MAX_NESTING, nesting_bound
from objmanifest.errors import CorruptShard
from objmanifest.ops.replay import salvage
from objmanifest.store.file_io import MAGIC, parse_header

TRICKY = st.sampled_from(['a"[\\', "]]}", "x\\\\", '{["', "", "\\u005b", "é[", '\\"]'])
VALUES = st.recursive(
    st.none() | st.integers() | TRICKY | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(TRICKY | st.text(), inner, max_size=3)
    ),
    max_leaves=40,
)


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


def open_depth(text: str) -> int:
    """The most arrays and objects open at once anywhere in ``text`` (cut off or not), read
    character by character as a parser would."""
    open_now = deepest = 0
    inside = escaped = False
    for ch in text:
        if inside:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                inside = False
        elif ch == '"':
            inside = True
        elif ch in "[{":
            open_now += 1
            deepest = max(deepest, open_now)
        elif ch in "]}":
            open_now -= 1
    return deepest


@given(VALUES, st.booleans())
def test_the_bound_is_the_depth_of_well_formed_json(value: Any, ascii_only: bool) -> None:
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert nesting_bound(body) == depth(value)


@given(VALUES, st.floats(0, 1))
def test_a_cut_off_body_is_never_said_to_nest_less_than_it_does(value: Any, cut: float) -> None:
    text = json.dumps(value)
    prefix = text[: int(len(text) * cut)]
    assert nesting_bound(prefix.encode()) >= open_depth(prefix)


@pytest.mark.parametrize(
    "body",
    [b"[" * 50_000 + b"]" * 50_000, b"[" * 50_000, b'[{"a":' * 30_000, b'["]"' + b"[" * 200],
    ids=["balanced", "unclosed", "alternating", "after a string"],
)
def test_a_deep_body_is_past_the_limit(body: bytes) -> None:
    assert nesting_bound(body) > MAX_NESTING


@contextmanager
def collections_that_run_python() -> Iterator[list[str]]:
    """Collect garbage at every allocation, each collection running a few Python frames (as
    a finalizer does), and gather what could not be raised: a parser that recursed to the
    interpreter's limit would leave such frames no room."""
    unraised: list[str] = []

    def nested(n: int) -> int:
        return 0 if n == 0 else nested(n - 1)

    def collecting(phase: str, info: dict[str, int]) -> None:
        nested(5)

    hook, threshold = sys.unraisablehook, gc.get_threshold()
    sys.unraisablehook = lambda u: unraised.append(type(u.exc_value).__name__)
    gc.callbacks.append(collecting)
    gc.set_threshold(1)
    try:
        yield unraised
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(collecting)
        sys.unraisablehook = hook


DEEP = b'{"schema_version": 2, "a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"


@pytest.mark.parametrize(
    "read",
    [
        lambda: load_json("shards/s.json", DEEP, 2),
        lambda: IndexCodec().decode("index.json", DEEP),
        lambda: salvage(DEEP),
        lambda: parse_header(MAGIC + len(DEEP).to_bytes(4, "big") + DEEP),
    ],
    ids=["manifest object", "index", "journal salvage", "file store header"],
)
def test_a_deep_object_is_refused_before_any_parser_recurses(read: Callable[[], object]) -> None:
    with collections_that_run_python() as unraised:
        try:
            outcome = read()
        except CorruptShard as e:
            assert "nest more than 100 deep" in str(e)
        except ValueError as e:  # a file store's header: the store names the file
            assert "nested too deeply" in str(e)
        else:
            assert outcome == ([], False)
    assert unraised == []
