"""The replicas a client routes over: a channel to each, and what each last said of its
load and residency.

Every `poll_interval_s` the set asks every replica for its load (`GetReplicaLoad`, a
read of counters the replica keeps anyway). Between polls a replica's load is what it
reported plus the requests this client started there since, minus those it finished: the
report makes many independent client processes agree on the fleet's load, and the
client's own count keeps its choices fresh between reports. Each report also says how
many sequences of each adapter the replica admits per second, a rate the replica keeps
over about the last 5 s: summed over the fleet (and averaged over a few rounds) it is
each adapter's demand, weighed by the tokens its sequences generate there, which
placement balances (`Placer`), the same in every client that reads it. A
replica whose poll is refused (UNAVAILABLE: gone, starting, draining after SIGTERM)
leaves the choice until it answers again, as does one whose call failed UNAVAILABLE
before any response; one that answers late stays on its last report until its polls have
failed for `unanswered_s`. Before its first answer a replica counts as idle and up, so
the first requests need not wait for a poll; one that is down fails them over at once.

The addresses come from an IP list, or from a DNS name resolved again every
`resolve_interval_s` (a replica scaled in or out joins or leaves the choice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from loraserve.clients.balancing.choice import Candidate, choose
from loraserve.clients.balancing.placer import Placer
from loraserve.clients.balancing.policy import BoundedLoad
from loraserve.common.errors import Unavailable
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

ChannelFactory = Callable[[str], grpc.aio.Channel]

# Past any model's context: a larger report is taken as this, so one replica's figure
# cannot outweigh every other adapter's admissions by more than a real one could.
MAX_TOKENS_PER_SEQUENCE = float(2**24)


@dataclass(eq=False)
class Replica:
    """One replica: its channel and stub, and what is known of its load."""

    address: str
    channel: grpc.aio.Channel
    stub: pb_grpc.InferenceServiceStub
    up: bool = True
    reported: int = 0
    # This client's requests in flight there now, and when the last report was taken.
    in_flight: int = 0
    in_flight_at_report: int = 0
    resident: frozenset[str] = field(default_factory=frozenset)
    # Its pending sequences by adapter, as last reported.
    adapters: dict[str, int] = field(default_factory=dict)
    # Its admissions per second by adapter as last reported; which process reported
    # them; whether it reports them (None: no sign either way yet, as while idle).
    arrivals: dict[str, float] = field(default_factory=dict)
    # Tokens its sequences of each adapter generate, as last reported, and whether it
    # reports them (not a release before 0.3).
    tokens_per_sequence: dict[str, float] = field(default_factory=dict)
    reports_tokens: bool = False
    replica_id: str = ""
    reports_rates: bool | None = None
    # The wall-clock second its rates are as of, as it says (or the second its answer
    # arrived in, from a release that does not say).
    rates_as_of: float = 0.0
    # When its polls started failing, on the event loop's clock; None while answered.
    failing_since: float | None = None

    @property
    def load(self) -> int:
        return max(0, self.reported + self.in_flight - self.in_flight_at_report)

    def candidate(self) -> Candidate:
        return Candidate(self.address, self.load, self.resident)


class ReplicaSet:
    """Channels to every replica of one fleet, chosen among by `BoundedLoad`."""

    def __init__(
        self,
        host: str | None,
        addresses: Sequence[str],
        open_channel: ChannelFactory,
        policy: BoundedLoad,
    ) -> None:
        """`host` is a DNS name (HOST:PORT) to resolve again and again, or None for the
        fixed `addresses`."""
        self._host = host
        self._open = open_channel
        self._policy = policy
        self._replicas: dict[str, Replica] = {}
        self._set_addresses(addresses)
        self._polling: asyncio.Task[None] | None = None
        self._placer = Placer(policy)

    @property
    def replicas(self) -> dict[str, Replica]:
        return self._replicas

    @property
    def placement(self) -> dict[str, str] | None:
        """Adapter -> the address of the replica it is placed on, as last placed; None
        before the first placement (at the first multiple of `placement_interval_s` on
        the wall clock after polling started)."""
        return self._placer.placement

    @property
    def any_up(self) -> bool:
        """Whether any replica answered its last poll (or has not been polled yet)."""
        return any(r.up for r in self._replicas.values())

    @property
    def demand(self) -> dict[str, float]:
        """Each adapter's demand over the fleet, in pending sequences (`Placer.demand`)."""
        return self._placer.demand

    async def pick(self, key: str, tried: Sequence[Replica] = ()) -> Replica:
        """The replica for a request of `key`, skipping those already tried; when every
        replica is down or tried, the least loaded of those not tried (or of all), so a
        call is always made and fails with the server's own status if none serves."""
        await self.start()
        avoid = {r.address for r in tried}
        up = {a: r for a, r in self._replicas.items() if r.up and a not in avoid}
        if not up:
            rest = [r for a, r in self._replicas.items() if a not in avoid]
            return min(rest or self._replicas.values(), key=lambda r: r.load)
        placed = self._placer.placed(key)
        first = placed if placed in up else None
        chosen = choose(
            key, {a: r.candidate() for a, r in up.items()}, self._policy.balance_factor, first
        )
        if first is not None:
            self._placer.sent(key, to_placement=chosen == first)
        return up[chosen]

    async def any(self) -> Replica:
        """A replica for a call that may go anywhere: the least loaded one up."""
        await self.start()
        up = [r for r in self._replicas.values() if r.up] or list(self._replicas.values())
        return min(up, key=lambda r: r.load)

    def down(self, replica: Replica) -> None:
        """Takes a replica whose call failed UNAVAILABLE out until it answers a poll."""
        if replica.up:
            log.info("routing.replica_down address=%s", replica.address)
        replica.up = False

    async def close(self) -> None:
        if self._polling is not None:
            self._polling.cancel()
            await asyncio.gather(self._polling, return_exceptions=True)
        await asyncio.gather(*(r.channel.close() for r in self._replicas.values()))

    async def start(self) -> None:
        """Resolves a DNS name the first time, and starts polling (the first pick
        does, if this was not called)."""
        if self._polling is not None and self._polling.done() and not self._polling.cancelled():
            # A bug stopped it: loads would freeze where they were; said, and started again.
            log.error("routing.polling_stopped error=%r", self._polling.exception())
            self._polling = None
        if self._polling is not None:
            return
        if self._host is not None and not self._replicas:
            await self._resolve()
        if not self._replicas:
            raise Unavailable(f"{self._host} resolves to no address")
        if self._polling is None:  # another pick may have started it while this resolved
            self._polling = asyncio.get_running_loop().create_task(
                self._poll_forever(), name="replica-load-poll"
            )

    async def _poll_forever(self) -> None:
        resolved_at = asyncio.get_running_loop().time()
        # Rounds of the wall clock, the same in every client process (to its clock's
        # skew): a client places from the first polls it sends in a round, which the
        # replicas answer with their rates as of the round's start (a multiple of
        # their rate grid), the same numbers every client reads. The first placement
        # comes in the first round after polling started.
        placed_round = self._round()
        while True:
            sent_in = self._round()
            await asyncio.gather(*(self._poll(r) for r in list(self._replicas.values())))
            self._placer.observe(self._replicas)
            if sent_in != placed_round:
                placed_round = sent_in
                self._placer.place(sent_in)
            await asyncio.sleep(self._policy.poll_interval_s)
            now = asyncio.get_running_loop().time()
            if self._host is not None and now - resolved_at >= self._policy.resolve_interval_s:
                resolved_at = now
                await self._resolve()

    def _round(self) -> int:
        return math.floor(time.time() / self._policy.placement_interval_s)

    async def _poll(self, replica: Replica) -> None:
        at_call = replica.in_flight
        try:
            response = await replica.stub.GetReplicaLoad(
                pb.GetReplicaLoadRequest(), timeout=self._policy.poll_timeout_s
            )
        except grpc.aio.UsageError:
            # Its channel closed under the call: the address left the set meanwhile.
            return
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                # A replica of a release before load reports: up, its load this
                # client's own count alone.
                replica.up, replica.reported, replica.in_flight_at_report = True, 0, 0
                replica.adapters, replica.arrivals, replica.reports_rates = {}, {}, None
                replica.tokens_per_sequence, replica.reports_tokens = {}, False
                return
            self._unanswered(replica, exc.code())
            return
        if not replica.up:
            log.info("routing.replica_up address=%s", replica.address)
        replica.up = True
        replica.failing_since = None
        replica.reported = response.pending_sequences
        replica.in_flight_at_report = at_call
        replica.rates_as_of = (
            response.admission_rates_as_of.ToNanoseconds() / 1e9
            if response.HasField("admission_rates_as_of")
            else math.floor(time.time())
        )
        replica.resident = frozenset(response.resident_adapters)
        # Never negative, and none over the replica's own total: a malformed report
        # skews placement no further than the total it claims.
        total = max(0, response.pending_sequences)
        replica.adapters = {
            adapter: min(max(0, pending), total)
            for adapter, pending in response.adapter_pending_sequences.items()
        }
        _read_rates(replica, response)

    def _unanswered(self, replica: Replica, code: grpc.StatusCode) -> None:
        """A failed poll. A refused connection takes the replica out at once; a late
        or failed answer only once its polls have failed for `unanswered_s`: on a
        loaded machine a busy replica answers late, and taking it out would move every
        adapter placed on it, and back once it answers."""
        now = asyncio.get_running_loop().time()
        if replica.failing_since is None:
            replica.failing_since = now
        failing_for = now - replica.failing_since
        if replica.up and (
            code is grpc.StatusCode.UNAVAILABLE or failing_for >= self._policy.unanswered_s
        ):
            log.info(
                "routing.replica_down address=%s code=%s failing_s=%.1f",
                replica.address,
                code.name,
                failing_for,
            )
            replica.up = False

    async def _resolve(self) -> None:
        assert self._host is not None
        name, _, port = self._host.rpartition(":")
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                name, int(port), type=socket.SOCK_STREAM
            )
        except OSError as exc:
            log.warning("routing.resolve_failed host=%s error=%s", self._host, exc)
            return
        addresses = sorted({_address(info[4]) for info in infos})
        if addresses and set(addresses) != set(self._replicas):
            log.info("routing.replicas_changed host=%s replicas=%d", self._host, len(addresses))
            await self.set_addresses(addresses)

    async def set_addresses(self, addresses: Sequence[str]) -> None:
        """Routes over `addresses` from now on: a channel opened to each new one, those
        of the ones gone closed."""
        for replica in self._set_addresses(addresses):
            with contextlib.suppress(Exception):
                await replica.channel.close(grace=None)

    def _set_addresses(self, addresses: Sequence[str]) -> list[Replica]:
        kept = {a: r for a, r in self._replicas.items() if a in addresses}
        gone = [r for a, r in self._replicas.items() if a not in addresses]
        for address in addresses:
            if address not in kept:
                channel = self._open(address)
                kept[address] = Replica(address, channel, pb_grpc.InferenceServiceStub(channel))
        self._replicas = kept
        return gone


def _read_rates(replica: Replica, response: pb.GetReplicaLoadResponse) -> None:
    """A replica's admissions per second by adapter, from `response` (only finite,
    positive rates: a malformed one is no demand), and the tokens per sequence of those
    (finite, taken within [1, MAX_TOKENS_PER_SEQUENCE]). A replica reporting an adapter
    pending with no rate is of a release before rates: none are taken from it, nor
    placed by, until another process answers at its address (its `replica_id`)."""
    if response.replica_id != replica.replica_id:
        replica.replica_id, replica.reports_rates = response.replica_id, None
    reported = response.adapter_admission_rates
    if not reported.keys() >= replica.adapters.keys():
        replica.reports_rates = False
    elif reported:
        replica.reports_rates = True
    replica.arrivals = (
        {}
        if replica.reports_rates is False
        else {a: r for a, r in reported.items() if math.isfinite(r) and r > 0}
    )
    replica.reports_tokens = response.reports_tokens_per_sequence
    replica.tokens_per_sequence = {
        a: min(max(1.0, t), MAX_TOKENS_PER_SEQUENCE)
        for a, t in response.adapter_tokens_per_sequence.items()
        if a in replica.arrivals and math.isfinite(t)
    }


def _address(sockaddr: tuple[object, ...]) -> str:
    host, port = str(sockaddr[0]), int(str(sockaddr[1]))
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
