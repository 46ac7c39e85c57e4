from __future__ import annotations

from datetime import UTC, datetime

import pytest

from deletion.domain.deadlines import add_months, due_at, extended_due_at


def at(y: int, m: int, d: int) -> datetime:
    return datetime(y, m, d, 15, 45, tzinfo=UTC)


@pytest.mark.parametrize(
    ("received", "due"),
    [
        (at(2026, 1, 31), at(2026, 2, 28)),  # month end clamps to a shorter month
        (at(2028, 1, 31), at(2028, 2, 29)),  # leap year
        (at(2028, 1, 29), at(2028, 2, 29)),
        (at(2027, 1, 29), at(2027, 2, 28)),
        (at(2026, 3, 31), at(2026, 4, 30)),
        (at(2026, 12, 31), at(2027, 1, 31)),  # year end
        (at(2026, 2, 28), at(2026, 3, 28)),  # not the end of March: same day number
        (at(2028, 2, 29), at(2028, 3, 29)),
    ],
)
def test_it_ends_one_month_after_receipt_on_the_same_day_or_the_month_end(
    received: datetime, due: datetime
) -> None:
    assert due_at(received) == due


@pytest.mark.parametrize(
    ("received", "months", "due"),
    [
        (at(2026, 1, 31), 2, at(2026, 4, 30)),  # counted from receipt, not from 28 Feb
        (at(2026, 1, 31), 1, at(2026, 3, 31)),
        (at(2027, 11, 30), 2, at(2028, 2, 29)),  # into a leap February
        (at(2026, 11, 30), 2, at(2027, 2, 28)),
    ],
)
def test_it_extends_by_whole_months_from_receipt(received: datetime, months: int, due: datetime) -> None:
    assert extended_due_at(received, months) == due


def test_it_keeps_the_time_of_day_and_zone() -> None:
    moment = datetime(2026, 5, 31, 23, 59, 59, 123456, tzinfo=UTC)
    assert add_months(moment, 1) == datetime(2026, 6, 30, 23, 59, 59, 123456, tzinfo=UTC)
