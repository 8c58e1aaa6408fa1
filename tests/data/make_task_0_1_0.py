"""Regenerate ``tests/data/task-0.1.0/``: a task written by objmanifest 0.1.0 (schema 1,
before the journal), stopped mid-pipeline, for tests/test_upgrade.py.

Run with the 0.1.0 source on the path (the release is ``tests/data/objmanifest-0.1.0.tar.gz``)
and a Python that has boto3, pydantic, xxhash and moto (the worktree's venv)::

    rm -rf /tmp/om010 && mkdir /tmp/om010
    tar -xzf tests/data/objmanifest-0.1.0.tar.gz -C /tmp/om010
    PYTHONPATH=/tmp/om010 .venv/bin/python tests/data/make_task_0_1_0.py tests/data/task-0.1.0

It starts 0.1.0's own moto server, runs a three-stage task so that it holds entries in every
state (pending, writing with a lease, ready, consumed, failed, dead), and dumps every object
under the store's prefix: ``DEST/<key>`` holds the bytes of ``<key>``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import objmanifest as om
from objmanifest import servers

assert om.__version__ == "0.1.0", f"run this with objmanifest 0.1.0, not {om.__version__}"

TASK_ID = "legacy"
STAGES = ("fetch", "parse", "report")


def build(task: om.Task) -> None:
    """A dozen entries across three stages, in every state; one chain of dependencies."""
    for i in range(6):
        task.declare(f"page-{i}", "fetch")
    for i in range(4):
        task.declare(f"text-{i}", "parse", depends_on=[f"page-{i}"])
    task.declare("summary", "report", depends_on=["text-0", "text-1"], consumers=["mailer"])
    task.declare("late", "report")
    fetcher, parser = task.agent("fetcher-1"), task.agent("parser-1")
    for i in range(4):  # page-0..3 ready
        claim = fetcher.claim(f"page-{i}")
        assert claim is not None
        fetcher.put(claim, f"<html>page {i}</html>".encode())
    for i in range(2):  # page-0, page-1 consumed; text-0, text-1 ready
        parser.consume(f"page-{i}")
        claim = parser.claim(f"text-{i}")
        assert claim is not None
        parser.put(claim, f"words of page {i}".encode())
    claim = fetcher.claim("page-4")  # failed once (retry count 1)
    assert claim is not None
    fetcher.fail(claim, "HTTP 503 from the origin")
    for _ in range(task.max_retries + 1):  # page-5 dead
        claim = fetcher.claim("page-5")
        assert claim is not None
        fetcher.fail(claim, "HTTP 404: gone for good")
    claim = parser.claim("text-2")  # writing, held by parser-1 (its lease runs out later)
    assert claim is not None
    # text-3, summary, late: pending


def main(dest: Path) -> None:
    with servers.start_moto() as local:
        os.environ.update({k: v for k, v in local.env().items() if k != "AWS_ENDPOINT_URL"})
        local.create_bucket("legacy")
        store = om.connect("s3://legacy/run", endpoint_url=local.endpoint_url)
        task = om.Task.create(store, TASK_ID, STAGES, lease_seconds=60, max_retries=2)
        build(task)
        print(task.status())
        client = local.client()
        shutil.rmtree(dest, ignore_errors=True)
        for page in client.get_paginator("list_objects_v2").paginate(Bucket="legacy"):
            for obj in page.get("Contents", []):
                key = obj["Key"].removeprefix("run/")
                body = client.get_object(Bucket="legacy", Key=obj["Key"])["Body"].read()
                path = dest / key
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(body)
                print(key, len(body))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
