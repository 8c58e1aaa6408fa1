"""Dependencies in every state a dependency can be in: only ready or consumed ones are met."""

from __future__ import annotations

import pytest

import objmanifest as om

pytestmark = pytest.mark.behaviour


def test_a_failed_dependency_is_not_met_until_it_is_produced(task: om.Task) -> None:
    """A failed entry has no data: its dependents wait (and status says so) until it is
    produced again."""
    task.declare("raw", stage="collect")
    task.declare("report", stage="write", depends_on=["raw"])
    producer = task.agent("producer")
    claim = producer.claim("raw")
    assert claim is not None
    assert producer.fail(claim, "source was down").state is om.State.failed

    writer = task.agent("writer")
    with pytest.raises(om.NotClaimable, match=r"raw \(failed\)") as refused:
        writer.claim("report")
    assert "waiting for dependencies" in refused.value.reason
    assert writer.claim(stage="write") is None
    blocked = task.status().blocked
    assert [(n.file_id, n.state) for n in blocked] == [("report", om.State.pending)]
    assert "raw (failed)" in blocked[0].reason
    assert task.entry("report").state is om.State.pending

    again = producer.claim("raw")
    assert again is not None and again.epoch == 2
    producer.put(again, b"raw at last")
    got = writer.claim("report")
    assert got is not None and got.file_id == "report"
    assert task.status().blocked == []
