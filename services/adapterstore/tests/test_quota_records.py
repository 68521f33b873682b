"""Quota entries of the change log as the store reads them back."""

from __future__ import annotations

from loraserve.adapterstore.catalog import QuotaChange
from loraserve.common.quota import Quota


def test_a_limit_committed_before_the_ranges_is_read_back_within_its_range() -> None:
    # Stores before the ranges took any positive number; the log must still fold.
    record = QuotaChange.from_json(
        {"quota": {"tokens_per_minute": 1e-323, "tokens_per_second": 1e300, "max_in_flight": 4}}
    )
    assert record.quota == Quota(
        max_in_flight=4, tokens_per_second=1_000_000_000, tokens_per_minute=1
    )
