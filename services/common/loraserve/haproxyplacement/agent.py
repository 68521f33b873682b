"""The client library's adapter placement, given to HAProxy.

HAProxy's bounded hash (`hash-balance-factor`) decides request by request: whichever
request arrives while an adapter's home is over the bound spills, a cold adapter's as
well as the hot one's, so a cold adapter sharing a replica with a hot one is served half
here, half there, and its adapter loaded on both. The Python client places adapters
whole instead (`loraserve.clients.balancing.placement`). This agent runs that same
placement beside HAProxy: it polls the replicas HAProxy lists for their load
(`GetReplicaLoad`, as every client does), and in every round of `placement_interval_s`
on the wall clock, once its replica set has placed (as every client does, at the same
moments), writes each adapter's replica into the map that deploy/haproxy/haproxy.cfg's
`use-server` reads.

An adapter whose demand is more than one replica's room is left out of the map: the
bounded hash spreads it, as it must be. HAProxy skips a mapping to a server that is not
up, so the adapters of a replica that dies go to the bounded hash at once, before the
agent notices. If the agent stops, the map keeps its last placement (every replica
still takes its adapters; one that joined gets only unmapped ones until it is back),
and a reload of HAProxy starts from the map file until the agent's next write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from loraserve.clients.balancing import BoundedLoad, ReplicaSet, replica_room
from loraserve.clients.routing import BASE_MODEL_HASH_KEY
from loraserve.common.errors import InvalidArgument, LoraserveError, Unavailable
from loraserve.common.revisions.names import validate_adapter_name
from loraserve.haproxyplacement.runtime_api import RuntimeApi, Server

log = logging.getLogger(__name__)

# Refused names remembered (each said once), at most.
_REFUSED_NAMES_KEPT = 1024


class HaproxyPlacement:
    """Keeps `map_file` in HAProxy (at `api`) the placement of adapters over the servers
    of `backend`."""

    def __init__(
        self,
        api: RuntimeApi,
        backend: str,
        map_file: str,
        policy: BoundedLoad,
        open_channel: Callable[[str], grpc.aio.Channel],
    ) -> None:
        self._api = api
        self._backend = backend
        self._map_file = map_file
        self._policy = policy
        self._open_channel = open_channel
        self._replicas: ReplicaSet | None = None
        self._refused: set[str] = set()

    async def run(self) -> None:
        """Writes the placement once a round until cancelled; a round that fails
        (HAProxy restarting, a replica's report refused) is logged and the next one
        tries again."""
        try:
            while True:
                try:
                    await self.write_once()
                except LoraserveError as exc:
                    log.warning("placement.round_failed error=%s", exc.message)
                await asyncio.sleep(_until_placed(self._policy))
        finally:
            await self.close()

    async def write_once(self) -> dict[str, str] | None:
        """One round: HAProxy's servers read, the map brought to the placement now.
        Returns the map as written (adapter -> server name), or None before the
        replicas' reports placed anything: a restarted agent leaves the map as it was
        until then."""
        # Placed over the servers HAProxy would use: one down or in maintenance there
        # takes no adapter, whatever it answers the agent.
        servers = [s for s in await self._api.servers(self._backend) if s.up]
        if not servers:
            raise Unavailable(f"HAProxy's backend {self._backend} has no server up")
        replicas = await self._replica_set(servers)
        placement = replicas.placement
        if placement is None:
            return None
        if not replicas.any_up:
            # A placement over no replica is empty: written, it would unmap everything
            # because the agent's own calls fail (a wrong token, a CA), not the fleet.
            raise Unavailable("no replica answered the agent's load poll")
        demand = replicas.demand
        wanted = self.wanted(servers, placement, demand)
        room = replica_room(demand, len(servers), self._policy.balance_factor)
        await self._write(wanted, demand, room)
        return wanted

    def wanted(
        self, servers: list[Server], placement: dict[str, str], demand: dict[str, float]
    ) -> dict[str, str]:
        """Adapter -> server name for every placed adapter that fits on one replica, of
        `servers` (those up)."""
        names = {s.address: s.name for s in servers}
        room = replica_room(demand, max(1, len(names)), self._policy.balance_factor)
        wanted: dict[str, str] = {}
        for adapter, address in placement.items():
            if address in names and demand.get(adapter, 0.0) <= room and self._mappable(adapter):
                wanted[adapter] = names[address]
        return wanted

    def _mappable(self, adapter: str) -> bool:
        """Whether a name a replica reported is one a request's header can carry:
        anything else is refused here rather than written into a command on HAProxy's
        admin socket (and said once)."""
        if adapter == BASE_MODEL_HASH_KEY:
            return True
        try:
            validate_adapter_name(adapter)
        except InvalidArgument:
            if len(self._refused) < _REFUSED_NAMES_KEPT and adapter not in self._refused:
                self._refused.add(adapter)
                log.warning("placement.bad_adapter_name name=%r", adapter[:80])
            return False
        return True

    async def close(self) -> None:
        if self._replicas is not None:
            await self._replicas.close()
            self._replicas = None

    async def _replica_set(self, servers: list[Server]) -> ReplicaSet:
        addresses = sorted({s.address for s in servers})
        if self._replicas is None:
            self._replicas = ReplicaSet(None, addresses, self._open_channel, self._policy)
        elif set(addresses) != set(self._replicas.replicas):
            log.info("placement.servers_changed servers=%d", len(addresses))
            await self._replicas.set_addresses(addresses)
        # Every round: polling that a bug stopped starts again.
        await self._replicas.start()
        return self._replicas

    async def _write(self, wanted: dict[str, str], demand: dict[str, float], room: float) -> None:
        """Brings HAProxy's map to `wanted`, logging each change with the adapter's
        demand and a replica's room (what decided it)."""
        current = await self._api.map_entries(self._map_file)
        for adapter in sorted(current.keys() - wanted.keys()):
            await self._api.delete_entry(self._map_file, current[adapter])
            log.info(
                "placement.unmapped adapter=%r demand=%.2f room=%.2f",
                adapter[:80],
                demand.get(adapter, 0.0),
                room,
            )
        for adapter, server in sorted(wanted.items()):
            was = current[adapter].value if adapter in current else None
            if was != server:
                await self._api.set_entry(self._map_file, adapter, server, new=was is None)
                log.info(
                    "placement.moved adapter=%s server=%s was=%s demand=%.2f room=%.2f",
                    *(adapter, server, was, demand.get(adapter, 0.0), room),
                )


def _until_placed(policy: BoundedLoad) -> float:
    """Seconds until a replica set has placed in the next round of the wall clock: the
    first polls it sends in a round go within a poll interval of the round's start, and
    are mostly answered within another."""
    interval = policy.placement_interval_s
    return interval - time.time() % interval + 2 * policy.poll_interval_s
