"""Spend accounting (``toolkit.application.spend``)."""

from __future__ import annotations

import pytest

from toolkit.application import SpendLedger, SpendMeter


def test_a_spend_must_be_a_finite_number() -> None:
    meter = SpendMeter(dict, SpendLedger())
    for bad in (float("nan"), float("inf"), -1, "5", True):
        with pytest.raises(ValueError, match="must be a finite number >= 0"):
            meter.add({"tokens": bad})
    assert meter.spent == {}  # nothing recorded
