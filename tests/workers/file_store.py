"""A process using a ``FileStore``, for ``tests/test_file_store.py``.

``python tests/workers/file_store.py ROOT MODE ...``:

* ``create GO KEY...``: once the file ``GO`` exists, a create-only put of each key with
  this process's id as its body; prints ``won KEY`` or ``lost KEY`` for each.
* ``increment GO KEY THREADS COUNT``: once ``GO`` exists, ``THREADS`` threads each add 1 to
  the number in ``KEY`` ``COUNT`` times (read, then update-if-match, again on a lost race);
  prints ``done N`` (N increments made).
* ``killed MODE KEY BODY STEP``: a put of ``BODY`` (``MODE``: ``update``, with the ETag
  read first, or ``create``) whose ``STEP``-th system call of the store's (counted from the
  put's start) is never made: the process kills itself with SIGKILL just before it. Prints
  ``done CALLS`` if the put ended first.
* ``now``: prints ``now STORE_TIME WALL_TIME`` (seconds since the epoch): the store's clock
  and this process's.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from objmanifest.store import CREATE, PutMode
from objmanifest.store.errors import PreconditionFailed
from objmanifest.store.file import FileStore

SYSCALLS = ("open", "write", "writev", "pwrite", "fsync", "close", "link", "rename", "unlink")


def wait_for(go: str) -> None:
    while not os.path.exists(go):
        time.sleep(0.001)


def create(store: FileStore, go: str, keys: list[str]) -> None:
    wait_for(go)
    for key in keys:
        try:
            store.put(key, str(os.getpid()).encode(), mode=CREATE)
            print("won", key, flush=True)
        except PreconditionFailed:
            print("lost", key, flush=True)


def increment(store: FileStore, go: str, key: str, threads: int, count: int) -> None:
    done = [0] * threads

    def run(i: int) -> None:
        while done[i] < count:
            blob = store.get(key)
            assert blob is not None
            try:
                store.put(key, b"%d" % (int(blob.body) + 1), mode=PutMode.update(blob.etag))
            except PreconditionFailed:
                continue
            done[i] += 1

    wait_for(go)
    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print("done", sum(done), flush=True)


def killed(store: FileStore, mode: str, key: str, body: str, step: int) -> None:
    put_mode = PutMode.update(store.head(key).etag) if mode == "update" else CREATE
    calls = 0

    def counted(call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == step:
                os.kill(os.getpid(), signal.SIGKILL)
            return call(*args, **kwargs)

        return wrapper

    for name in SYSCALLS:
        setattr(os, name, counted(getattr(os, name)))
    fcntl.fcntl = counted(fcntl.fcntl)
    store.put(key, body.encode(), mode=put_mode)
    print("done", calls, flush=True)


def main() -> None:
    root, mode, *args = sys.argv[1:]
    store = FileStore(root)
    if mode == "create":
        create(store, args[0], args[1:])
    elif mode == "increment":
        increment(store, args[0], args[1], int(args[2]), int(args[3]))
    elif mode == "killed":
        killed(store, args[0], args[1], args[2], int(args[3]))
    elif mode == "now":
        print("now", store.now().timestamp(), time.time(), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
