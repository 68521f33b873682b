"""haproxy-placement against a real HAProxy (deploy/haproxy/haproxy.cfg, its runtime API)
in front of real gRPC servers that report the load a test sets, as replicas do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from loraserve.clients.balancing import BoundedLoad
from loraserve.clients.channels import open_channel
from loraserve.common.errors import InvalidArgument, Unavailable
from loraserve.common.rpc.security import ClientSecurity, ServerSecurity
from loraserve.common.rpc.server import start_server
from loraserve.haproxyplacement import HaproxyPlacement, RuntimeApi
from loraserve.inference.serving import SERVICE_NAME
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.haproxy import BACKEND_NAME, Haproxy, haproxy_only, running_haproxy
from loraserve.testing.waiting import eventually

CONFIG = Path(__file__).resolve().parents[3] / "deploy" / "haproxy" / "haproxy.cfg"
FAST = BoundedLoad(poll_interval_s=0.02, placement_interval_s=0.1, demand_smoothing=0.5)


class Reporting(pb_grpc.InferenceServiceServicer):  # type: ignore[misc]
    """Reports `adapters` (pending sequences by adapter name) as its load."""

    def __init__(self) -> None:
        self.adapters: dict[str, int] = {}

    async def GetReplicaLoad(self, request: Any, context: Any) -> pb.GetReplicaLoadResponse:
        return pb.GetReplicaLoadResponse(
            pending_sequences=sum(self.adapters.values()), adapter_pending_sequences=self.adapters
        )


@asynccontextmanager
async def fronted(tmp_path: Path, count: int) -> AsyncIterator[tuple[Haproxy, list[Reporting]]]:
    """HAProxy (no agent of its own) in front of `count` reporting servers, SERVING and in
    its pool; server line replica-i is reporting server i."""
    reporting = [Reporting() for _ in range(count)]
    servers = []
    try:
        for servicer in reporting:
            server = await start_server(
                address="127.0.0.1:0",
                register=partial(_register, servicer),
                service_names=[SERVICE_NAME],
                security=ServerSecurity(),
            )
            await server.set_serving(True)
            servers.append(server)
        lines = {f"replica-{i}": f"127.0.0.1:{s.port}" for i, s in enumerate(servers)}
        async with running_haproxy(CONFIG, tmp_path, lines, placement=False) as haproxy:
            for name in lines:
                await eventually(lambda n=name: haproxy.in_pool(n), f"{name} in the pool")
            yield haproxy, reporting
    finally:
        for server in servers:
            await server.server.stop(None)


def _register(servicer: Reporting, server: grpc.aio.Server) -> None:
    pb_grpc.add_InferenceServiceServicer_to_server(servicer, server)


def agent(haproxy: Haproxy) -> HaproxyPlacement:
    return HaproxyPlacement(
        RuntimeApi(str(haproxy.admin_socket)),
        BACKEND_NAME,
        str(haproxy.placement_map),
        FAST,
        lambda address: open_channel(address, ClientSecurity()),
    )


async def placed(placement: HaproxyPlacement, wanted: dict[str, str]) -> bool:
    await asyncio.sleep(FAST.placement_interval_s)
    return await placement.write_once() == wanted


async def refused(placement: HaproxyPlacement) -> bool:
    await asyncio.sleep(FAST.placement_interval_s)
    try:
        await placement.write_once()
    except Unavailable:
        return True
    return False


@haproxy_only
async def test_each_adapter_is_mapped_to_the_server_of_the_replica_it_runs_on(
    tmp_path: Path,
) -> None:
    async with fronted(tmp_path, 2) as (haproxy, (first, second)):
        first.adapters, second.adapters = {"alpha": 2}, {"beta": 1}
        placement = agent(haproxy)
        try:
            wanted = {"alpha": "replica-0", "beta": "replica-1"}
            await eventually(lambda: placed(placement, wanted), "placed where they run")
        finally:
            await placement.close()
        assert await haproxy.placement() == wanted


@haproxy_only
async def test_the_base_model_is_mapped_under_its_header_value(tmp_path: Path) -> None:
    async with fronted(tmp_path, 1) as (haproxy, (only,)):
        only.adapters = {"": 2}
        placement = agent(haproxy)
        try:
            await eventually(lambda: placed(placement, {"_base": "replica-0"}), "base placed")
        finally:
            await placement.close()


@haproxy_only
async def test_an_adapter_too_hot_for_one_replica_is_left_to_the_bounded_hash(
    tmp_path: Path,
) -> None:
    async with fronted(tmp_path, 2) as (haproxy, (first, _)):
        first.adapters = {"hot": 30, "cold": 1}
        placement = agent(haproxy)
        try:
            await eventually(
                lambda: _written_then_has(placement, "cold"), "the cold adapter mapped"
            )
        finally:
            await placement.close()
        assert "hot" not in await haproxy.placement()


@haproxy_only
@pytest.mark.parametrize(
    "taken_out",
    [
        f"disable server {BACKEND_NAME}/replica-1",
        f"set server {BACKEND_NAME}/replica-1 state drain",
        f"set weight {BACKEND_NAME}/replica-1 0",
    ],
    ids=["maintenance", "drain", "weight-0"],
)
async def test_a_server_haproxy_would_not_send_new_requests_is_given_no_adapter(
    tmp_path: Path, taken_out: str
) -> None:
    async with fronted(tmp_path, 2) as (haproxy, (first, second)):
        first.adapters, second.adapters = {"alpha": 2}, {"beta": 2}
        await haproxy.command(taken_out)
        placement = agent(haproxy)
        try:
            # beta's demand is on the server taken out, which the agent no longer polls:
            # left to the bounded hash, which skips that server too.
            await eventually(lambda: placed(placement, {"alpha": "replica-0"}), "alpha only")
        finally:
            await placement.close()


@haproxy_only
async def test_a_restarted_agent_leaves_the_map_as_it_was_until_it_has_placed(
    tmp_path: Path,
) -> None:
    async with fronted(tmp_path, 2) as (haproxy, (first, _)):
        api = RuntimeApi(str(haproxy.admin_socket))
        await api.set_entry(str(haproxy.placement_map), "alpha", "replica-1", new=True)
        first.adapters = {"alpha": 2}
        placement = agent(haproxy)
        try:
            assert await placement.write_once() is None
            assert await haproxy.placement() == {"alpha": "replica-1"}
            wanted = {"alpha": "replica-0"}
            await eventually(lambda: placed(placement, wanted), "then placed where it runs")
        finally:
            await placement.close()


@haproxy_only
async def test_an_agent_that_reaches_no_replica_leaves_the_map_as_it_was(
    tmp_path: Path,
) -> None:
    async with fronted(tmp_path, 1) as (haproxy, (only,)):
        api = RuntimeApi(str(haproxy.admin_socket))
        await api.set_entry(str(haproxy.placement_map), "alpha", "replica-0", new=True)
        only.adapters = {"beta": 2}
        # TLS towards plaintext replicas: every poll fails, as a wrong CA's would.
        placement = HaproxyPlacement(
            api,
            BACKEND_NAME,
            str(haproxy.placement_map),
            FAST,
            lambda address: open_channel(address, ClientSecurity(tls=True)),
        )
        try:
            await eventually(lambda: refused(placement), "the round refused")
        finally:
            await placement.close()
        assert await haproxy.placement() == {"alpha": "replica-0"}


@haproxy_only
async def test_an_entry_with_a_key_no_adapter_has_is_deleted_by_reference(
    tmp_path: Path,
) -> None:
    async with fronted(tmp_path, 1) as (haproxy, (only,)):
        # Written by hand: a key the agent would never send in a command.
        await haproxy.command(f"add map {haproxy.placement_map} Not!An#Adapter replica-0")
        only.adapters = {"ok": 1}
        placement = agent(haproxy)
        try:
            await eventually(lambda: placed(placement, {"ok": "replica-0"}), "ok placed")
        finally:
            await placement.close()
        assert await haproxy.placement() == {"ok": "replica-0"}


@haproxy_only
async def test_a_reported_name_no_request_could_carry_is_never_written(tmp_path: Path) -> None:
    async with fronted(tmp_path, 1) as (haproxy, (only,)):
        only.adapters = {"ok": 1, "x;del map all": 1, "Upper": 1}
        placement = agent(haproxy)
        try:
            await eventually(lambda: placed(placement, {"ok": "replica-0"}), "ok placed")
        finally:
            await placement.close()


async def test_the_runtime_api_refuses_a_key_that_would_be_a_second_command() -> None:
    # Refused before connecting: the socket does not exist.
    api = RuntimeApi("/nonexistent/admin.sock")
    with pytest.raises(InvalidArgument, match="runtime API"):
        await api.set_entry("/etc/haproxy/placement.map", "a;clear map", "replica-0", new=True)


def test_a_runtime_api_address_neither_path_nor_host_and_port_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="socket path or HOST:PORT"):
        RuntimeApi("admin.sock")


async def _written_then_has(placement: HaproxyPlacement, adapter: str) -> bool:
    await asyncio.sleep(FAST.placement_interval_s)
    return adapter in (await placement.write_once() or {})
