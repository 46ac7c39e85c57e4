"""Art. 12(3) deadlines: one month from receipt, extendable once by up to two months.

Months are counted the way EU law counts them (Regulation 1182/71, Art. 3(2)(c)): the
period ends on the same day of the later month, or on its last day when that month is
shorter (31 January + 1 month = 28 or 29 February).  Extensions are counted from
receipt, not from the first deadline, so 31 January + 3 months is 30 April.
"""

from __future__ import annotations

import calendar
from datetime import datetime

FIRST_PERIOD_MONTHS = 1
MAX_EXTENSION_MONTHS = 2


def add_months(moment: datetime, months: int) -> datetime:
    month_index = moment.month - 1 + months
    year, month = moment.year + month_index // 12, month_index % 12 + 1
    day = min(moment.day, calendar.monthrange(year, month)[1])
    return moment.replace(year=year, month=month, day=day)


def due_at(received_at: datetime) -> datetime:
    return add_months(received_at, FIRST_PERIOD_MONTHS)


def extended_due_at(received_at: datetime, extension_months: int) -> datetime:
    return add_months(received_at, FIRST_PERIOD_MONTHS + extension_months)
