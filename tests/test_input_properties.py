"""Bad input, as properties: any text is a file id, a name, a
store URL or an endpoint, or is refused as one with ``InvalidInput``; the keys a valid file
id names parse back to it; models round-trip through their codecs; and a shard, index,
header or upload state that is malformed, truncated, oversized, of the wrong types or of
another schema version gives its documented error (``CorruptShard`` or
``UnsupportedSchema``, naming the object and the fix) and is neither overwritten nor
deleted.

The properties run on the pure code (hypothesis, a few hundred examples each, well under a
second apiece); the damaged objects go through the public API on every backend.
``tests/test_hostile_input.py`` has the hand-picked cases these generalise.
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import re
import string
import unicodedata
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import objmanifest as om
from objmanifest.cas.codecs import (
    HEADER_REPAIR,
    INDEX_REPAIR,
    SHARD_REPAIR,
    UPLOAD_REPAIR,
    HeaderCodec,
    ShardCodec,
)
from objmanifest.core.layout import BlockRef, Parsed, TaskLayout
from objmanifest.core.model import (
    HEADER_SCHEMA,
    SCHEMA_VERSION,
    Declaration,
    Entry,
    Shard,
    TaskHeader,
)
from objmanifest.core.names import MAX_FILE_ID_BYTES, check_agent, check_file_id, check_name
from objmanifest.core.states import State
from objmanifest.data.chunked.state import UploadCodec
from objmanifest.engine.manifest import Manifest
from objmanifest.store import parse_url
from objmanifest.store.s3_client import check_endpoint
from tests.support import rawstore
from tests.support.breaking import BreakingFile
from tests.support.internals import engine

MiB = 1024 * 1024
PART = 5 * MiB
FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""The profile's number of examples (hypothesis's default: 100)."""
SOME = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
"""Any text, lone surrogates (bytes that were not UTF-8) included."""
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
names = st.from_regex(NAME, fullmatch=True)
segment = st.text(
    st.characters(exclude_categories=("Cc", "Cs"), exclude_characters="/\\"),
    min_size=1,
    max_size=12,
).filter(lambda s: s not in (".", ".."))
file_ids = (
    st.lists(segment, min_size=1, max_size=5)
    .map("/".join)
    .filter(lambda f: len(f.encode()) <= MAX_FILE_ID_BYTES)
)


def has_control(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" for c in text)


def first_unseen(text: str) -> str | None:
    """The first character no name may hold (control, format, line or paragraph separator),
    as the refusal names it (``U+2028``)."""
    for c in text:
        if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp"):
            return f"U+{ord(c):04X}"
    return None


def utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# -- names, file ids, agents -----------------------------------------------------------------


@FAST
@given(any_text | names | file_ids)
@example("job\n")  # `$` matched before a final newline: "job\n" was a task id
@example("a" * 129)
def test_any_text_is_a_name_or_refused_as_one(text: str) -> None:
    try:
        assert check_name("stage", text) == text
    except om.InvalidInput as e:
        assert not NAME.fullmatch(text)
        assert str(e).startswith("invalid stage ") and "1-128 letters" in str(e)
    else:
        assert NAME.fullmatch(text), repr(text)


@FAST
@given(any_text | file_ids)
@example("a/\n")
@example("x" * (MAX_FILE_ID_BYTES + 1))
@example("x\u202egpj.exe")
@example("a\u2067b/c")
@example("x\u2028y")
@example("x\u2029y")
@example("zero\u200bwidth")
@example("\ufeffbom")
@example("word\u2060joiner")
@example("tag\U000e0001")
@example("soft\u00adhyphen")
def test_any_text_is_a_file_id_or_refused_as_one(text: str) -> None:
    rules = (
        text != ""
        and utf8(text)
        and not text.startswith("/")
        and len(text.encode()) <= MAX_FILE_ID_BYTES
        and first_unseen(text) is None
        and "\\" not in text
        and all(part not in ("", ".", "..") for part in text.split("/"))
    )
    try:
        assert check_file_id(text) == text
    except om.InvalidFileId as e:
        assert not rules, repr(text)
        assert str(e).startswith("invalid file id ") and "Use a relative key" in str(e)
        checked_before = (text and utf8(text) and not text.startswith("/")) and len(
            text.encode()
        ) <= MAX_FILE_ID_BYTES
        if checked_before and first_unseen(text) is not None:
            assert f"({first_unseen(text)}" in str(e), str(e)  # the character, named
    else:
        assert rules, repr(text)


@FAST
@given(any_text)
@example("p\u2028q")
@example("p\u2029")
@example("\u200bagent")
@example("agent\U000e0041")
def test_any_text_is_an_agent_name_or_refused_as_one(text: str) -> None:
    fine = (
        bool(text.strip())
        and utf8(text)
        and len(text.encode()) <= 256
        and first_unseen(text) is None
    )
    try:
        assert check_agent("agent name", text) == text
    except om.InvalidInput as e:
        assert not fine and str(e).startswith("invalid agent name ")
        if text.strip() and utf8(text) and len(text.encode()) <= 256:
            assert f"({first_unseen(text)}" in str(e), str(e)
    else:
        assert fine, repr(text)


@FAST
@given(names, names, file_ids, st.integers(0, 10**12), names, st.integers(1, 16), st.booleans())
def test_the_keys_a_file_id_names_parse_back_to_it(
    task_id: str, stage: str, file_id: str, epoch: int, tag: str, partitions: int, spread: bool
) -> None:
    layout = TaskLayout(task_id, {stage: partitions}, spread=spread)
    shard = layout.shard_of(stage, file_id)
    for key in (
        layout.data(stage, file_id, epoch),
        layout.beside(layout.data(stage, file_id, epoch), tag),
    ):
        assert layout.parse(key) == Parsed("data", task_id, stage, shard, file_id, epoch)
        assert key.startswith(layout.data_of(stage))
    assert layout.parse(layout.shard(shard)) == Parsed("shard", task_id, stage, shard)
    block = layout.journal_block(layout.shard(shard), "j1", 1, 32)
    assert layout.parse_block(block) == BlockRef(layout.shard(shard), "j1", 1, 32)
    stages = (stage,)
    assert all(layout.is_shard(name, stages) for name in layout.shards_of(stage))
    near = [f"{stage}~{partitions}", f"{stage}~x", f"{stage}~-1", "_task", f"{stage}x"]
    near += [
        f"{stage}~{n}" for n in range(partitions) if f"{stage}~{n}" not in layout.shards_of(stage)
    ]
    assert not any(layout.is_shard(name, stages) for name in near)
    if spread and partitions > 1:  # each partition's objects under prefixes of their own
        assert layout.shard(shard) == f"{task_id}/shards/{shard}/shard.json"
        assert layout.data(stage, file_id, epoch).startswith(f"{task_id}/data/{shard}/")
        flat = TaskLayout(task_id, {stage: partitions})
        assert flat.parse(layout.data(stage, file_id, epoch)).kind == "other"
    parsed = layout.parse(layout.upload_state(stage, file_id))
    assert (parsed.kind, parsed.stage, parsed.file_id, parsed.shard) == (
        "upload",
        stage,
        file_id,
        shard,
    )
    assert shard in layout.shards_of(stage)


# -- store URLs and endpoints ------------------------------------------------------------------

url_like = st.builds(
    lambda scheme, rest: f"{scheme}{rest}",
    st.sampled_from(["s3://", "memory://", "S3://", "http://", "", "s3:/"]),
    any_text,
)
buckets = st.from_regex(r"[a-z0-9][a-z0-9.-]{2,40}", fullmatch=True)
prefixes = st.lists(st.from_regex(r"[A-Za-z0-9_.-]{1,10}", fullmatch=True), max_size=4).filter(
    lambda parts: all(p not in (".", "..") for p in parts)
)


@FAST
@given(url_like)
@example("s3://bucket\n/x")  # urlparse drops the newline: it was read as s3://bucket/x
@example("s3://b/a\x1bb")
@example("s3://[")  # urlparse's own ValueError ("Invalid IPv6 URL") escaped
def test_any_text_is_a_store_url_or_refused_as_one(text: str) -> None:
    try:
        scheme, bucket, prefix = parse_url(text)
    except om.InvalidInput as e:
        assert "\n" not in str(e).replace("\\n", "")
        return
    assert scheme in ("s3", "memory") and not has_control(text), repr(text)
    # The scheme is read without regard to case (S3:// is s3://); the rest as it is.
    rest = text.split("://", 1)[1].rstrip("/")
    assert f"{bucket}/{prefix}".rstrip("/") == rest, repr(text)


@FAST
@given(buckets, prefixes)
def test_a_store_url_round_trips(bucket: str, parts: list[str]) -> None:
    prefix = "/".join(parts)
    url = f"memory://{bucket}/{prefix}"
    assert parse_url(url) == ("memory", bucket, prefix)
    assert parse_url(f"s3://{bucket}/{prefix}/") == ("s3", bucket, prefix)
    assert om.connect(url).url == url.rstrip("/")


@FAST
@given(url_like | st.builds("http://127.0.0.1:{}".format, any_text))
def test_any_text_is_an_endpoint_or_refused_as_one(text: str) -> None:
    try:
        assert check_endpoint(text) == text
    except om.InvalidInput as e:
        assert "invalid S3 endpoint URL" in str(e)
    else:
        assert text.startswith(("http://", "https://"))


# -- models ------------------------------------------------------------------------------------

times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(timezone.utc)
)
entries = st.builds(
    Entry,
    file_id=file_ids,
    stage=names,
    state=st.sampled_from(State),
    owner=st.none() | any_text.filter(utf8),
    epoch=st.integers(0, 10**9),
    lease_expires_at=st.none() | times,
    checksum=st.none() | st.text(string.hexdigits, min_size=32, max_size=32),
    size=st.none() | st.integers(0, 2**50),
    retry_count=st.integers(0, 1000),
    depends_on=st.lists(file_ids, max_size=3).map(tuple),
    consumers=st.lists(names, max_size=3).map(tuple),
    error=st.none() | any_text.filter(utf8),
    declared_at=st.none() | times,
)


@SOME
@given(st.lists(entries, max_size=6), st.integers(0, 10**6))
def test_shards_of_any_entries_round_trip_through_their_codec(
    found: list[Entry], version: int
) -> None:
    codec = ShardCodec("job", "collect")
    shard = Shard(
        task_id="job", stage="collect", version=version, entries={e.file_id: e for e in found}
    )
    assert codec.decode("k", codec.encode(shard)) == shard


@SOME
@given(st.lists(names, min_size=1, max_size=5, unique=True), st.floats(0.001, 2592000), times)
def test_task_headers_round_trip_through_their_codec(
    stages: list[str], lease: float, created: datetime
) -> None:
    header = TaskHeader(
        task_id="job", stages=tuple(stages), lease_seconds=lease, max_retries=3, created_at=created
    )
    codec = HeaderCodec("job")
    assert codec.decode("job/task.json", codec.encode(header)) == header


@FAST
@given(
    st.dictionaries(
        st.sampled_from(["file_id", "stage", "depends_on", "consumers", "x"]), json_values
    )
    | st.lists(json_values, max_size=5)
    | json_values
)
def test_a_declaration_of_anything_is_built_or_refused_with_invalid_input(value: Any) -> None:
    try:
        declaration = Declaration.of(value)
    except om.InvalidInput:
        return
    check_file_id(declaration.file_id)
    assert all(check_file_id(d) for d in declaration.depends_on)


# -- damaged manifest objects, decoded --------------------------------------------------------


@functools.cache
def samples() -> dict[str, tuple[Any, str, bytes]]:
    """A real object of each kind (codec, key, bytes), from a task on MemoryStore: a shard
    with entries, the index, the header and the upload state of a chunked put that broke."""
    store = om.MemoryStore(f"bad-input-{random.Random().getrandbits(32):x}", "p")
    task = om.Task.create(store, "job", stages=["collect", "write"])
    task.declare_many([("a", "collect"), ("big", "collect"), ("b", "write", ["a"], ["r"])])
    agent = task.agent("maker")
    claim = agent.claim("big")
    assert claim is not None
    data = random.Random(3).randbytes(2 * PART)
    with pytest.raises(OSError, match="disk on fire"):
        agent.put(claim, BreakingFile(data, PART, "disk on fire"), part_size=PART, threshold=MiB)  # type: ignore[arg-type]
    keys = {
        "shard": (engine(task).codec("collect"), engine(task).shard_key("collect")),
        "index": (engine(task).index_codec, engine(task).index_key),
        "header": (HeaderCodec("job"), Manifest.header_key("job")),
        "upload": (
            UploadCodec("job", "collect", "big"),
            engine(task).layout.upload_state("collect", "big"),
        ),
    }
    found = {}
    for kind, (codec, key) in keys.items():
        blob = store.get(key)
        assert blob is not None
        found[kind] = (codec, key, blob.body)
    return found


KINDS = ("shard", "index", "header", "upload")
SUPPORTED = {"shard": SCHEMA_VERSION, "index": 2, "header": HEADER_SCHEMA, "upload": SCHEMA_VERSION}
REPAIRS = {
    "shard": SHARD_REPAIR,
    "index": INDEX_REPAIR,
    "header": HEADER_REPAIR,
    "upload": UPLOAD_REPAIR,
}


def decoded(kind: str, body: bytes) -> Any:
    """Decode ``body`` as ``kind``: the document, or the documented error (anything else
    fails the test)."""
    codec, key, _ = samples()[kind]
    try:
        return codec.decode(key, body)
    except (om.CorruptShard, om.UnsupportedSchema) as e:
        assert e.key == key
        return e
    except om.NotFound as e:  # a shard of another incarnation of the task: refused as such
        assert kind == "shard" and "deleted and created again" in str(e), e
        return e


def test_the_samples_decode() -> None:
    for kind in KINDS:
        codec, key, body = samples()[kind]
        assert not isinstance(decoded(kind, body), Exception), kind
        assert codec.encode(codec.decode(key, body)) == body, kind  # and write back the same


@FAST
@given(st.sampled_from(KINDS), st.integers(min_value=0))
def test_a_truncated_object_is_corrupt(kind: str, cut: int) -> None:
    body = samples()[kind][2]
    assert isinstance(decoded(kind, body[: cut % len(body)]), om.CorruptShard)


@FAST
@given(
    st.sampled_from(KINDS),
    st.binary(max_size=200) | any_text.map(lambda t: t.encode("utf-8", "surrogatepass")),
)
def test_bytes_that_are_not_an_object_are_corrupt(kind: str, body: bytes) -> None:
    result = decoded(kind, body)
    assert isinstance(result, (om.CorruptShard, om.UnsupportedSchema)), body


@FAST
@given(st.sampled_from(KINDS), st.data())
def test_a_field_of_the_wrong_type_is_refused_or_read_never_crashes(
    kind: str, data: st.DataObject
) -> None:
    document = json.loads(samples()[kind][2])
    target = document
    while True:  # a field at some depth: the document's own, or one of an entry's
        name = data.draw(st.sampled_from(sorted(target)))
        if isinstance(target[name], dict) and target[name] and data.draw(st.booleans()):
            target = target[name]
            continue
        break
    target[name] = data.draw(json_values)
    decoded(kind, json.dumps(document).encode())


@FAST
@given(st.sampled_from(KINDS), st.integers() | st.floats() | st.booleans() | st.none() | any_text)
def test_a_schema_version_out_of_range_is_named(kind: str, version: Any) -> None:
    document = json.loads(samples()[kind][2])
    document["schema_version"] = version
    result = decoded(kind, json.dumps(document).encode())
    if isinstance(version, int) and not isinstance(version, bool) and version > SUPPORTED[kind]:
        assert isinstance(result, om.UnsupportedSchema) and result.version == version
    elif not isinstance(version, int) or isinstance(version, bool) or version < 1:
        assert isinstance(result, om.CorruptShard), (version, result)


OVERSIZED: dict[str, Callable[[bytes], bytes]] = {
    "nested 100000 deep": lambda body: b"[" * 100_000 + b"]" * 100_000,
    "a field nested 5000 deep": lambda body: (
        body[:-1] + b', "deep": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    ),
    "a 5000-digit schema_version": lambda body: b'{"schema_version": ' + b"9" * 5000 + b"}",
    "8 MiB of spaces before it": lambda body: b" " * (8 * MiB) + b"[",
    "a 4 MiB string field": lambda body: body[:-1] + b', "x": "' + b"y" * (4 * MiB) + b'"}',
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("damage", sorted(OVERSIZED))
def test_an_oversized_object_is_refused_or_read_never_crashes(kind: str, damage: str) -> None:
    result = decoded(kind, OVERSIZED[damage](samples()[kind][2]))
    if damage.startswith(("nested", "a 5000", "8 MiB")):
        assert isinstance(result, om.CorruptShard), result
    if isinstance(result, om.CorruptShard):
        assert len(str(result)) < 1000  # the message never carries the object


# -- damaged manifest objects, through the API, on every backend -----------------------------------


def damaged_bodies(kind: str) -> dict[str, bytes]:
    body = samples()[kind][2]
    document = json.loads(body)
    wrong_type = dict(document)
    field = {"shard": "entries", "index": "stages", "header": "stages", "upload": "parts"}[kind]
    wrong_type[field] = "not a collection"
    newer = {**document, "schema_version": 99}
    if kind == "header":  # a newer header says which release reads it
        newer["requires"] = "9.9.0"
    return {
        "truncated": body[: len(body) // 2],
        "wrong type": json.dumps(wrong_type).encode(),
        "newer version": json.dumps(newer).encode(),
        "nested too deep": b'{"schema_version": 1, "x": ' + b"[" * 3000 + b"]" * 3000 + b"}",
        "not JSON": b"\x89PNG\r\n\x1a\n\x00\x00",
    }


def reader(kind: str) -> Callable[[om.Task], Any]:
    """What reads an object of ``kind`` and so meets the damage."""
    agent_put = lambda task: task.agent("maker").put(  # noqa: E731
        om.Claim(task.task_id, "big", "collect", "maker", 1, datetime.now(timezone.utc)),
        random.Random(3).randbytes(2 * PART),
        part_size=PART,
        threshold=MiB,
    )
    return {
        "shard": lambda task: task.declare("n", "collect"),
        "index": lambda task: task.declare("n", "collect"),
        "header": lambda task: om.Task.open(task.store, "job"),
        "upload": agent_put,
    }[kind]


@pytest.mark.behaviour
@pytest.mark.stage_layout
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "damage", ["truncated", "wrong type", "newer version", "nested too deep", "not JSON"]
)
def test_a_damaged_object_gives_its_documented_error_and_is_left_as_it_is(
    store: om.ObjectStore, kind: str, damage: str
) -> None:
    task = om.Task.create(store, "job", stages=["collect", "write"], lease_seconds=600)
    task.declare_many([("a", "collect"), ("big", "collect")])
    if kind == "upload":  # a chunked put that broke after its first part left its state
        agent = task.agent("maker")
        claim = agent.claim("big")
        assert claim is not None and claim.epoch == 1
        with pytest.raises(OSError, match="disk on fire"):
            source = BreakingFile(random.Random(3).randbytes(2 * PART), PART, "disk on fire")
            agent.put(claim, source, part_size=PART, threshold=MiB)  # type: ignore[arg-type]
    key = samples()[kind][1]
    body = damaged_bodies(kind)[damage]
    rawstore.put(store, key, body)
    address = store.describe(key)
    expected = om.UnsupportedSchema if damage == "newer version" else om.CorruptShard
    try:
        with pytest.raises(expected) as caught:
            reader(kind)(task)
        message = str(caught.value)
        assert caught.value.key == key and caught.value.address == address
        assert address in message
        if expected is om.CorruptShard:
            assert REPAIRS[kind] in message, message
        else:
            assert "has schema_version 99, this objmanifest reads up to" in message
            fix = (
                "install objmanifest 9.9.0 or newer" if kind == "header" else "upgrade objmanifest"
            )
            assert fix in message, message
        if kind != "header":  # what else reads it leaves it too: the views, the sweep, gc
            for again in (task.status, task.sweep_uploads, task.gc):
                with contextlib.suppress(om.CorruptShard, om.UnsupportedSchema):
                    again()
        assert rawstore.get(store, key) == body, "the damaged object was overwritten"
        assert key in rawstore.keys(store, "job/"), "the damaged object was deleted"
    finally:
        rawstore.abort_uploads(store, "job/")
