"""One client's placement of adapters, round after round, from the replicas' reports:
each adapter's demand over the fleet, where the reports show it running, and where
`place` puts it."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from loraserve.clients.balancing.demand import smooth, unbiased
from loraserve.clients.balancing.placement import place, replica_room
from loraserve.clients.balancing.policy import BoundedLoad
from loraserve.clients.balancing.recent import (
    MOSTLY,
    RATE_TIME_CONSTANT_S,
    Reading,
    RecentAdmissions,
)
from loraserve.clients.routing import BASE_MODEL_HASH_KEY

if TYPE_CHECKING:
    from loraserve.clients.balancing.replicas import Replica

__all__ = ["DEMAND_WINDOW_S", "LEAST_RATE", "SETTLE_ROUNDS", "Placer"]

log = logging.getLogger(__name__)

# Placement rounds after this client placed or moved an adapter during which the
# replicas' pending sequences do not move it, where they report no admission rates:
# its old replica still holds the requests it started there.
SETTLE_ROUNDS = 3
# Admissions per second over the whole fleet below which its rates say nothing (the
# replicas forget an adapter's rate below this), and dividing by them could overflow.
LEAST_RATE = 0.001
# Seconds of placement rounds over which demand averages the replicas' rates. A rate
# (each admission weighted e^(-age / 5 s)) of an adapter asked for once a second
# wobbles by about a third round to round, a replica's sum by a tenth, and a replica
# left lighter than another by a rebalance crossed the rebalancing mark now and then:
# benchmark 10 moved an adapter inside 2 of its 9 windows, every client alike. Averaged
# over 10 s (five readings of the same rounds in every client), it moved none in 9;
# simulated (`python -m bench.fleet.placement_sim`, 300 runs), runs moving one in the
# window went from 4.7 % to 0.3 %, and moves at a steady load from 1.2 to 0.07 a
# minute, at 5 s more lag.
DEMAND_WINDOW_S = 10.0


class Placer:
    """Folds each poll's reports in (`observe`) and places adapters at each round
    (`place`)."""

    def __init__(self, policy: BoundedLoad) -> None:
        self._policy = policy
        # Each adapter's smoothed pending sequences (and how many readings went into
        # them) and its admissions per second as last reported, on each replica.
        self._pending: dict[tuple[str, str], float] = {}
        self._readings = 0
        self._arrivals: dict[tuple[str, str], float] = {}
        # Tokens per sequence of each adapter on each replica, as last reported (none
        # while a replica up does not report them), and as the last round placed by
        # (None before the first).
        self._tokens: dict[tuple[str, str], float] = {}
        self._placed_tokens: dict[tuple[str, str], float] | None = None
        # The replicas up, the second each one's rates are as of, the process that
        # answered, and whether all of them report rates, as of the last poll.
        self._as_of: dict[str, float] = {}
        self._incarnation: dict[str, str] = {}
        self._rates_everywhere = False
        # The round in which this client last placed or moved each adapter, and its
        # requests of it since, weighted by age as the replicas' rates weigh
        # admissions: [to where it is placed, elsewhere].
        self._moved_in: dict[str, int] = {}
        self._sent: dict[str, list[float]] = {}
        self._sent_decay = math.exp(-policy.placement_interval_s / RATE_TIME_CONSTANT_S)
        # Readings old enough that what they held has decayed past 2 % are not kept,
        # nor those before demand's window.
        self._demand_rounds = max(1, round(DEMAND_WINDOW_S / policy.placement_interval_s))
        self._recent = RecentAdmissions(
            max(
                self._demand_rounds,
                math.ceil(4 * RATE_TIME_CONSTANT_S / policy.placement_interval_s),
            )
        )
        # None before the first placement.
        self._placement: dict[str, str] | None = None

    @property
    def placement(self) -> dict[str, str] | None:
        """Adapter -> the address of the replica it is placed on; None before the first
        placement."""
        return None if self._placement is None else dict(self._placement)

    def placed(self, adapter: str) -> str | None:
        """The address `adapter` is placed on; None if it is not (or before the first
        placement)."""
        return None if self._placement is None else self._placement.get(adapter)

    def sent(self, adapter: str, to_placement: bool) -> None:
        """Counts a request of this client's for a placed adapter: to where it is
        placed, or elsewhere (past the request-by-request bound)."""
        self._sent.setdefault(adapter, [0.0, 0.0])[0 if to_placement else 1] += 1

    @property
    def demand(self) -> dict[str, float]:
        """Each adapter's demand over the fleet, in pending sequences (`_weights`)."""
        weights, scale, _ = self._weights()
        return _per_adapter(weights, scale)

    def observe(self, replicas: Mapping[str, Replica]) -> None:
        """Folds the replicas' latest per-adapter reports into each adapter's pending
        sequences on each replica, and takes their admission rates as reported."""
        pending: dict[tuple[str, str], float] = {}
        arrivals: dict[tuple[str, str], float] = {}
        tokens: dict[tuple[str, str], float] = {}
        up = {address: replica for address, replica in replicas.items() if replica.up}
        for address, replica in up.items():
            # Reported under "", hashed and placed under the header's value.
            for adapter, count in replica.adapters.items():
                pending[adapter or BASE_MODEL_HASH_KEY, address] = float(count)
            for adapter, rate in replica.arrivals.items():
                arrivals[adapter or BASE_MODEL_HASH_KEY, address] = rate
            for adapter, per_sequence in replica.tokens_per_sequence.items():
                tokens[adapter or BASE_MODEL_HASH_KEY, address] = per_sequence
        smooth(self._pending, pending, self._policy.demand_smoothing)
        self._readings += 1
        self._arrivals = arrivals
        # From a replica of a release that does not report them, an adapter running only
        # there would be weighed by the others' tokens, not its own: none are used.
        self._tokens = tokens if all(r.reports_tokens for r in up.values()) else {}
        self._as_of = {address: replica.rates_as_of for address, replica in up.items()}
        self._incarnation = {address: replica.replica_id for address, replica in up.items()}
        self._rates_everywhere = all(r.reports_rates is not False for r in up.values())

    def place(self, round_: int) -> None:
        """Places every adapter with demand for round `round_`, logging each moved."""
        up = sorted(self._as_of)
        self._recent.record(round_, Reading(self._arrivals, self._as_of, self._incarnation))
        # Demand read between rounds (HAProxy's agent checks the room by it) weighs as
        # this round placed.
        self._placed_tokens = self._tokens
        weights, scale, by_rates = self._weights()
        demand = _per_adapter(weights, scale)
        before = self._placement or {}
        runs_on = {a: r for a, r in before.items() if r in self._as_of}
        # An adapter placed, then too hot for one replica, runs wherever the bound spreads
        # it (HAProxy's hash, for one haproxy-placement leaves unmapped): the replica
        # holding most of it is not where anyone placed it, and following it moved every
        # cold adapter off that replica, and back, each time the majority flipped. One
        # not placed yet still follows: most of it runs where the others placed it.
        room = replica_room(demand, max(1, len(up)), self._policy.balance_factor)
        followed = {
            adapter: address
            for adapter, address in self._followed(
                round_, before, None if by_rates else weights, scale, demand
            ).items()
            if adapter not in before or demand[adapter] <= room
        }
        runs_on.update(followed)
        placement = place(demand, up, self._policy.balance_factor, runs_on)
        for adapter, address in placement.items():
            if before.get(adapter) != address:
                self._moved_in[adapter] = round_
                self._sent.pop(adapter, None)
                if adapter in before:
                    log.info(
                        "routing.adapter_moved adapter=%s from=%s to=%s demand=%.2f by=%s",
                        *(adapter, before[adapter], address, demand[adapter]),
                        _cause(before[adapter], address, followed.get(adapter), up),
                    )
        for adapter in self._moved_in.keys() - placement.keys():
            del self._moved_in[adapter]
            self._sent.pop(adapter, None)
        for counts in self._sent.values():
            counts[0] *= self._sent_decay
            counts[1] *= self._sent_decay
        self._placement = placement

    def _weights(self) -> tuple[Mapping[tuple[str, str], float], float, bool]:
        """How much each adapter is asked for on each replica, the factor that makes it
        pending sequences, and whether by admissions. By admissions where every replica
        up reports them: an adapter's admissions per second (averaged over
        DEMAND_WINDOW_S of rounds) times the tokens its sequences generate (`_work`),
        times the fleet's pending sequences per token of that (Little's law: a sequence
        holds its place for as many engine steps as it generates tokens, so 8 streams
        of 150 tokens need more places than 40 requests of 4 a second); an adapter
        whose tokens no replica knows yet counts the places it holds. Its own pending
        sequences would count each request as long as it queues, so an adapter on a busy
        replica would look hotter than the same one on an idle replica, and moving it
        would change its demand: placement would chase its own effect. By pending
        sequences where a replica does not report admissions (a release before 0.3,
        mid-upgrade). Smoothed pending sequences are unbiased for how few readings a
        client just started has. A fleet admitting next to nothing (under LEAST_RATE),
        or reporting work past a float's range, is placed on pending sequences too."""
        rates = self._recent.mean_rates(self._demand_rounds) or self._arrivals
        fresh = unbiased(self._policy.demand_smoothing, self._readings)
        if LEAST_RATE <= sum(rates.values()) < math.inf and self._rates_everywhere:
            placed = self._placed_tokens
            work, unknown = _work(rates, self._tokens if placed is None else placed)
            # An adapter none of whose sequences has ended yet counts the places it
            # holds now: weighed by the others' tokens, 8 streams of 200 tokens just
            # begun read as 8 requests of 4 beside a cold adapter asked for often, and
            # were placed whole on one replica until the first of them ended.
            held = {k: fresh * p for k, p in self._pending.items() if k[0] in unknown}
            rest = max(0.0, fresh * sum(self._pending.values()) - sum(held.values()))
            total = sum(work.values())
            if 0 < total < math.inf:
                return {**{k: w * rest / total for k, w in work.items()}, **held}, 1.0, True
        return self._pending, fresh, False

    def _followed(
        self,
        round_: int,
        before: Mapping[str, str],
        pending: Mapping[tuple[str, str], float] | None,
        scale: float,
        demand: Mapping[str, float],
    ) -> dict[str, str]:
        """Adapter -> the replica the fleet's reports show it running on mostly (other
        clients placed it there). By its admissions since this client placed it
        (`RecentAdmissions`; all the rates remember, for an adapter it has not placed),
        where demand is by admissions, unless this client's own requests of it went
        mostly elsewhere too (`_spilled`); by its `pending` sequences, once this client
        has not moved it for SETTLE_ROUNDS, where it is by them."""
        if pending is None:
            since = {a: self._moved_in.get(a) if a in before else None for a in demand}
            runs = self._recent.runs_mostly(since, set(self._as_of))
            return {a: r for a, r in runs.items() if not self._spilled(a)}
        followed = {}
        for (adapter, address), weight in pending.items():
            settled = round_ - self._moved_in.get(adapter, round_ - SETTLE_ROUNDS) >= SETTLE_ROUNDS
            if settled and weight * scale > MOSTLY * demand[adapter]:
                followed[adapter] = address
        return followed

    def _spilled(self, adapter: str) -> bool:
        """Whether this client's own requests of `adapter` since it placed it (weighted
        by age) went mostly elsewhere: past the request-by-request bound, as every
        client's did. The admissions elsewhere are then the spill of an overloaded
        replica, which the next rebalance answers; followed, they moved a hot adapter
        onto the replica it spilled to, and back, inside benchmark 10's windows. Where
        this client's went where it placed it, the others placed the adapter elsewhere."""
        to_placement, elsewhere = self._sent.get(adapter, (0.0, 0.0))
        return elsewhere > to_placement


def _work(
    rates: Mapping[tuple[str, str], float], tokens: Mapping[tuple[str, str], float]
) -> tuple[dict[tuple[str, str], float], set[str]]:
    """Each rate times the tokens per sequence of its adapter there; where that replica
    has none to say (no sequence of it ended there yet), the adapter's elsewhere,
    weighted by rate; and the adapters no replica says of, left out.
    With no tokens at all (a replica up of a release before 0.3, or none ended yet),
    each rate as it is, none left out."""
    if not tokens:
        return dict(rates), set()
    # Adapter -> [its rates x tokens, its rates] over the replicas that report tokens.
    known: dict[str, list[float]] = {}
    for key, per_sequence in tokens.items():
        sums = known.setdefault(key[0], [0.0, 0.0])
        sums[0] += rates.get(key, 0.0) * per_sequence
        sums[1] += rates.get(key, 0.0)
    work, unknown = {}, set()
    for key, rate in rates.items():
        reported = tokens.get(key)
        if reported is None:
            weighted, rated = known.get(key[0], (0.0, 0.0))
            if not rated:
                unknown.add(key[0])
                continue
            reported = weighted / rated
        work[key] = rate * reported
    return work, unknown


def _per_adapter(weights: Mapping[tuple[str, str], float], scale: float) -> dict[str, float]:
    """Each adapter's weight summed over the replicas, times `scale`."""
    demand: dict[str, float] = {}
    for (adapter, _), weight in weights.items():
        demand[adapter] = demand.get(adapter, 0.0) + weight * scale
    return demand


def _cause(was: str, now: str, followed: str | None, up: Sequence[str]) -> str:
    """Why an adapter moved, as logged: its replica left, the reports showed it running
    elsewhere, or a rebalance."""
    if was not in up:
        return "down"
    return "reports" if followed == now else "balance"
