"""Tests for the cross-shard dependency index (shard_index)."""

from __future__ import annotations

import itertools
import json
import pickle
import re
from collections.abc import Iterable, Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shard_index.errors as shard_index_errors
from shard_index import (
    DeclarationConflict,
    DependencyCycle,
    IndexFormatError,
    Meta,
    Node,
    ShardIndex,
    ShardIndexError,
    UnsupportedIndexSchema,
)

# A graph is {file_id: (stage, deps)}; deps may name ids that are never declared.
Graph = dict[str, tuple[str, frozenset[str]]]
Decl = tuple[str, str, Iterable[str]]

STAGES = ("collect", "transform", "write")
UNDECLARED = ("ext0", "ext1", "ext2")

PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# ------------------------------------------------------------------ reference model


def reaches(graph: Mapping[str, tuple[str, frozenset[str]]], src: str, dst: str) -> bool:
    """Whether ``src`` depends, directly or not, on ``dst`` (path of length >= 1)."""
    seen: set[str] = set()
    stack = list(graph[src][1]) if src in graph else []
    while stack:
        node = stack.pop()
        if node == dst:
            return True
        if node in seen:
            continue
        seen.add(node)
        if node in graph:
            stack.extend(graph[node][1])
    return False


def has_cycle(graph: Mapping[str, tuple[str, frozenset[str]]]) -> bool:
    return any(reaches(graph, node, node) for node in graph)


def assert_is_cycle(cycle: list[str], graph: Mapping[str, tuple[str, frozenset[str]]]) -> None:
    """Every step of the reported cycle is a real edge, and it closes."""
    assert cycle, "empty cycle"
    assert len(set(cycle)) == len(cycle), f"cycle repeats a node: {cycle}"
    for here, there in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
        assert here in graph, f"{here} is not declared"
        assert there in graph[here][1], f"{here} does not depend on {there}"


def assert_matches(index: ShardIndex, graph: Graph) -> None:
    """Compare every view of the index with a brute-force computation over ``graph``."""
    assert len(index) == len(graph)
    assert index.file_ids() == frozenset(graph)
    for stage in STAGES:
        assert index.file_ids(stage) == {f for f, (s, _) in graph.items() if s == stage}
    every_dep = {dep for _, deps in graph.values() for dep in deps}
    assert index.undeclared() == every_dep - graph.keys()
    for file_id, (stage, deps) in graph.items():
        assert file_id in index
        assert index.node(file_id) == Node(stage, deps)
        assert index.stage_of(file_id) == stage
        assert index.dependencies(file_id) == deps
        assert index.stages_needed(file_id) == {graph[d][0] for d in deps if d in graph}
    # Reverse edges are exactly the forward edges turned round.
    for file_id in graph.keys() | every_dep:
        expected = {src for src, (_, deps) in graph.items() if file_id in deps}
        assert index.dependents(file_id) == expected
    expected_edges = {
        (src, dep)
        for src, (stage, deps) in graph.items()
        for dep in deps
        if dep in graph and graph[dep][0] != stage
    }
    assert index.cross_shard_edges() == expected_edges


def build(graph: Graph) -> ShardIndex:
    return ShardIndex.empty().declare_many((f, s, d) for f, (s, d) in graph.items())


# ------------------------------------------------------------------------ strategies


@st.composite
def dags(draw: st.DrawFn, min_size: int = 0, max_size: int = 20) -> Graph:
    """A random DAG: ids get a hidden topological rank, edges only go to lower ranks."""
    size = draw(st.integers(min_size, max_size))
    names = draw(st.permutations([f"f{n}" for n in range(size)]))
    graph: Graph = {}
    for rank, name in enumerate(names):
        lower = st.sampled_from(names[:rank]) if rank else st.nothing()
        deps = draw(st.frozensets(lower | st.sampled_from(UNDECLARED), max_size=4))
        graph[name] = (draw(st.sampled_from(STAGES)), deps)
    return graph


@st.composite
def plans(draw: st.DrawFn, graph: Graph) -> list[list[Decl]]:
    """The graph's declarations in a random order, cut into random batches.

    Dependencies come as list, tuple, set or generator, and some declarations are repeated
    (identically), as restarting agents do.
    """
    order = draw(st.permutations(sorted(graph)))
    decls: list[Decl] = []
    for file_id in order:
        stage, deps = graph[file_id]
        copies = draw(st.integers(1, 2))
        for _ in range(copies):
            shape = draw(st.sampled_from(["list", "tuple", "set", "reversed"]))
            ordered = sorted(deps)
            as_given: Iterable[str] = {
                "list": ordered,
                "tuple": tuple(ordered),
                "set": set(ordered),
                "reversed": list(reversed(ordered)),
            }[shape]
            decls.append((file_id, stage, as_given))
    cuts = sorted(draw(st.sets(st.integers(1, max(len(decls) - 1, 1)), max_size=6)))
    bounds = [0, *[c for c in cuts if c < len(decls)], len(decls)]
    return [decls[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def apply(index: ShardIndex, batch: list[Decl]) -> ShardIndex:
    """Apply a batch, through ``declare`` when it holds one declaration."""
    if len(batch) == 1:
        return index.declare(*batch[0])
    return index.declare_many(batch)


# ------------------------------------------------------------------ property tests


@PROPERTY_SETTINGS
@given(data=st.data())
def test_acyclic_graph_in_any_order_and_batching_never_raises(data: st.DataObject) -> None:
    graph = data.draw(dags())
    batches = data.draw(plans(graph))
    index = ShardIndex.empty()
    declared: Graph = {}
    for batch in batches:
        before, before_version = index, index.version
        index = apply(index, batch)
        new = {f for f, _, _ in batch} - declared.keys()
        for file_id in new:
            declared[file_id] = graph[file_id]
        if new:
            assert index.version == before_version + 1
        else:
            assert index is before
        assert_matches(index, declared)
        # The older index is untouched by what came after it.
        assert before.version == before_version
    assert_matches(index, graph)


@PROPERTY_SETTINGS
@given(data=st.data())
def test_closing_a_cycle_always_raises(data: st.DataObject) -> None:
    graph = data.draw(dags(min_size=1))
    # Add one edge u -> v where v already reaches u (or v == u): that closes a cycle.
    names = sorted(graph)
    u = data.draw(st.sampled_from(names))
    candidates = [v for v in names if v == u or reaches(graph, v, u)]
    v = data.draw(st.sampled_from(candidates))
    stage, deps = graph[u]
    cyclic = {**graph, u: (stage, deps | {v})}
    assert has_cycle(cyclic)

    index = ShardIndex.empty()
    declared: Graph = {}
    for batch in data.draw(plans(cyclic)):
        after = {**declared, **{f: cyclic[f] for f, _, _ in batch}}
        snapshot = index.to_json()
        if has_cycle(after):
            with pytest.raises(DependencyCycle, match=r"^dependency cycle: ") as caught:
                apply(index, batch)
            assert_is_cycle(caught.value.cycle, after)
            assert caught.value.cycle[0] in {f for f, _, _ in batch}
            if len(caught.value.cycle) <= 20:
                path = " -> ".join([*caught.value.cycle, caught.value.cycle[0]])
                assert path in str(caught.value)
            # Atomic: nothing of the failed batch is visible.
            assert index.to_json() == snapshot
            assert_matches(index, declared)
            return
        index = apply(index, batch)
        declared = after
    pytest.fail("the cycle was never detected")


@PROPERTY_SETTINGS
@given(data=st.data())
def test_redeclaring_in_any_order_is_a_no_op(data: st.DataObject) -> None:
    graph = data.draw(dags())
    index = build(graph)
    version = index.version
    for batch in data.draw(plans(graph)):
        assert apply(index, batch) is index
    assert index.version == version


@PROPERTY_SETTINGS
@given(data=st.data())
def test_json_round_trip_and_determinism(data: st.DataObject) -> None:
    graph = data.draw(dags())
    plan = data.draw(plans(graph))
    index = ShardIndex.empty()
    for batch in plan:
        index = apply(index, batch)
    encoded = index.to_json()
    decoded = ShardIndex.from_json(encoded)
    assert decoded == index
    assert decoded.version == index.version
    assert decoded.to_json() == encoded
    assert_matches(decoded, graph)
    # Another declaration order and batching gives the same content; only the version (the
    # number of changes) may differ.
    other_plan = data.draw(plans(graph))
    other = ShardIndex.empty()
    for batch in other_plan:
        other = apply(other, batch)
    unversioned = {**json.loads(encoded), "version": None}
    assert {**json.loads(other.to_json()), "version": None} == unversioned
    # With the same number of changes the bytes are the same, whatever the order.
    one = ShardIndex.empty().declare_many([d for batch in plan for d in batch])
    two = ShardIndex.empty().declare_many([d for batch in other_plan for d in batch])
    assert one.version == two.version == (1 if graph else 0)
    assert one.to_json() == two.to_json()
    assert {**json.loads(one.to_json()), "version": None} == unversioned


@PROPERTY_SETTINGS
@given(data=st.data())
def test_changed_redeclaration_conflicts_with_exact_differences(data: st.DataObject) -> None:
    graph = data.draw(dags(min_size=1))
    index = build(graph)
    file_id = data.draw(st.sampled_from(sorted(graph)))
    stage, deps = graph[file_id]
    new_stage = data.draw(st.sampled_from(STAGES))
    # At most 20 ids per side are listed, which is tested on its own below.
    new_deps = data.draw(st.frozensets(st.sampled_from([*sorted(graph), *UNDECLARED]), max_size=15))
    if (new_stage, new_deps) == (stage, deps):
        assert index.declare(file_id, new_stage, new_deps) is index
        return
    with pytest.raises(
        DeclarationConflict, match=f"^{file_id!r} is already declared differently"
    ) as caught:
        index.declare(file_id, new_stage, new_deps)
    expected = []
    if new_stage != stage:
        expected.append(f"stage: {stage!r} != {new_stage!r}")
    added, removed = new_deps - deps, deps - new_deps
    if added or removed:
        parts = []
        if added:
            parts.append("+{" + ", ".join(map(repr, sorted(added))) + "}")
        if removed:
            parts.append("-{" + ", ".join(map(repr, sorted(removed))) + "}")
        expected.append("depends_on: " + " ".join(parts))
    assert caught.value.file_id == file_id
    assert caught.value.differences == tuple(expected)
    assert str(caught.value).endswith("; ".join(expected))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["schema_version", "version", "stages", "collect", "a", "", "x"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@PROPERTY_SETTINGS
@given(st.one_of(st.binary(max_size=64), json_values.map(lambda v: json.dumps(v).encode())))
def test_from_json_rejects_garbage_only_with_index_errors(data: bytes) -> None:
    try:
        index = ShardIndex.from_json(data)
    except (IndexFormatError, UnsupportedIndexSchema):
        return
    # Whatever was accepted must be a valid index that survives a round trip.
    assert ShardIndex.from_json(index.to_json()) == index


# ---------------------------------------------------------------------- basics


def test_empty_index() -> None:
    index = ShardIndex.empty()
    assert index.version == 0
    assert len(index) == 0
    assert "a" not in index
    assert index.node("a") is None
    assert index.stage_of("a") is None
    assert index.dependencies("a") == frozenset()
    assert index.dependents("a") == frozenset()
    assert index.undeclared() == frozenset()
    assert index.stages_needed("a") == frozenset()
    assert index.cross_shard_edges() == frozenset()
    assert index.file_ids() == frozenset()
    assert index.file_ids("collect") == frozenset()
    assert index == ShardIndex()
    assert index.to_json() == (
        b'{"commits":[],"journal":[],"journal_id":"","schema_version":2,"stages":{},"version":0}'
    )
    assert ShardIndex.empty(1).to_json() == b'{"schema_version":1,"stages":{},"version":0}'
    assert ShardIndex.SCHEMA_VERSION == 2


def test_declare_builds_every_view() -> None:
    index = (
        ShardIndex.empty()
        .declare("raw", "collect")
        .declare("clean", "transform", ["raw"])
        .declare("report", "write", ["clean", "raw", "extra"])
        .declare("notes", "write", ["report"])
    )
    assert index.version == 4
    assert len(index) == 4
    assert index.node("clean") == Node("transform", frozenset({"raw"}))
    assert index.stage_of("report") == "write"
    assert index.dependencies("report") == {"clean", "raw", "extra"}
    assert index.dependents("raw") == {"clean", "report"}
    assert index.dependents("extra") == {"report"}
    assert index.dependents("notes") == frozenset()
    assert index.undeclared() == {"extra"}
    assert index.stages_needed("report") == {"collect", "transform"}
    assert index.stages_needed("notes") == {"write"}
    assert index.stages_needed("raw") == frozenset()
    assert index.cross_shard_edges() == {
        ("clean", "raw"),
        ("report", "clean"),
        ("report", "raw"),
    }
    assert index.file_ids("write") == {"report", "notes"}
    assert index.file_ids() == {"raw", "clean", "report", "notes"}


def test_declaring_a_dependency_later_completes_the_edges() -> None:
    index = ShardIndex.empty().declare("b", "write", ["a"])
    assert index.undeclared() == {"a"}
    assert index.cross_shard_edges() == frozenset()
    later = index.declare("a", "collect")
    assert later.undeclared() == frozenset()
    assert later.cross_shard_edges() == {("b", "a")}
    assert later.stages_needed("b") == {"collect"}
    # The earlier index keeps its own (cached) views.
    assert index.undeclared() == {"a"}
    assert index.stages_needed("b") == frozenset()


def test_declare_returns_a_new_index_and_leaves_the_old_one() -> None:
    first = ShardIndex.empty().declare("a", "s", ["x"])
    assert first.dependents("x") == {"a"}  # builds the reverse map of `first`
    second = first.declare("b", "s", ["x"])
    assert second is not first
    assert first.dependents("x") == {"a"}
    assert second.dependents("x") == {"a", "b"}
    assert "b" not in first
    assert (first.version, second.version) == (1, 2)


def test_identical_redeclaration_returns_self() -> None:
    index = ShardIndex.empty().declare("a", "s", ["x", "y"])
    assert index.declare("a", "s", ["y", "x"]) is index
    assert index.declare("a", "s", ("x", "y", "x")) is index
    assert index.declare("a", "s", (d for d in "xy")) is index
    assert index.declare_many([("a", "s", {"x", "y"})] * 3) is index
    assert index.declare_many([]) is index
    assert index.version == 1


def test_equality_is_on_content_and_version() -> None:
    a = ShardIndex.empty().declare("a", "s", ["x"])
    b = ShardIndex.empty().declare("a", "s", {"x"})
    assert a == b
    assert hash(a) == hash(b)
    assert a != ShardIndex.empty().declare_many([("z", "s", ()), ("a", "s", ["x"])])
    # Same content reached in two changes instead of one is a different version.
    two_steps = ShardIndex.empty().declare("z", "s").declare("a", "s", ["x"])
    one_step = ShardIndex.empty().declare_many([("z", "s", ()), ("a", "s", ["x"])])
    assert two_steps.file_ids() == one_step.file_ids()
    assert two_steps != one_step
    assert a != "not an index"
    assert "version=1" in repr(a)


# ------------------------------------------------------------------ conflicts


def test_conflict_message_names_stage_and_dependency_changes() -> None:
    index = ShardIndex.empty().declare("f1", "collect", ["y", "z"])
    with pytest.raises(DeclarationConflict, match="'f1' is already declared differently") as caught:
        index.declare("f1", "write", ["x", "z"])
    assert str(caught.value) == (
        "'f1' is already declared differently (existing vs new): "
        "stage: 'collect' != 'write'; depends_on: +{'x'} -{'y'}"
    )
    assert caught.value.file_id == "f1"
    assert caught.value.differences == ("stage: 'collect' != 'write'", "depends_on: +{'x'} -{'y'}")
    assert isinstance(caught.value, ShardIndexError)


@pytest.mark.parametrize(
    ("stage", "deps", "difference"),
    [
        ("write", ["a"], "stage: 'collect' != 'write'"),
        ("collect", ["a", "b", "c"], "depends_on: +{'b', 'c'}"),
        ("collect", [], "depends_on: -{'a'}"),
    ],
)
def test_conflict_message_lists_only_what_differs(
    stage: str, deps: list[str], difference: str
) -> None:
    index = ShardIndex.empty().declare("f", "collect", ["a"])
    with pytest.raises(DeclarationConflict, match=re.escape(difference)) as caught:
        index.declare("f", stage, deps)
    assert caught.value.differences == (difference,)
    assert str(caught.value).endswith(f"(existing vs new): {difference}")


def test_conflict_message_stays_short_for_huge_differences() -> None:
    index = ShardIndex.empty().declare("f", "s")
    with pytest.raises(DeclarationConflict, match=r"'f' is already declared .*480 more") as caught:
        index.declare("f", "s", [f"d{n:03}" for n in range(500)])
    message = str(caught.value)
    assert "'d019'" in message
    assert "'d020'" not in message
    assert "480 more" in message
    assert len(message) < 400


def test_conflict_takes_precedence_over_cycle() -> None:
    index = ShardIndex.empty().declare("a", "s", ["b"]).declare("b", "s")
    with pytest.raises(DeclarationConflict, match=r"'b' is .* depends_on: \+\{'a'\}$"):
        index.declare("b", "s", ["a"])


def test_errors_pickle_with_their_attributes() -> None:
    errors: list[ShardIndexError] = [
        DeclarationConflict("f", ["stage: 'a' != 'b'"]),
        DependencyCycle(["a", "b"]),
        UnsupportedIndexSchema(7, 1),
        IndexFormatError("bad"),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert str(copy) == str(error)
        assert vars(copy) == vars(error)


# ---------------------------------------------------------------------- cycles


def test_self_dependency_is_a_cycle() -> None:
    with pytest.raises(DependencyCycle, match=r"dependency cycle: a -> a \(an entry") as caught:
        ShardIndex.empty().declare("a", "s", ["b", "a"])
    assert caught.value.cycle == ["a"]
    assert str(caught.value) == "dependency cycle: a -> a (an entry may not depend on itself)"


def test_cycle_closed_by_declaring_an_undeclared_id() -> None:
    index = ShardIndex.empty().declare("a", "s1", ["b"]).declare("b", "s2", ["c"])
    assert index.undeclared() == {"c"}
    with pytest.raises(DependencyCycle, match="dependency cycle: c -> a -> b -> c") as caught:
        index.declare("c", "s3", ["a"])
    assert caught.value.cycle == ["c", "a", "b"]
    assert str(caught.value) == "dependency cycle: c -> a -> b -> c"
    assert "c" not in index


def test_cycle_path_is_deterministic() -> None:
    # Two ways round: c -> a -> d -> c and c -> b -> d -> c; sorted order picks 'a'.
    index = ShardIndex.empty().declare_many(
        [("a", "s", ["d"]), ("b", "s", ["d"]), ("d", "s", ["c"])]
    )
    messages = set()
    for _ in range(3):
        with pytest.raises(DependencyCycle, match=r"^dependency cycle: c -> ") as caught:
            index.declare("c", "s", ["b", "a"])
        messages.add(str(caught.value))
    assert messages == {"dependency cycle: c -> a -> d -> c"}


def test_cycle_within_one_batch_is_refused_atomically() -> None:
    base = ShardIndex.empty().declare("keep", "s")
    batch = [("n1", "s", ["keep"]), ("n2", "s", ["n1"]), ("n3", "s", ["n2"]), ("n1x", "t", [])]
    batch.append(("n0", "s", ["n3"]))
    batch[0] = ("n1", "s", ["keep", "n0"])
    with pytest.raises(
        DependencyCycle, match="dependency cycle: n0 -> n3 -> n2 -> n1 -> n0"
    ) as caught:
        base.declare_many(batch)
    assert caught.value.cycle == ["n0", "n3", "n2", "n1"]
    assert base.file_ids() == {"keep"}
    assert base.version == 1


# ------------------------------------------------------------------ declare_many


def test_declare_many_counts_one_version_for_the_batch() -> None:
    index = ShardIndex.empty().declare_many(
        [("b", "t", ["a"]), ("a", "s", []), ("c", "t", ["a", "b"]), ("a", "s", [])]
    )
    assert index.version == 1
    assert index.dependents("a") == {"b", "c"}
    # A batch mixing repeats and one new entry still changes the version once.
    more = index.declare_many([("a", "s", []), ("d", "s", ["c"]), ("b", "t", ["a"])])
    assert more.version == 2
    assert more.cross_shard_edges() == {("b", "a"), ("c", "a"), ("d", "c")}


def test_declare_many_conflicting_duplicates_in_the_batch() -> None:
    with pytest.raises(DeclarationConflict, match="'a' is already declared differently") as caught:
        ShardIndex.empty().declare_many([("a", "s", ["x"]), ("b", "s", []), ("a", "s", ["y"])])
    assert caught.value.differences == ("depends_on: +{'y'} -{'x'}",)


@pytest.mark.parametrize(
    ("bad", "error", "why"),
    [
        (("a", "other", []), DeclarationConflict, "stage: 's' != 'other'"),
        (("z", "s", ["z"]), DependencyCycle, "dependency cycle: z -> z"),
        (("", "s", []), ValueError, "file_id must be a non-empty str, got ''"),
        (("z", "s", "ab"), ValueError, "depends_on of 'z' must be an iterable of file ids"),
    ],
)
def test_declare_many_is_all_or_nothing(bad: Decl, error: type[Exception], why: str) -> None:
    base = ShardIndex.empty().declare("a", "s", ["x"])
    before = base.to_json()
    dependents_before = base.dependents("x")
    with pytest.raises(error, match=re.escape(why)):
        base.declare_many([("b", "s", ["a"]), ("c", "t", ["b", "x"]), bad, ("d", "s", [])])
    assert base.to_json() == before
    assert base.dependents("x") == dependents_before
    assert base.file_ids() == {"a"}
    assert base.undeclared() == {"x"}


def test_declare_many_consumes_a_generator_once() -> None:
    decls = ((f"f{n}", "s", [f"f{n - 1}"] if n else []) for n in range(10))
    index = ShardIndex.empty().declare_many(decls)
    assert len(index) == 10
    assert index.dependents("f4") == {"f5"}


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("decl", "message"),
    [
        (("", "s", []), "file_id must be a non-empty str, got ''"),
        ((3, "s", []), "file_id must be a non-empty str, got 3"),
        ((None, "s", []), "file_id must be a non-empty str, got None"),
        (("a", "", []), "stage of 'a' must be a non-empty str, got ''"),
        (("a", b"s", []), "stage of 'a' must be a non-empty str, got b's'"),
        (("a", "s", "bc"), "depends_on of 'a' must be an iterable of file ids, not 'bc'"),
        (("a", "s", b"bc"), "depends_on of 'a' must be an iterable of file ids, not b'bc'"),
        (("a", "s", 5), "depends_on of 'a' must be an iterable of file ids, got 5"),
        (("a", "s", ["b", ""]), "depends_on of 'a' must hold non-empty str ids, got ''"),
        (("a", "s", ["b", 7]), "depends_on of 'a' must hold non-empty str ids, got 7"),
    ],
)
def test_declare_validates_inputs(decl: tuple[object, object, object], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$") as caught:
        ShardIndex.empty().declare(*decl)  # type: ignore[arg-type]
    assert str(caught.value) == message
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ShardIndex.empty().declare_many([("ok", "s", []), decl])  # type: ignore[list-item]


@pytest.mark.parametrize("decl", [("a", "s"), ("a", "s", [], "x"), "abc", None])
def test_declare_many_validates_the_shape_of_each_declaration(decl: object) -> None:
    with pytest.raises(ValueError, match=r"must be \(file_id, stage, depends_on\)"):
        ShardIndex.empty().declare_many([decl])  # type: ignore[list-item]


# ------------------------------------------------------------------------ JSON


def test_to_json_is_compact_sorted_and_grouped_by_stage() -> None:
    index = ShardIndex.empty(1).declare_many(
        [("b", "write", ["z", "a"]), ("a", "collect", []), ("c", "write", ["a"])]
    )
    assert index.to_json() == (
        b'{"schema_version":1,"stages":{"collect":{"a":[]},'
        b'"write":{"b":["a","z"],"c":["a"]}},"version":1}'
    )


def test_round_trip_of_unusual_ids() -> None:
    index = ShardIndex.empty().declare(
        'd\u00e9j\u00e0/\u2603 "q"', "st\u00e4ge", ["\U0001f600", "\\"]
    )
    data = index.to_json()
    assert data.isascii()
    assert ShardIndex.from_json(data) == index


def valid(**changes: object) -> bytes:
    document: dict[str, object] = {
        "schema_version": 1,
        "version": 2,
        "stages": {"collect": {"a": []}, "write": {"b": ["a"]}},
    }
    document.update(changes)
    return json.dumps(document).encode()


def test_from_json_accepts_valid_input_in_any_layout() -> None:
    pretty = json.dumps(
        {"version": 2, "stages": {"write": {"b": ["z", "a"]}}, "schema_version": 1}, indent=2
    ).encode()
    index = ShardIndex.from_json(pretty)
    assert index.version == 2
    assert index.dependencies("b") == {"a", "z"}
    assert ShardIndex.from_json(valid()).dependents("a") == {"b"}


def test_schema_2_carries_commit_ids_and_a_journal_it_does_not_interpret() -> None:
    record = {"version": 1, "note": ["anything", {"json": None}]}
    index = (
        ShardIndex.empty()
        .declare("a", "collect")
        .with_meta(Meta(2, ("c.1", "c.2"), "j1", (record,)))
    )
    data = index.to_json()
    assert data == (
        b'{"commits":["c.1","c.2"],"journal":[{"note":["anything",{"json":null}],"version":1}],'
        b'"journal_id":"j1","schema_version":2,"stages":{"collect":{"a":[]}},"version":1}'
    )
    back = ShardIndex.from_json(data)
    assert back.meta == Meta(2, ("c.1", "c.2"), "j1", (record,))
    assert back.declare("b", "write").meta == back.meta  # a declaration keeps them
    assert back.declare("b", "write").version == 2


def test_an_index_at_schema_1_stays_at_1() -> None:
    index = ShardIndex.from_json(valid())
    assert index.meta == Meta(schema_version=1)
    again = index.declare("c", "write")
    assert json.loads(again.to_json())["schema_version"] == 1
    assert set(json.loads(again.to_json())) == {"schema_version", "version", "stages"}


def valid2(**changes: object) -> bytes:
    document = json.loads(valid(schema_version=2, commits=[], journal_id="j", journal=[]))
    document.update(changes)
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (valid(schema_version=2), "index is missing 'commits', 'journal', 'journal_id'"),
        (valid2(commits="c.1"), "'commits' must be a list of commit ids"),
        (valid2(commits=[""]), "'commits' must be a list of commit ids"),
        (valid2(journal_id=None), "'journal_id' must be a string, got null"),
        (valid2(journal={}), "'journal' must be a list of objects"),
        (valid2(journal=[1]), "'journal' must be a list of objects"),
        (valid2(extra=1), "index has unknown keys 'extra'"),
        (valid(commits=[]), "index has unknown keys 'commits'"),
    ],
)
def test_from_json_checks_the_schema_2_fields(data: bytes, message: str) -> None:
    with pytest.raises(IndexFormatError, match=re.escape(message)):
        ShardIndex.from_json(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b"\xff\xfe", "not valid UTF-8"),
        (b"[1, 2]", "must be a JSON object, got a list"),
        (b"null", "must be a JSON object, got null"),
        (b'{"version": 1, "stages": {}}', "no 'schema_version'"),
        (valid(schema_version="1"), "'schema_version' must be a positive integer, got \"1\""),
        (valid(schema_version=True), "'schema_version' must be a positive integer, got true"),
        (valid(schema_version=0), "'schema_version' must be a positive integer, got 0"),
        (valid(schema_version=1.0), "'schema_version' must be a positive integer, got 1.0"),
        (b'{"schema_version": 1, "stages": {}}', "index is missing 'version'"),
        (valid(extra=1), "index has unknown keys 'extra'"),
        (valid(version=-1), "'version' must be an integer >= 0, got -1"),
        (valid(version=False), "'version' must be an integer >= 0, got false"),
        (valid(version=None), "'version' must be an integer >= 0, got null"),
        (valid(stages=[]), "'stages' must be an object, got a list"),
        (valid(stages={"": {}}), "'stages' has an empty stage name"),
        (valid(stages={"s": ["a"]}), "stages['s'] must be an object, got a list"),
        (valid(stages={"s": {"": []}}), "stages['s'] has an empty file id"),
        (valid(stages={"s": {"a": "b"}}), "stages['s']['a'] must be a list of file ids"),
        (valid(stages={"s": {"a": {}}}), "stages['s']['a'] must be a list of file ids"),
        (valid(stages={"s": {"a": ["b", 1]}}), "stages['s']['a'][1] must be a non-empty string"),
        (valid(stages={"s": {"a": [""]}}), "stages['s']['a'][0] must be a non-empty string"),
        (valid(stages={"s": {"a": [None]}}), "got null"),
        (valid(stages={"s": {"a": ["b", "b"]}}), "stages['s']['a'] lists a dependency twice"),
        (
            valid(stages={"s": {"a": []}, "t": {"a": []}}),
            "file id 'a' is in two stages: 's' and 't'",
        ),
        (
            b'{"schema_version":1,"version":1,"stages":{},"version":2}',
            "index has the key 'version' twice",
        ),
        (
            b'{"schema_version":1,"version":1,"stages":{"s":{"a":[NaN]}}}',
            "NaN is not allowed",
        ),
        (
            valid(stages={"s": {"a": ["b"], "b": ["c"]}, "t": {"c": ["a"]}}),
            "index contains a dependency cycle: a -> b -> c -> a",
        ),
        (valid(stages={"s": {"a": ["a"]}}), "index contains a dependency cycle: a -> a"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    ],
)
def test_from_json_rejects_malformed_input(data: bytes, message: str) -> None:
    with pytest.raises(IndexFormatError, match=re.escape(message)) as caught:
        ShardIndex.from_json(data)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, ShardIndexError)


@pytest.mark.parametrize(
    "data",
    [
        valid(schema_version=3),
        # A newer schema may have another shape: the version is checked first.
        b'{"schema_version": 5, "entries": [1, 2, 3]}',
    ],
)
def test_from_json_refuses_a_newer_schema(data: bytes) -> None:
    version = json.loads(data)["schema_version"]
    with pytest.raises(
        UnsupportedIndexSchema, match=f"index schema_version {version} is not supported"
    ) as caught:
        ShardIndex.from_json(data)
    version = json.loads(data)["schema_version"]
    assert caught.value.version == version
    assert caught.value.supported == ShardIndex.SCHEMA_VERSION
    assert f"schema_version {version} is not supported" in str(caught.value)
    assert isinstance(caught.value, ShardIndexError)
    assert not isinstance(caught.value, IndexFormatError)


def test_from_json_wants_bytes() -> None:
    with pytest.raises(TypeError, match="must be bytes, got str"):
        ShardIndex.from_json('{"schema_version": 1}')  # type: ignore[arg-type]


# ------------------------------------------------------------------------ scale

CHAIN = 100_000


@pytest.mark.parametrize("order", ["dependencies first", "dependents first"])
def test_100k_chain_in_one_batch(order: str) -> None:
    """Each entry depends on the one before: cycle checks must stay O(1) per entry."""
    decls = [(f"f{n}", STAGES[n % 3], [f"f{n - 1}"] if n else []) for n in range(CHAIN)]
    if order == "dependents first":
        decls.reverse()
    index = ShardIndex.empty().declare_many(decls)
    assert len(index) == CHAIN
    assert index.version == 1
    assert index.undeclared() == frozenset()
    assert index.dependents("f500") == {"f501"}
    assert index.stages_needed("f500") == {STAGES[499 % 3]}
    assert len(index.cross_shard_edges()) == CHAIN - 1
    assert ShardIndex.from_json(index.to_json()) == index


def test_cycle_through_a_100k_chain_is_found_without_recursion() -> None:
    decls = [(f"f{n}", "s", [f"f{n - 1}"]) for n in range(1, CHAIN)]
    index = ShardIndex.empty().declare_many(decls)
    assert index.undeclared() == {"f0"}
    with pytest.raises(
        DependencyCycle, match=f"^dependency cycle: f0 -> f{CHAIN - 1} -> "
    ) as caught:
        index.declare("f0", "s", [f"f{CHAIN - 1}"])
    assert len(caught.value.cycle) == CHAIN
    assert caught.value.cycle[:3] == ["f0", f"f{CHAIN - 1}", f"f{CHAIN - 2}"]
    # The message keeps both ends of a long cycle, not all 100k ids.
    assert str(caught.value) == (
        "dependency cycle: "
        + " -> ".join(f"f{n}" for n in [0, *range(CHAIN - 1, CHAIN - 10, -1)])
        + f" -> ... {CHAIN + 1 - 20} more ... -> "
        + " -> ".join(f"f{n}" for n in [*range(9, 0, -1), 0])
    )
    # The same long cycle in a stored index is found by the loader.
    cyclic = json.loads(index.to_json())
    cyclic["stages"]["s"]["f0"] = [f"f{CHAIN - 1}"]
    with pytest.raises(IndexFormatError, match="dependency cycle: f0 -> f99999 -> f99998"):
        ShardIndex.from_json(json.dumps(cyclic).encode())


def test_joining_two_large_regions_stays_correct() -> None:
    """A new entry between two long chains: both search directions have much to see."""
    left = [(f"l{n}", "s", [f"l{n - 1}"] if n else ["mid"]) for n in range(2_000)]
    right = [(f"r{n}", "t", [f"r{n - 1}"]) for n in range(1, 2_000)]
    index = ShardIndex.empty().declare_many(left + right)
    joined = index.declare("mid", "s", ["r1999"])
    assert joined.cross_shard_edges() == {("mid", "r1999")}
    with pytest.raises(DependencyCycle, match=r"^dependency cycle: r0 -> l1999 -> ") as caught:
        joined.declare("r0", "t", ["l1999"])
    assert len(caught.value.cycle) == 2_000 + 1 + 2_000


def test_short_branches_off_a_long_chain_stay_cheap() -> None:
    """Searching only forward would walk the whole chain for every new entry here.

    Each ``x`` is declared after the ``y`` that waits for it and depends on the head of a
    100k chain; the backward side (just ``y``) is what bounds the search.
    """
    chain = [(f"f{n}", "s", [f"f{n - 1}"] if n else []) for n in range(CHAIN)]
    index = ShardIndex.empty().declare_many(chain)
    head = f"f{CHAIN - 1}"
    branches: list[Decl] = []
    for n in range(2_000):
        branches += [(f"y{n}", "t", [f"x{n}"]), (f"x{n}", "t", [head])]
    index = index.declare_many(branches)
    assert len(index.dependents(head)) == 2_000
    assert index.undeclared() == frozenset()
    assert index.stages_needed("x0") == {"s"}
    assert ("x0", head) in index.cross_shard_edges()


# ------------------------------------------------------------------ removing


def test_remove_takes_an_id_out_with_its_reverse_edges() -> None:
    index = ShardIndex().declare_many([("a", "s1", ()), ("b", "s2", ("a", "x")), ("c", "s2", ())])
    removed = index.remove("b")
    assert "b" not in removed and len(removed) == 2
    assert removed.version == index.version + 1
    assert removed.dependents("a") == frozenset() and removed.dependents("x") == frozenset()
    assert removed.undeclared() == frozenset()
    assert index.dependents("a") == {"b"}  # the original is untouched
    assert ShardIndex.from_json(removed.to_json()) == removed
    assert removed.remove("b") is removed  # not declared: the same index
    assert removed.remove("a").file_ids() == {"c"}


def test_remove_refuses_an_id_others_depend_on() -> None:
    index = ShardIndex().declare_many([("a", "s", ()), ("c", "s", ("a",)), ("b", "s", ("a",))])
    with pytest.raises(
        shard_index_errors.HasDependents, match=r"'a' cannot be removed: 'b', 'c'"
    ) as info:
        index.remove("a")
    assert isinstance(info.value, ShardIndexError)
    assert (info.value.file_id, info.value.dependents) == ("a", ("b", "c"))
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.file_id, again.dependents, str(again)) == ("a", ("b", "c"), str(info.value))
    assert "a" in index


@pytest.mark.parametrize("bad", ["", None, 3])
def test_remove_refuses_a_bad_id(bad: object) -> None:
    with pytest.raises(ValueError, match="file_id must be a non-empty str"):
        ShardIndex().remove(bad)  # type: ignore[arg-type]
