"""The pauses of a wait: quick while work moves, slow while nothing happens; and the pace
of a client's writes once the store throttles them (times given, nothing timed)."""

from __future__ import annotations

import itertools
import math

import pytest

from objmanifest.core.pacing import Pace, SendRate
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


def test_writes_go_at_once_until_the_store_throttles_one() -> None:
    rate = SendRate()
    assert [rate.turn(t / 10) for t in range(50)] == [0.0] * 50  # ten a second, unpaced
    assert rate.rate(5.0) is None


def test_a_throttle_slows_the_writes_to_a_fraction_of_what_was_sent() -> None:
    rate = SendRate(decrease=0.5, recovery=0.01)
    for t in range(40):
        rate.turn(t / 10)  # ten a second
    rate.throttled(3.95)
    assert rate.rate(3.95) == pytest.approx(5.0)  # half the twenty in the two seconds before
    starts = []
    for _ in range(5):  # five writers asking at once each get their own turn
        starts.append(3.95 + rate.turn(3.95))
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert starts[0] == pytest.approx(4.15) and gaps == pytest.approx([0.2] * 4, rel=0.01)


def test_the_pace_recovers_without_throttles_and_never_falls_below_its_least() -> None:
    rate = SendRate(decrease=0.5, recovery=0.1, least=0.2)
    rate.turn(0.0)
    rate.throttled(0.0)  # one write in the last two seconds: half a write a second, halved
    assert rate.rate(0.0) == pytest.approx(0.25)
    for _ in range(5):
        rate.throttled(0.0)
    assert rate.rate(0.0) == pytest.approx(0.2)
    assert rate.rate(10.0) == pytest.approx(1.2)  # a tenth of a write a second, each second
    assert rate.turn(100.0) == 0.0  # long since its turn


@pytest.mark.parametrize(
    "bad",
    [
        {"decrease": 1.0},
        {"decrease": 0.0},
        {"decrease": math.nan},
        {"recovery": 0.0},
        {"recovery": math.inf},
        {"least": -1.0},
        {"least": math.nan},
    ],
)
def test_a_send_rate_that_would_never_slow_or_never_send_is_refused(
    bad: dict[str, float],
) -> None:
    with pytest.raises(InvalidInput, match="SendRate"):
        SendRate(**bad)
