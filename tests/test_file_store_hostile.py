"""``FileStore`` against hostile input: URLs that are not an absolute directory, directories
that are not a store's (missing, a file, a FIFO, a device, a link, someone else's files),
special files where an object should be, a user without permission, a read-only or full
filesystem, and system calls that fail after they may have happened (as on NFS). Every
refusal names the directory or object and the fix, and changes nothing of the user's."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import objmanifest as om
from objmanifest.core import checksum
from objmanifest.errors import AccessDenied, InvalidInput, StoreError, UnsupportedStore
from objmanifest.store import CREATE, PutMode, file_io
from objmanifest.store.errors import (
    NoSuchObject,
    OutcomeUnknown,
    PartsRejected,
    PreconditionFailed,
    UploadGone,
)
from objmanifest.store.file import FileStore
from objmanifest.store.file_root import check_locks, mount_of

NOBODY = 65534


@pytest.fixture
def root(tmp_path: Path) -> Path:
    directory = tmp_path / "store"
    directory.mkdir()
    return directory


@pytest.fixture
def store(root: Path) -> FileStore:
    return FileStore(str(root))


# -- URLs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("file://relative/dir", "not a host"),
        ("file:relative", "three slashes"),
        ("file:///srv/./x", "'.' or '..' segment"),
        ("file://///", "the root directory itself cannot be a store"),
        ("file:///srv/x\n", "no control characters"),
        ("file:///srv/%0Ax", "control character"),
    ],
)
def test_a_url_that_is_not_an_absolute_directory_is_refused_before_any_call(
    url: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tests/test_store_urls.py`` holds every rule; here: refused before the filesystem
    is touched at all."""
    touched: list[str] = []
    monkeypatch.setattr(os, "stat", lambda *a, **k: touched.append("stat"))
    with pytest.raises(InvalidInput, match=re.escape(says)):
        om.connect(url)
    with pytest.raises(InvalidInput, match=re.escape(says)):
        FileStore.from_url(url)
    assert touched == []


def test_a_url_names_its_directory_with_escapes_decoded(tmp_path: Path) -> None:
    spaced = tmp_path / "my store é"
    spaced.mkdir()
    url = "file://" + str(spaced).replace(" ", "%20").replace("é", "%C3%A9")
    store = FileStore.from_url(url + "/")
    assert store.root == str(spaced)
    assert store.url == url
    assert om.connect(store.url).url == url
    assert store.describe("a/b") == url + "/a/b"


# -- directories that are not a store's --------------------------------------------------------


def test_a_missing_directory_is_refused_and_not_made(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(StoreError, match=f"{missing} does not exist.*mkdir -p {missing}"):
        FileStore(str(missing))
    assert not missing.exists()


@pytest.mark.parametrize("what", ["file", "fifo", "device", "link to a file", "dangling link"])
def test_a_root_that_is_not_a_directory_is_refused_without_opening_it(
    tmp_path: Path, what: str
) -> None:
    path = tmp_path / "root"
    if what == "file":
        path.write_bytes(b"precious")
    elif what == "fifo":
        os.mkfifo(path)  # opening it would hang: it must never be opened
    elif what == "device":
        path.symlink_to("/dev/null")
    elif what == "link to a file":
        (tmp_path / "target").write_bytes(b"precious")
        path.symlink_to(tmp_path / "target")
    else:
        path.symlink_to(tmp_path / "nowhere")
    with pytest.raises(StoreError, match=f"{path}.*(not a directory|does not exist)"):
        FileStore(str(path))
    if what in ("file", "link to a file"):
        assert path.read_bytes() == b"precious"


def test_a_link_to_a_directory_is_followed_once(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    link = tmp_path / "link"
    link.symlink_to(first)
    store = FileStore(str(link))
    link.unlink()
    link.symlink_to(second)  # turned elsewhere after the store was opened
    store.put("k", b"v")
    assert (first / "k").exists() and not (second / "k").exists()


def test_a_directory_holding_someone_elses_files_is_refused_and_left_alone(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_bytes(b"mine")
    (home / "photos").mkdir()
    with pytest.raises(StoreError, match=r"not an objmanifest store and is not empty.*notes\.txt"):
        FileStore(str(home))
    assert sorted(os.listdir(home)) == ["notes.txt", "photos"]


def test_a_store_that_lost_its_own_directory_is_refused_with_the_way_back(
    tmp_path: Path,
) -> None:
    """A store whose ``.objmanifest/`` was removed still holds its objects: opening it says
    so and how to bring it back (make that directory again), and changes nothing."""
    root = tmp_path / "store"
    root.mkdir()
    om.Task.create(FileStore(str(root)), "job", stages=["a"]).declare("x", "a")
    subprocess.run(["rm", "-rf", str(root / ".objmanifest")], check=True)
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    with pytest.raises(StoreError, match=r"looks like the objects of an objmanifest store") as e:
        FileStore(str(root))
    assert f"mkdir {root}/.objmanifest" in str(e.value)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before
    (root / ".objmanifest").mkdir()
    assert om.Task.open(FileStore(str(root)), "job").entry("x").state is om.State.pending


def test_names_no_key_maps_to_do_not_keep_a_directory_from_being_a_store(tmp_path: Path) -> None:
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    (mount_point / "lost+found").mkdir()  # a fresh ext4 filesystem's root
    (mount_point / ".nfs0000000000a1b2c300000001").write_bytes(b"")
    store = FileStore(str(mount_point))
    store.put("k", b"v")
    assert [row.key for row in store.list("")] == ["k"]
    # Once it is a store, a file someone drops in reads as an object of all its bytes, and
    # is replaced only by a write conditional on that version.
    (mount_point / "README").write_bytes(b"not an object")
    dropped = store.get("README")
    assert dropped is not None and dropped.body == b"not an object"
    assert dropped.etag == f'"{checksum.of_bytes(b"not an object")}"'
    with pytest.raises(PreconditionFailed):
        store.put("README", b"x", mode=CREATE)
    with pytest.raises(PreconditionFailed):
        store.put("README", b"x", mode=PutMode.update(f'"{checksum.of_bytes(b"other")}"'))
    assert (mount_point / "README").read_bytes() == b"not an object"


def test_the_stores_own_directory_taken_by_a_file_is_refused(root: Path) -> None:
    (root / ".objmanifest").write_bytes(b"in the way")
    with pytest.raises(StoreError, match=r"\.objmanifest is a regular file.*move it away"):
        FileStore(str(root))


MOUNTS = (
    "1 0 0:1 / / rw - ext4 /dev/vda rw\n"
    "2 1 0:2 / /mnt/my\\040share rw,relatime - nfs4 server:/x rw,vers=4.2,hard\n"
    "3 1 0:3 / /mnt/old rw - nfs server:/y rw,vers=3,hard\n"
    "4 1 0:4 / /mnt/old rw,relatime - nfs server:/y rw,vers=3,nolock,local_lock=all\n"
)


def test_an_nfs_mount_whose_locks_stay_on_this_machine_is_refused() -> None:
    """With ``nolock`` an NFS client keeps its locks to itself: two machines could both
    update one object. The mount last made on a mount point is the one that counts."""
    with pytest.raises(UnsupportedStore, match="NFS mount with local_lock=all,nolock"):
        check_locks(b"/mnt/old/jobs", "/mnt/old/jobs", MOUNTS)
    check_locks(b"/mnt/my share/jobs", "/mnt/my share/jobs", MOUNTS)  # NFSv4: its locks
    check_locks(b"/mnt/oldest", "/mnt/oldest", MOUNTS)  # on ext4, not under /mnt/old
    assert mount_of(b"/mnt/my share", MOUNTS) == (
        "nfs4",
        {"rw", "relatime", "vers=4.2", "hard"},
    )


# -- special files where an object should be ---------------------------------------------------


@pytest.mark.parametrize("what", ["symlink", "fifo", "directory", "device"])
def test_a_special_file_at_an_objects_path_is_never_followed_opened_or_replaced(
    root: Path, store: FileStore, what: str
) -> None:
    outside = root.parent / "outside"
    outside.write_bytes(b"secret")
    path = root / "victim"
    if what == "symlink":
        path.symlink_to(outside)
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "directory":
        path.mkdir()
    else:
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # what /dev/zero is
        except PermissionError:
            pytest.skip("making a device node needs root")
    for read in (lambda: store.get("victim"), lambda: store.head("victim")):
        with pytest.raises(StoreError) as raised:
            read()
        assert "victim" in str(raised.value)
        assert "secret" not in str(raised.value)
    with pytest.raises(StoreError):
        store.put("victim", b"x", mode=PutMode.update('"0123"'))
    assert outside.read_bytes() == b"secret"


def _outside(tree: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tree)): p.read_bytes() for p in tree.rglob("*") if p.is_file()}


@pytest.mark.parametrize("depth", [1, 2])
def test_a_directory_of_the_tree_replaced_by_a_link_is_never_followed(
    root: Path, store: FileStore, depth: int
) -> None:
    """A directory of the key space moved elsewhere and a link left in its place (by hand,
    or by another user of the share): no read, write, delete or listing goes through it.
    Each call is refused naming the link and the fix, and nothing outside the store is
    read, written or removed (a delete through it would remove someone else's file)."""
    store.put("pipe/data/a", b"mine")
    store.put("pipe/data/b", b"mine too")
    outside = root.parent / "elsewhere"
    outside.mkdir()
    moved = root / "pipe=" if depth == 1 else root / "pipe=" / "data="
    os.rename(moved, outside / moved.name)
    moved.symlink_to(outside / moved.name)
    before = _outside(outside)
    assert len(before) == 2
    calls: dict[str, Callable[[], object]] = {
        "get": lambda: store.get("pipe/data/a"),
        "head": lambda: store.head("pipe/data/a"),
        "open": lambda: store.open("pipe/data/a"),
        "create": lambda: store.put("pipe/data/new", b"x", mode=CREATE),
        "update": lambda: store.put("pipe/data/a", b"x", mode=PutMode.update('"0123"')),
        "overwrite": lambda: store.put("pipe/data/a", b"x"),
        "delete": lambda: store.delete("pipe/data/a"),
        "list": lambda: list(store.list_keys("pipe/data/")),
    }
    for name, call in calls.items():
        with pytest.raises(StoreError) as raised:
            call()
        said = str(raised.value)
        assert os.fsdecode(moved) in said and "symbolic link" in said, (name, said)
        assert "remove it" in said, (name, said)
    assert _outside(outside) == before  # nothing read through it was written back
    assert list(store.list_keys("")) == []  # a listing of the whole store passes over it
    assert os.listdir(store.directory.tmp) == []


def test_a_task_whose_data_directory_became_a_link_is_refused_and_nothing_outside_goes(
    root: Path, store: FileStore
) -> None:
    """Through the public API: a consumer's read meets the link and stops, naming it, as a
    delete of the entry's data does (gc's); the files it points at stay."""
    task = om.Task.create(store, "job", stages=["a", "b"])
    task.declare("x", "a")
    agent = task.agent("p")
    claim = agent.claim(stage="a")
    assert claim is not None
    entry = agent.put(claim, b"payload")
    directory = root / os.fsdecode(os.path.dirname(store.object_path(entry.key)))
    directory = directory.relative_to(root)
    top = root / directory.parts[0]
    outside = root.parent / "elsewhere"
    outside.mkdir()
    os.rename(top, outside / top.name)
    top.symlink_to(outside / top.name)
    before = _outside(outside)
    with pytest.raises(StoreError, match="symbolic link"):
        task.agent("q").consume("x")
    with pytest.raises(StoreError, match="symbolic link"):
        store.delete(entry.key)
    assert _outside(outside) == before


@pytest.mark.parametrize("name", ["tmp", "uploads"])
def test_the_stores_own_directories_are_never_a_link(tmp_path: Path, name: str) -> None:
    """``.objmanifest/tmp`` (where every write starts, and which the sweep empties) or
    ``uploads`` made a link: the store refuses to open, and a sweep never empties a link's
    directory."""
    root = tmp_path / "store"
    root.mkdir()
    store = FileStore(str(root))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "old-file").write_bytes(b"keep")
    os.utime(outside / "old-file", (0, 0))  # as old as a dead writer's temporary file
    own = root / ".objmanifest" / name
    shutil.rmtree(own)
    own.symlink_to(outside)
    with pytest.raises(StoreError, match=f"{name} is a symbolic link.*move it away"):
        FileStore(str(root))
    if name == "tmp":
        with pytest.raises(OSError):
            store.directory.sweep(time.time(), older=0)
    assert (outside / "old-file").read_bytes() == b"keep"


def _victim(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A directory outside the store shaped like ``.objmanifest/``, with old files in its
    ``tmp/`` (what a sweep removes) and an upload's directory that names a key."""
    victim = tmp_path / "victim"
    (victim / "tmp" / "olddir").mkdir(parents=True)
    (victim / "tmp" / "precious").write_bytes(b"keep")
    (victim / "tmp" / "olddir" / "inside").write_bytes(b"keep too")
    (victim / "uploads" / "u1").mkdir(parents=True)
    (victim / "uploads" / "u1" / "key").write_bytes(b"obj")
    for path in victim.rglob("*"):
        os.utime(path, (0, 0), follow_symlinks=False)
    return victim, _outside(victim)


def test_the_stores_own_directory_swapped_for_a_link_after_it_opened_is_never_followed(
    tmp_path: Path,
) -> None:
    """``.objmanifest/`` replaced by a link while a store is open (another user of the
    share): the sweep removes nothing there, writes start no file there, the clock stamps
    nothing there, and uploads neither write nor read there."""
    root = tmp_path / "store"
    root.mkdir()
    store = FileStore(str(root))
    store.put("kept", b"before")
    victim, before = _victim(tmp_path)
    reserved = root / ".objmanifest"
    shutil.rmtree(reserved)
    reserved.symlink_to(victim)
    with pytest.raises(OSError):
        store.directory.sweep(time.time() + 10 * 365 * 86400, older=0)
    with pytest.raises(StoreError, match="symbolic link"):
        store.put("new", b"x", mode=CREATE)
    with pytest.raises(StoreError):
        store.now()
    with pytest.raises(StoreError, match="symbolic link"):
        store.upload_part("obj", "u1", 1, b"part")
    with pytest.raises(StoreError, match="symbolic link"):
        store.create_upload("obj")
    with pytest.raises(StoreError, match="symbolic link"):
        store.delete("kept")  # its lock file is never opened there
    with pytest.raises(StoreError, match="symbolic link"):
        FileStore(str(root))
    assert _outside(victim) == before
    assert sorted(p.name for p in victim.iterdir()) == ["tmp", "uploads"]


def test_an_uploads_directory_swapped_for_a_link_is_never_written_into(
    tmp_path: Path, store: FileStore
) -> None:
    """``uploads/ID`` replaced by a link to a directory that names the same key: a part is
    refused, and completing never reads its bytes into an object."""
    upload_id = store.create_upload("obj")
    store.upload_part("obj", upload_id, 1, b"mine")
    victim, before = _victim(tmp_path)
    (victim / "uploads" / "u1" / "1.0123456789abcdef0123456789abcdef").write_bytes(b"secret")
    before = _outside(victim)
    own = Path(store.root) / ".objmanifest" / "uploads" / upload_id
    shutil.rmtree(own)
    own.symlink_to(victim / "uploads" / "u1")
    with pytest.raises(StoreError, match="symbolic link"):
        store.upload_part("obj", upload_id, 2, b"more")
    with pytest.raises(StoreError, match="symbolic link"):
        store.complete_upload("obj", upload_id, ['"0123456789abcdef0123456789abcdef"'])
    with pytest.raises(NoSuchObject):
        store.get("obj")
    assert _outside(victim) == before


def test_a_link_named_as_an_object_is_not_listed(root: Path, store: FileStore) -> None:
    """A link in the key space, named as an object or a directory of the store's, is none of
    the store's: listings pass over it (and a read of its key names it)."""
    outside = root.parent / "elsewhere"
    outside.mkdir()
    (outside / "secret").write_bytes(b"x")
    (outside / "d=").mkdir()
    (outside / "d=" / "k").write_bytes(b"y")
    store.put("real", b"z")
    (root / "obj").symlink_to(outside / "secret")
    (root / "d=").symlink_to(outside / "d=")
    assert list(store.list_keys("")) == ["real"]
    assert [row.key for row in store.list("", delimiter="/")] == ["real"]
    with pytest.raises(StoreError, match="symbolic link"):
        store.get("obj")


def test_a_listing_of_a_store_emptied_under_it_says_the_store_is_gone(
    root: Path, store: FileStore
) -> None:
    """A listing under way when the store's directory is emptied (a share unmounted) fails
    saying so, never ends early as if the rest of the keys were not there."""
    for key in ("a/1", "b/1", "c/1"):
        store.put(key, b"x")
    rows = store.list("")
    assert next(rows).key == "a/1"
    for child in root.iterdir():
        subprocess.run(["rm", "-rf", str(child)], check=True)
    with pytest.raises(StoreError, match="no longer holds the store"):
        list(rows)


@pytest.mark.timeout(60)
def test_a_fifo_put_in_an_upload_never_hangs_a_call(root: Path, store: FileStore) -> None:
    """A FIFO where an upload keeps its key, or in place of a part, is no file of the
    upload's: listings pass over the upload and completion refuses the part, at once (an
    open of a FIFO without a writer would wait for ever)."""
    first = store.create_upload("a")
    store.upload_part("a", first, 1, b"part")
    second = store.create_upload("b")
    etag = store.upload_part("b", second, 1, b"part")
    uploads = root / ".objmanifest" / "uploads"
    (uploads / first / "key").unlink()
    os.mkfifo(uploads / first / "key")
    [part] = [p for p in (uploads / second).iterdir() if p.name != "key"]
    part.unlink()
    os.mkfifo(part)
    assert [upload_id for _, upload_id in store.list_uploads("")] == [second]
    with pytest.raises(UploadGone):
        store.list_parts("a", first)
    with pytest.raises(PartsRejected, match="InvalidPart 1"):
        store.complete_upload("b", second, [etag])


def test_directories_deeper_than_any_key_are_passed_over(root: Path, store: FileStore) -> None:
    """Thousands of nested directories put in the key space or in ``tmp/`` by hand: a
    listing passes over what no key can reach, and the sweep leaves what it cannot remove,
    never failing with a ``RecursionError``."""
    store.put("k", b"x")
    for top in (root, root / ".objmanifest" / "tmp" / "old"):
        deep = os.open(top.parent if top.name == "old" else top, os.O_RDONLY)
        if top.name == "old":
            os.mkdir("old", dir_fd=deep)
            os.close(deep)
            deep = os.open(top, os.O_RDONLY)
        for _ in range(1200):
            os.mkdir("a=", dir_fd=deep)
            inner = os.open("a=", os.O_RDONLY, dir_fd=deep)
            os.close(deep)
            deep = inner
        os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=deep))
        os.close(deep)
    try:
        assert list(store.list_keys("")) == ["k"]
        assert [row.key for row in store.list("", delimiter="/")] == ["k"]
        store.directory.sweep(time.time() + 86400, older=0)
        assert store.get("k").body == b"x"  # type: ignore[union-attr]
    finally:  # without recursion: pytest's own clean-up of tmp_path recurses
        for top in (root / "a=", root / ".objmanifest" / "tmp" / "old"):
            _remove_chain(top)


def _remove_chain(top: Path) -> None:
    """Remove a chain of nested directories ``a=`` (and files in them), deepest first."""
    chain = [os.open(top, os.O_RDONLY)] if top.exists() else []
    while chain and "a=" in os.listdir(chain[-1]):
        chain.append(os.open("a=", os.O_RDONLY, dir_fd=chain[-1]))
    while chain:
        fd = chain.pop()
        for name in os.listdir(fd):
            os.unlink(name, dir_fd=fd)
        os.close(fd)
        if chain:
            os.rmdir("a=", dir_fd=chain[-1])
    if top.exists():
        top.rmdir()


def test_a_create_whose_temporary_file_has_another_name_is_refused_if_the_key_exists(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create-only write that finds the key taken is a lost race, even when its
    temporary file has another link (made by someone else in the store meanwhile): only
    the object's own file being the very file written counts as its own create."""
    store.put("k", b"holder-A", mode=CREATE)
    real_link = os.link

    def link_with_another_name(source: Any, target: Any, **at: Any) -> None:
        real_link(source, b"another-name", src_dir_fd=at["src_dir_fd"], dst_dir_fd=at["src_dir_fd"])
        real_link(source, target, **at)

    monkeypatch.setattr(os, "link", link_with_another_name)
    with pytest.raises(PreconditionFailed):
        store.put("k", b"holder-B", mode=CREATE)
    monkeypatch.undo()
    assert store.get("k").body == b"holder-A"  # type: ignore[union-attr]


def test_a_lock_taken_inside_another_after_the_lock_file_was_replaced_keeps_both(
    store: FileStore,
) -> None:
    """The lock file replaced between two locks of one thread (the store's directory
    restored): the inner lock is taken through a description of the new file, and the outer
    one stays held through its own until released (closing it would drop it)."""
    locks = os.path.join(store.directory.reserved, b"locks")
    with store.locked(["upload:u"]):
        os.unlink(locks)
        with store.locked(["k"]):
            pass
    with store.locked(["upload:u"]), store.locked(["k"]):
        pass


def test_a_key_of_many_segments_needs_no_more_descriptors_than_a_short_one(
    root: Path,
) -> None:
    """A directory is closed once the next one down is open: a key of hundreds of segments
    is written, read, listed and deleted with the process allowed 40 open files."""
    script = f"""
import resource
from objmanifest.store.file import FileStore
resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))
store = FileStore({str(root)!r})
for key in ("/" * 300 + "x", "/" * 40 + "%" * 900 + "/x"):  # the second: long escaped names
    store.put(key, b"deep")
    assert store.get(key).body == b"deep"
    assert list(store.list_keys("")) == [key]
    assert [row.key for row in store.list("", delimiter="/")] == ["/"]
    store.delete(key)
    assert list(store.list_keys("")) == []
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("depth", [513, 1000])
def test_keys_of_a_thousand_empty_segments_are_listed(store: FileStore, depth: int) -> None:
    """Legal keys nest a directory per segment, up to a thousand: listed (and rolled up
    into a prefix) like any other, without recursion."""
    key = "/" * depth + "x"
    store.put(key, b"deep")
    try:
        assert list(store.list_keys("")) == [key]
        assert [row.key for row in store.list("", delimiter="/")] == ["/"]
        assert [row.key for row in store.list("/" * (depth - 1), delimiter="/")] == ["/" * depth]
    finally:  # its directories go with it (pytest's own clean-up of tmp_path recurses)
        store.delete(key)
    assert os.listdir(store.root) == [".objmanifest"]


def test_a_listing_of_parts_racing_an_abort_says_the_upload_is_gone(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``list_parts`` whose upload is aborted as it reads the parts: ``UploadGone``, as for
    an upload aborted before, never a store error about a part file gone."""
    upload_id = store.create_upload("k")
    store.upload_part("k", upload_id, 1, b"part")
    real_scandir = os.scandir
    raced: list[bool] = []

    def scandir_then_abort(where: Any) -> Any:
        found = list(real_scandir(where))
        if not raced and any(e.name.startswith("1.") for e in found):
            raced.append(True)
            store.abort_upload("k", upload_id)
        return contextlib.nullcontext(found)

    monkeypatch.setattr(os, "scandir", scandir_then_abort)
    with pytest.raises(UploadGone):
        store.list_parts("k", upload_id)
    assert raced == [True]


def test_a_link_where_the_stores_own_directory_was_is_no_store(
    root: Path, store: FileStore
) -> None:
    """The store's directory emptied and a link left where ``.objmanifest/`` was: every
    call says the store is gone, never that the keys are not there."""
    store.put("k", b"x")
    elsewhere = root.parent / "elsewhere"
    elsewhere.mkdir()
    for child in root.iterdir():
        subprocess.run(["rm", "-rf", str(child)], check=True)
    (root / ".objmanifest").symlink_to(elsewhere)
    with pytest.raises(StoreError, match="no longer holds the store"):
        list(store.list_keys(""))
    with pytest.raises(StoreError, match=r"no longer holds the store|symbolic link"):
        store.get("k")


def test_a_temporary_file_swapped_for_a_link_is_never_linked_in_its_place(
    tmp_path: Path, store: FileStore
) -> None:
    """The temporary file of a create-only write replaced by a link to a file outside the
    store before it is linked into place: the link itself is linked, never the file it
    points at, so the store never hands out the outside file's bytes."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the store's")
    secret.chmod(0o600)

    def write_then_swap(fd: int) -> str:
        etag = file_io.write_object(fd, b"mine", {})
        [name] = os.listdir(store.directory.tmp)
        temp = os.path.join(store.directory.tmp, os.fsencode(name))
        os.unlink(temp)
        os.symlink(secret, temp)
        return etag

    store.place("innocent", write_then_swap, CREATE)
    with pytest.raises(StoreError, match="symbolic link"):
        store.get("innocent")
    assert os.stat(secret).st_nlink == 1
    assert secret.read_bytes() == b"not the store's"


# -- permissions, read-only and full filesystems -----------------------------------------------


def as_nobody(call: Callable[[], Any]) -> str:
    """``call`` in a forked child running as ``nobody`` (or as this user when it is not
    root, which then lacks the permissions the test takes away): what it raised."""
    if os.geteuid() != 0:
        try:
            call()
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "no error"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            call()
            said = "no error"
        except BaseException as e:
            said = f"{type(e).__name__}: {e}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        said = answer.read().decode()
    os.waitpid(pid, 0)
    return said


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory ``nobody`` can reach (``tmp_path`` is under a directory only root may
    enter)."""
    path = Path(tempfile.mkdtemp(prefix="objmanifest-file-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_directory_the_user_may_not_enter_is_access_denied_with_the_fix(
    shared_dir: Path,
) -> None:
    root = shared_dir / "store"
    root.mkdir(mode=0o700)
    if os.geteuid() != 0:
        root.chmod(0o000)
    said = as_nobody(lambda: FileStore(str(root)))
    root.chmod(0o700)
    assert said.startswith("AccessDenied: ") and str(root) in said and "chmod" in said, said


def test_a_store_the_user_may_read_but_not_write_reads_and_refuses_writes(
    shared_dir: Path,
) -> None:
    root = shared_dir / "store"
    root.mkdir()
    store = FileStore(str(root))
    etag = store.put("k", b"v")
    store.now()
    if os.geteuid() != 0:
        for directory, _, _ in os.walk(root):
            os.chmod(directory, 0o555)

    def read_then_write() -> None:
        mine = FileStore(str(root))
        assert mine.get("k").body == b"v"  # type: ignore[union-attr]
        mine.put("k", b"w", mode=PutMode.update(etag))

    said = as_nobody(read_then_write)
    assert said.startswith("AccessDenied: could not write file://"), said
    assert "permission denied" in said and "chmod -R" in said, said
    assert store.get("k").body == b"v"  # type: ignore[union-attr]
    for directory, _, _ in os.walk(root):
        os.chmod(directory, 0o755)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A tiny filesystem of its own (a tmpfs of 1 MiB), to fill up or make read-only."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root with CAP_SYS_ADMIN needed): {made.stderr}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_filesystem_is_a_store_error_and_the_old_version_stays(tmpfs: Path) -> None:
    store = FileStore(str(tmpfs))
    body = os.urandom(600 * 1024)
    etag = store.put("big", body)
    with pytest.raises(StoreError, match=r"no space left on the filesystem holding .*free space"):
        store.put("big", os.urandom(600 * 1024), mode=PutMode.update(etag))
    assert store.get("big").body == body  # type: ignore[union-attr]
    assert os.listdir(tmpfs / ".objmanifest" / "tmp") == []  # the half-written file went


def test_a_read_only_filesystem_reads_and_refuses_writes_with_the_fix(tmpfs: Path) -> None:
    store = FileStore(str(tmpfs))
    etag = store.put("k", b"v")
    del store  # its lock file's descriptor is open for writing: a remount would be refused
    gc.collect()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    again = FileStore(str(tmpfs))
    assert again.get("k").body == b"v"  # type: ignore[union-attr]
    assert abs(again.now().timestamp() - time.time()) < 60  # by this machine's clock
    for write in (
        lambda: again.put("k", b"w", mode=PutMode.update(etag)),
        lambda: again.put("new", b"w", mode=CREATE),
    ):
        with pytest.raises(StoreError, match="read-only filesystem; mount it read-write"):
            write()


# -- system calls that fail after they may have happened (NFS) ----------------------------------


def test_a_link_resent_by_nfs_and_answered_exists_is_our_own_create(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_link = os.link

    def link_then_exists(source: bytes, target: bytes, **at: Any) -> None:
        real_link(source, target, **at)  # the first LINK landed; its answer was lost; the resent
        raise FileExistsError(errno.EEXIST, "File exists")  # one found the file there

    monkeypatch.setattr(os, "link", link_then_exists)
    etag = store.put("k", b"mine", mode=CREATE)
    monkeypatch.undo()
    assert store.get("k").etag == etag  # type: ignore[union-attr]
    with pytest.raises(PreconditionFailed):
        store.put("k", b"another", mode=CREATE)


def test_a_directory_handle_gone_stale_on_nfs_is_walked_again(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On NFS, a directory removed by another machine (a delete that left it empty) between
    this one's walk and its rename or open answers ``ESTALE`` for the handle walked: the
    write and the read walk again from the store's directory, as a whole path would have
    been looked up again, and neither fails nor says its outcome is unknown."""
    before = store.put("pipe/k", b"before")
    real_rename, real_open = os.rename, os.open
    stale: list[str] = []

    def rename_once_stale(source: Any, target: Any, **at: Any) -> None:
        if "rename" not in stale:
            stale.append("rename")
            raise OSError(errno.ESTALE, "Stale file handle")
        real_rename(source, target, **at)

    def open_once_stale(path: Any, flags: int, *args: Any, **at: Any) -> int:
        if path == b"k" and at.get("dir_fd") is not None and "open" not in stale:
            stale.append("open")
            raise OSError(errno.ESTALE, "Stale file handle")
        return real_open(path, flags, *args, **at)

    def dir_open_once_stale(path: Any, flags: int, *args: Any, **at: Any) -> int:
        if path == b"pipe=" and at.get("dir_fd") is not None and stale.count("walk") < 2:
            stale.append("walk")
            raise OSError(errno.ESTALE, "Stale file handle")
        return real_open(path, flags, *args, **at)

    monkeypatch.setattr(os, "open", dir_open_once_stale)
    store.put("pipe/other", b"x", mode=CREATE)
    store.delete("pipe/other")
    monkeypatch.undo()
    assert stale == ["walk", "walk"]
    stale.clear()
    monkeypatch.setattr(os, "rename", rename_once_stale)
    etag = store.put("pipe/k", b"after", mode=PutMode.update(before))
    monkeypatch.setattr(os, "open", open_once_stale)
    assert store.get("pipe/k") == store.get("pipe/k")
    monkeypatch.undo()
    assert stale == ["rename", "open"]
    assert store.get("pipe/k").body == b"after"  # type: ignore[union-attr]
    assert store.get("pipe/k").etag == etag  # type: ignore[union-attr]


@pytest.mark.parametrize("landed", [True, False])
def test_a_rename_that_fails_with_an_io_error_is_outcome_unknown_unless_seen_in_place(
    store: FileStore, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    before = store.put("k", b"before")
    real_rename = os.rename

    def rename_then_eio(source: bytes, target: bytes, **at: Any) -> None:
        if landed:
            real_rename(source, target, **at)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "rename", rename_then_eio)
    if landed:
        etag = store.put("k", b"after", mode=PutMode.update(before))
        monkeypatch.undo()
        assert store.get("k").etag == etag  # type: ignore[union-attr]
    else:
        with pytest.raises(OutcomeUnknown):
            store.put("k", b"after", mode=PutMode.update(before))
        monkeypatch.undo()
        assert store.get("k").body == b"before"  # type: ignore[union-attr]
    assert os.listdir(store.directory.tmp) == []


@pytest.mark.parametrize(
    ("code", "kind", "says"),
    [
        (errno.EACCES, AccessDenied, "permission denied on .*chmod"),
        (errno.ENOSPC, StoreError, "no space left .*free space"),
        (errno.EDQUOT, StoreError, "raise the quota"),
        (errno.EROFS, StoreError, "read-only filesystem; mount it read-write"),
        (errno.EMFILE, StoreError, "too many open files.*ulimit -n"),
        (errno.EIO, StoreError, "Input/output error"),
    ],
)
def test_each_failure_of_a_write_names_the_object_its_file_and_the_fix(
    store: FileStore, monkeypatch: pytest.MonkeyPatch, code: int, kind: type, says: str
) -> None:
    def fail(*args: Any, **kwargs: Any) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(kind, match=says) as raised:
        store.put("some/key", b"x")
    monkeypatch.undo()
    assert "file://" in str(raised.value) and "some/key" in str(raised.value)
    assert type(raised.value) is not OutcomeUnknown
    with pytest.raises(NoSuchObject):
        store.get("some/key")
    assert os.listdir(store.directory.tmp) == []
