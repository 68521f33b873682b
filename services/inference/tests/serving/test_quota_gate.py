"""Per-adapter quotas at admission (QuotaGate), on a clock the test moves."""

from __future__ import annotations

import pytest

from loraserve.common.errors import InvalidArgument, QuotaExceeded
from loraserve.common.quota import Quota
from loraserve.inference.serving.quotas import DEFAULT_QUOTA, QuotaGate
from loraserve.testing.fakes.clock import ManualClock


class Throttles:
    def __init__(self) -> None:
        self.counted: list[tuple[str, str]] = []

    def request_throttled(self, adapter: str, limit: str) -> None:
        self.counted.append((adapter, limit))


def test_an_adapter_at_its_in_flight_limit_is_refused_until_one_ends() -> None:
    throttles = Throttles()
    gate = QuotaGate(ManualClock(100.0), throttles)
    gate.set_quota("alpha", Quota(max_in_flight=2))
    with gate.admit("alpha", "alpha"), gate.admit("alpha", "alpha"):
        with pytest.raises(QuotaExceeded) as refused, gate.admit("alpha", "alpha"):
            pass
        assert "2 sequences in flight" in refused.value.message
        assert refused.value.retry_after_s > 0
        with gate.admit("beta", "beta"):
            pass
    with gate.admit("alpha", "alpha"):
        pass
    assert throttles.counted == [("alpha", "in_flight")]


def test_in_flight_counts_each_request_as_its_sequences() -> None:
    gate = QuotaGate(ManualClock(100.0))
    gate.set_quota("alpha", Quota(max_in_flight=4))
    with gate.admit("alpha", "alpha", 3):
        assert gate.in_flight("alpha") == 3
        with pytest.raises(QuotaExceeded) as refused, gate.admit("alpha", "alpha", 2):
            pass
        assert "3 sequences in flight and this request needs 2" in refused.value.message
        with gate.admit("alpha", "alpha", 1):
            pass


def test_a_request_of_more_sequences_than_the_limit_is_invalid_not_throttled() -> None:
    throttles = Throttles()
    gate = QuotaGate(ManualClock(100.0), throttles)
    gate.set_quota("alpha", Quota(max_in_flight=2))
    with (
        pytest.raises(InvalidArgument, match=r"n=3 .*max_in_flight"),
        gate.admit("alpha", "alpha", 3),
    ):
        pass
    assert throttles.counted == [("alpha", "in_flight")]


def test_tokens_per_second_refuse_after_the_bucket_is_spent_and_say_when_to_retry() -> None:
    clock = ManualClock(100.0)
    gate = QuotaGate(clock)
    gate.set_quota("alpha", Quota(tokens_per_second=100))
    with gate.admit("alpha", "alpha") as charge:
        charge(150)  # a running request finishes whatever it costs
    with pytest.raises(QuotaExceeded) as refused, gate.admit("alpha", "alpha"):
        pass
    assert refused.value.retry_after_s == pytest.approx(0.5, abs=0.01)
    clock.now += 0.6
    with gate.admit("alpha", "alpha"):
        pass


def test_tokens_per_minute_refill_at_a_sixtieth_per_second() -> None:
    clock = ManualClock(100.0)
    gate = QuotaGate(clock)
    gate.set_quota("alpha", Quota(tokens_per_minute=600))
    with gate.admit("alpha", "alpha") as charge:
        charge(600)
    with pytest.raises(QuotaExceeded) as refused, gate.admit("alpha", "alpha"):
        pass
    assert refused.value.retry_after_s == pytest.approx(0.0001, abs=0.01)
    clock.now += 1.0
    with gate.admit("alpha", "alpha"):
        pass


def test_the_default_quota_applies_to_adapters_without_their_own() -> None:
    gate = QuotaGate(ManualClock(100.0))
    gate.set_quota(DEFAULT_QUOTA, Quota(max_in_flight=1))
    gate.set_quota("vip", Quota(max_in_flight=3))
    with gate.admit("alpha", "alpha"):
        with pytest.raises(QuotaExceeded), gate.admit("alpha", "alpha"):
            pass
        with gate.admit("vip", "vip"), gate.admit("vip", "vip"):
            pass
    gate.set_quota(DEFAULT_QUOTA, None)
    with gate.admit("alpha", "alpha"), gate.admit("alpha", "alpha"):
        pass


def test_a_quota_change_applies_at_once_to_requests_after_it() -> None:
    gate = QuotaGate(ManualClock(100.0))
    gate.set_quota("alpha", Quota(max_in_flight=5))
    with gate.admit("alpha", "alpha"), gate.admit("alpha", "alpha"):
        gate.set_quota("alpha", Quota(max_in_flight=2))
        with pytest.raises(QuotaExceeded), gate.admit("alpha", "alpha"):
            pass


def test_a_listing_replaces_every_quota_including_the_default() -> None:
    gate = QuotaGate(ManualClock(100.0))
    gate.set_quota("alpha", Quota(max_in_flight=1))
    gate.replace_quotas(Quota(max_in_flight=2), {"beta": Quota(max_in_flight=1)})
    with (
        gate.admit("alpha", "alpha"),
        gate.admit("alpha", "alpha"),
        pytest.raises(QuotaExceeded),
        gate.admit("alpha", "alpha"),
    ):
        pass
    with gate.admit("beta", "beta"), pytest.raises(QuotaExceeded), gate.admit("beta", "beta"):
        pass


@pytest.mark.parametrize(
    "fields",
    [
        {"max_in_flight": 0},
        {"max_in_flight": 1_000_001},
        {"tokens_per_second": -1.0},
        {"tokens_per_second": 5e-324},
        {"tokens_per_minute": 1e-323},
        {"tokens_per_minute": 0.5},
        {"tokens_per_minute": float("inf")},
        {},
    ],
)
def test_a_quota_out_of_range_is_invalid_argument(fields: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        Quota(**fields)  # type: ignore[arg-type]
