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
    assert clock.now().timestamp() == pytest.approx(1_800_000_007.5)


def test_keeps_the_latest_estimate_of_whole_second_dates(mono: FakeMonotonic) -> None:
    clock = StoreClock(monotonic=mono)
    clock.observe(date(1_800_000_000))  # true time 1_800_000_000.9, truncated
    mono.now += 0.5
    clock.observe(date(1_800_000_001))  # a later answer pins it closer
    mono.now += 0.5
    assert clock.now().timestamp() == pytest.approx(1_800_000_001.5)


def test_a_store_clock_stepped_back_is_followed_within_the_window(mono: FakeMonotonic) -> None:
    clock = StoreClock(window=60, monotonic=mono)
    clock.observe(date(1_800_000_000))
    mono.now += 1
    clock.observe(date(1_799_999_991))  # the store's clock went back 10 s
    assert clock.now().timestamp() == pytest.approx(1_800_000_001)  # still the old view
    mono.now += 61
    clock.observe(date(1_800_000_052))
    assert clock.now().timestamp() == pytest.approx(1_800_000_052)
