"""Run by tests/test_upgrade.py under objmanifest 0.1.0 (PYTHONPATH = the extracted release):
an agent of the previous release on the same task as the new code.

    python tests/workers/upgrade.py work URL ENDPOINT TASK_ID
        works on the task at schema 1: consumes page-3, takes text-3 and late to ready,
        declares extra; prints the task's status as JSON.
    python tests/workers/upgrade.py chunked URL ENDPOINT TASK_ID SOURCE
        consumes big-new (a chunked entry the new code produced, with its whole-object
        checksum), then claims big-again (failed under the new code) and produces it again,
        chunked, from SOURCE; prints the xxh3 of what it consumed and the entry it made.
    python tests/workers/upgrade.py refuse URL ENDPOINT TASK_ID HEADER_FILE
        after migrate: opens the task, and (as an agent that opened it before the
        migration, from HEADER_FILE's schema-1 header) tries claim, put, declare, reap,
        status; prints, per attempt, the error's class and message as JSON.

Only 0.1.0's public API (and its TaskHeader, for the agent that opened the task earlier).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from objmanifest.model import TaskHeader

import objmanifest as om
from objmanifest import checksum


def work(task: om.Task) -> dict[str, Any]:
    agent = task.agent("old-parser")
    agent.consume("page-3")
    claim = agent.claim("text-3")
    assert claim is not None
    agent.put(claim, b"words of page 3, by 0.1.0")
    claim = agent.claim("late")
    assert claim is not None
    agent.put(claim, b"late, by 0.1.0")
    task.declare("extra", "report")
    status = task.status()
    return {"version": om.__version__, "status": json.loads(status.model_dump_json())}


def chunked(task: om.Task, source: str) -> dict[str, Any]:
    agent = task.agent("old-chunker")
    data = agent.consume("big-new")
    claim = agent.claim("big-again")
    assert claim is not None
    entry = agent.put(claim, source, threshold=5 << 20, part_size=5 << 20)
    return {
        "consumed": checksum.of_bytes(data),
        "entry": json.loads(entry.model_dump_json()),
    }


def attempt(name: str, call: Callable[[], object]) -> dict[str, str]:
    try:
        call()
    except om.ObjManifestError as e:
        return {"op": name, "error": type(e).__name__, "message": str(e)}
    return {"op": name, "error": "", "message": "it worked"}


def refuse(url: str, endpoint: str, task_id: str, header_file: str) -> list[dict[str, str]]:
    store = om.connect(url, endpoint_url=endpoint)
    results = [attempt("open", lambda: om.Task.open(store, task_id))]
    header = TaskHeader.model_validate_json(Path(header_file).read_bytes())
    stale = om.Task(store, header)  # an agent that opened the task before the migration
    agent = stale.agent("old-straggler")

    def put() -> None:
        claim = agent.claim("summary")
        assert claim is not None
        agent.put(claim, b"must never land")

    results.append(attempt("claim", lambda: agent.claim(stage="report")))
    results.append(attempt("put", put))
    results.append(attempt("declare", lambda: stale.declare("newcomer", "fetch")))
    results.append(attempt("reap", stale.reap))
    results.append(attempt("status", stale.status))
    results.append(attempt("consume", lambda: agent.consume("page-4")))
    return results


def main(argv: list[str]) -> None:
    mode, url, endpoint, task_id = argv[:4]
    if mode == "work":
        task = om.Task.open(om.connect(url, endpoint_url=endpoint), task_id)
        print(json.dumps(work(task)))
    elif mode == "chunked":
        task = om.Task.open(om.connect(url, endpoint_url=endpoint), task_id)
        print(json.dumps(chunked(task, argv[4])))
    else:
        print(json.dumps(refuse(url, endpoint, task_id, argv[4])))


if __name__ == "__main__":
    main(sys.argv[1:])
