from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deletion.domain.canonical import CanonicalError, canonical_json, canonical_time, format_number


def test_it_sorts_keys_and_drops_whitespace() -> None:
    assert canonical_json({"b": [1, True, None], "a": {"d": "x", "c": 0}}) == (
        '{"a":{"c":0,"d":"x"},"b":[1,true,null]}'
    )


def test_it_sorts_keys_by_utf16_code_units_as_rfc_8785_does() -> None:
    # U+1F600 is D83D DE00 in UTF-16, so it sorts before U+FFFF (code points disagree).
    assert canonical_json({"\uffff": 1, "\U0001f600": 2, "a": 3}) == '{"a":3,"😀":2,"\uffff":1}'


@pytest.mark.parametrize(
    ("number", "text"),
    [  # RFC 8785 appendix B and ECMAScript Number::toString
        (0.0, "0"), (-0.0, "0"), (1.0, "1"), (100.0, "100"), (1e21, "1e+21"),
        (1e20, "100000000000000000000"), (1e-7, "1e-7"), (1e-6, "0.000001"),
        (123.456, "123.456"), (333333333.33333329, "333333333.3333333"),
        (5e-324, "5e-324"), (1.7976931348623157e308, "1.7976931348623157e+308"),
        (-1.5, "-1.5"), (0.1 + 0.2, "0.30000000000000004"),
    ],
)
def test_it_writes_numbers_the_way_ecmascript_does(number: float, text: str) -> None:
    assert format_number(number) == text


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_it_refuses_numbers_json_cannot_hold(bad: float) -> None:
    with pytest.raises(CanonicalError):
        canonical_json({"x": bad})


def test_it_refuses_values_without_a_json_form() -> None:
    with pytest.raises(CanonicalError):
        canonical_json({"when": datetime.now(UTC)})
    with pytest.raises(CanonicalError):
        canonical_json({1: "x"})


def test_it_writes_times_in_utc_and_refuses_naive_ones() -> None:
    moment = datetime(2026, 3, 1, 1, 2, 3, 4, tzinfo=timezone(timedelta(hours=2)))
    assert canonical_time(moment) == "2026-02-28T23:02:03.000004Z"
    with pytest.raises(CanonicalError):
        canonical_time(datetime(2026, 1, 1))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_it_round_trips_through_any_json_parser(value: object) -> None:
    text = canonical_json(value)
    assert canonical_json(json.loads(text)) == text
