from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolkit.definition import schema_path
from toolkit.durations import DURATION_PATTERN, parse_duration


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (30, 30.0),
        (0.25, 0.25),
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("2d", 172800.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("1d2h3m4s5ms", 86400 + 7200 + 180 + 4 + 0.005),
        ("0s", 0.0),
        ("90s", 90.0),
    ],
)
def test_parse_duration(value: str | int | float, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)
    assert isinstance(parse_duration(value), float)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "invalid duration ''"),
        ("30", "add a unit"),
        ("5 minutes", "expected a number and a unit, like 500ms"),
        ("1m30h", "invalid duration '1m30h'"),  # units must decrease
        ("1h1h", "invalid duration"),
        ("-5s", "invalid duration"),
        ("5S", "invalid duration"),
        (" 5s", "invalid duration"),
        ("1.s", "invalid duration"),
        ("1w", "invalid duration"),
        (-1, "cannot be negative"),
        (float("inf"), "not a finite"),
        (float("nan"), "not a finite"),
        (10**400, "not a finite"),
        ("9" * 400 + "d", "not a finite"),
        ("1000000h", "longer than 100 years"),
        (1e10, "longer than 100 years"),
        (True, "expected a number and a unit"),
        (None, "expected a number and a unit"),
        ([1], "expected a number and a unit"),
    ],
)
def test_invalid_durations(value: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_duration(value)  # type: ignore[arg-type]


def test_schema_uses_the_same_grammar() -> None:
    schema = json.loads(schema_path().read_text(encoding="utf-8"))
    assert schema["$defs"]["duration"]["pattern"] == DURATION_PATTERN


@given(st.text(alphabet="0123456789.dhms -", max_size=12))
def test_pattern_and_parser_agree(text: str) -> None:
    matches = re.search(DURATION_PATTERN, text) is not None
    try:
        seconds = parse_duration(text)
    except ValueError as exc:  # well-formed, it can still be too long
        assert not matches or "longer than 100 years" in str(exc)
    else:
        assert matches
        assert math.isfinite(seconds)
        assert seconds >= 0
