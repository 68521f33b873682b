"""How a client spreads requests over several replicas."""

from __future__ import annotations

from dataclasses import dataclass

from loraserve.common.errors import InvalidArgument

DEFAULT_BALANCE_FACTOR = 1.25


@dataclass(frozen=True)
class BoundedLoad:
    """Adapter affinity with bounded loads (`loraserve.clients.balancing.choice`).

    `balance_factor` (at least 1): the most load one replica may have, as a multiple of
    the fleet's mean, before an adapter's requests spill to its next replica; 1.25 is
    HAProxy's and Envoy's usual `hash-balance-factor` of 125. Replicas are asked for
    their load every `poll_interval_s`, each answer awaited at most `poll_timeout_s`; a
    replica whose polls go unanswered that long stays in the choice on its last report
    until they have for `unanswered_s` (a busy replica answers late; one that refuses
    the connection, UNAVAILABLE, leaves at once); a DNS name is resolved again every
    `resolve_interval_s`; adapters are placed on replicas again at every multiple of
    `placement_interval_s` on the wall clock, the same moments in every client
    (`loraserve.clients.balancing.placement`).
    """

    balance_factor: float = DEFAULT_BALANCE_FACTOR
    poll_interval_s: float = 0.1
    poll_timeout_s: float = 1.0
    unanswered_s: float = 3.0
    resolve_interval_s: float = 30.0
    # How often adapters are placed again from their demand (placement.py), and how
    # much of the smoothed pending sequences (demand's scale, and demand itself where a
    # replica reports no admission rates) each poll's reading replaces.
    placement_interval_s: float = 2.0
    demand_smoothing: float = 0.02

    def __post_init__(self) -> None:
        if not self.balance_factor >= 1.0:
            raise InvalidArgument(
                f"balance_factor must be at least 1 (the fleet's mean), got {self.balance_factor}"
            )
        if not 0 < self.demand_smoothing <= 1:
            raise InvalidArgument(
                f"demand_smoothing must be in (0, 1], got {self.demand_smoothing}"
            )
        for name in (
            "poll_interval_s",
            "poll_timeout_s",
            "unanswered_s",
            "resolve_interval_s",
            "placement_interval_s",
        ):
            if not getattr(self, name) > 0:
                raise InvalidArgument(f"{name} must be positive, got {getattr(self, name)}")


# gRPC's own ring_hash on the adapter header (gRFC A76), without a load bound: what
# clients did before bounded loads, kept for comparison and for proxies that hash.
RING_HASH = "ring_hash"
