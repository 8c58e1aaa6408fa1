"""The store clock: only the store's Date headers and this machine's monotonic clock count."""

from __future__ import annotations

from datetime import datetime, timezone
from email.utils import format_datetime

import pytest

from objmanifest.errors import StoreError
from objmanifest.store import StoreClock


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def mono() -> FakeMonotonic:
    return FakeMonotonic()


def date(ts: float) -> dict[str, str]:
    return {"date": format_datetime(datetime.fromtimestamp(ts, tz=timezone.utc), usegmt=True)}


def test_unknown_until_a_response_says(mono: FakeMonotonic) -> None:
    clock = StoreClock(monotonic=mono)
    assert not clock.known
    with pytest.raises(StoreError, match="the store's time is not known yet"):
        clock.now()
    clock.observe({})
    assert not clock.known


def test_advances_by_the_monotonic_clock_between_answers(mono: FakeMonotonic) -> None:
    clock = StoreClock(monotonic=mono)
    clock.observe(date(1_800_000_000))
    mono.now += 7.5
    assert clock.now().timestamp() == pytest.approx(1_800_000_007.5, abs=0.001)


def test_keeps_the_latest_estimate_of_whole_second_dates(mono: FakeMonotonic) -> None:
    clock = StoreClock(monotonic=mono)
    clock.observe(date(1_800_000_000))  # true time 1_800_000_000.9, truncated
    mono.now += 0.5
    clock.observe(date(1_800_000_001))  # a later answer pins it closer
    mono.now += 0.5
    assert clock.now().timestamp() == pytest.approx(1_800_000_001.5, abs=0.001)


def test_a_store_clock_stepped_back_is_followed_within_the_window(mono: FakeMonotonic) -> None:
    clock = StoreClock(window=60, monotonic=mono)
    clock.observe(date(1_800_000_000))
    mono.now += 1
    clock.observe(date(1_799_999_991))  # the store's clock went back 10 s
    assert clock.now().timestamp() == pytest.approx(1_800_000_001, abs=0.001)  # still the old view
    mono.now += 61
    clock.observe(date(1_800_000_052))
    assert clock.now().timestamp() == pytest.approx(1_800_000_052, abs=0.001)


def test_when_the_best_answer_leaves_the_window_the_next_best_counts(mono: FakeMonotonic) -> None:
    clock = StoreClock(window=60, monotonic=mono)
    clock.observe(date(1_800_000_000))  # the best estimate: offset 1_800_000_000 - 1000
    assert clock.now().timestamp() == pytest.approx(1_800_000_000, abs=0.001)
    mono.now += 30
    clock.observe(date(1_800_000_020))  # 10 s behind the first (the store stepped back)
    mono.now += 10
    clock.observe(date(1_800_000_025))  # 15 s behind
    assert clock.now().timestamp() == pytest.approx(1_800_000_040, abs=0.001)  # still the first
    mono.now += 21  # the first is 61 s old: the next answer lets it go
    clock.observe(date(1_800_000_040))  # 21 s behind
    assert clock.now().timestamp() == pytest.approx(
        1_800_000_061 - 10, abs=0.001
    )  # the second's view
    mono.now += 31  # the second is 62 s old, the third 41 s
    clock.observe(date(1_800_000_050))
    assert clock.now().timestamp() == pytest.approx(1_800_000_092 - 15, abs=0.001)  # the third's


def test_a_better_answer_raises_the_estimate_at_once(mono: FakeMonotonic) -> None:
    clock = StoreClock(monotonic=mono)
    clock.observe(date(1_800_000_000))
    assert clock.now().timestamp() == pytest.approx(1_800_000_000, abs=0.001)
    clock.observe(date(1_800_000_003))  # the same instant, a later Date: ahead by 3 s
    assert clock.now().timestamp() == pytest.approx(1_800_000_003, abs=0.001)
    clock.observe(date(1_800_000_001))  # a worse one does not pull it back
    assert clock.now().timestamp() == pytest.approx(1_800_000_003, abs=0.001)


def test_answers_with_the_same_date_are_read_as_that_second(mono: FakeMonotonic) -> None:
    clock = StoreClock(monotonic=mono)
    clock.observe(date(1_800_000_000))
    mono.now += 0.75
    clock.observe(date(1_800_000_000))  # the same header, later: a worse estimate
    assert clock.now().timestamp() == pytest.approx(1_800_000_000.75, abs=0.001)
    clock.observe(date(1_800_000_001))  # a new second is read as such
    assert clock.now().timestamp() == pytest.approx(1_800_000_001, abs=0.001)
