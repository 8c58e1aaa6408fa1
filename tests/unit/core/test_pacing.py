"""The pauses of a wait: quick while work moves, slow while nothing happens."""

from __future__ import annotations

import math

import pytest

from objmanifest.core.pacing import Pace
from objmanifest.errors import InvalidInput


def test_an_idle_wait_slows_down_to_one_look_every_idle_seconds() -> None:
    pace = Pace()
    pauses = [pace.after(changed=False, writing=False) for _ in range(40)]
    assert pauses[0] == 0.25
    assert pauses == sorted(pauses)  # never quicker while nothing happens
    assert pauses[-10:] == [2.0] * 10
    assert 60 / pauses[-1] <= 30  # looks a minute, once settled


def test_a_change_makes_it_quick_again_and_it_slows_down_from_there() -> None:
    pace = Pace()
    for _ in range(20):
        pace.after(changed=False, writing=False)
    assert pace.after(changed=True, writing=False) == 0.25
    assert pace.after(changed=False, writing=False) == 0.375


def test_while_the_entry_is_written_it_looks_at_least_every_half_second() -> None:
    pace = Pace()
    for _ in range(20):
        pace.after(changed=False, writing=False)
    pauses = [pace.after(changed=False, writing=True) for _ in range(20)]
    assert max(pauses) == 0.5
    assert pace.after(changed=False, writing=False) == 2.0  # written, and gone quiet again


@pytest.mark.parametrize(
    "bad",
    [
        {"first": 0},
        {"idle": -1},
        {"writing": math.nan},
        {"first": math.inf},
        {"growth": 0.5},
        {"growth": math.inf},
    ],
)
def test_a_pace_that_would_spin_or_never_look_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(InvalidInput, match="Pace"):
        Pace(**bad)
