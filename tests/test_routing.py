"""Routing by adapter across several replicas (`loraserve.clients.routing`), on real gRPC
servers standing in for inference replicas: each answers Generate with its own name, so
a test sees which replica served. The real engine's version is tests/test_fleet.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from loraserve.clients.balancing import RING_HASH
from loraserve.clients.inference import InferenceClient, RetryPolicy, SyncInferenceClient
from loraserve.clients.routing import (
    ADAPTER_HASH_HEADER,
    BASE_MODEL_HASH_KEY,
    RING_HASH_ENV,
    RingHashDisabled,
    affinity_key,
    enable_ring_hash,
    parse_target,
)
from loraserve.common.errors import InvalidArgument
from loraserve.common.rpc.security import ClientSecurity
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.ctl import ctl
from loraserve.testing.certs import CertFiles, make_certs

ADAPTERS = [f"adapter-{i}" for i in range(12)]
FAST_RETRY = RetryPolicy(max_attempts=20, initial_backoff=0.05, max_backoff=0.2)


class NamedReplica(pb_grpc.InferenceServiceServicer):  # type: ignore[misc]
    """Answers every Generate with its own name as the text, and the header it got."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def Generate(
        self, request: pb.GenerateRequest, context: Any
    ) -> AsyncIterator[pb.GenerateResponse]:
        header = dict(context.invocation_metadata()).get(ADAPTER_HASH_HEADER, "")
        yield pb.GenerateResponse(text=self.name, adapter_name=header)
        yield pb.GenerateResponse(finish_reason=pb.FINISH_REASON_STOP)

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Any
    ) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(replica_id=self.name)


@asynccontextmanager
async def replicas(
    count: int, certs: CertFiles | None = None
) -> AsyncIterator[list[tuple[grpc.aio.Server, str]]]:
    """`count` named replicas on 127.0.0.1 (with TLS given `certs`), as (server, address)."""
    running: list[tuple[grpc.aio.Server, str]] = []
    try:
        for i in range(count):
            server = grpc.aio.server()
            pb_grpc.add_InferenceServiceServicer_to_server(NamedReplica(f"replica-{i}"), server)
            if certs is None:
                port = server.add_insecure_port("127.0.0.1:0")
            else:
                key_pair = (certs.server_key.read_bytes(), certs.server_cert.read_bytes())
                credentials = grpc.ssl_server_credentials([key_pair])
                port = server.add_secure_port("127.0.0.1:0", credentials)
            await server.start()
            running.append((server, f"127.0.0.1:{port}"))
        yield running
    finally:
        for server, _ in running:
            await server.stop(None)


def address_list(running: Sequence[tuple[grpc.aio.Server, str]]) -> str:
    return ",".join(address for _, address in running)


async def served_by(client: InferenceClient, adapter: str, times: int) -> set[str]:
    return {(await client.generate(adapter, "hi")).text for _ in range(times)}


def test_an_address_list_becomes_an_ipv4_target_over_several_replicas() -> None:
    assert parse_target("127.0.0.1:1, 127.0.0.1:2") == parse_target("ipv4:127.0.0.1:1,127.0.0.1:2")
    assert parse_target("127.0.0.1:1,127.0.0.1:2").target == "ipv4:127.0.0.1:1,127.0.0.1:2"
    assert parse_target("[::1]:1,[::1]:2").target == "ipv6:[::1]:1,[::1]:2"
    # TLS checks the replicas' certificates against the first address, not the list.
    assert parse_target("127.0.0.1:1,127.0.0.1:2").authority == "127.0.0.1:1"
    assert parse_target("dns:///inference:50052").replicas
    assert not parse_target("inference:50052").replicas


@pytest.mark.parametrize(
    ("address", "named"),
    [
        ("inference-a:1,inference-b:2", "dns:///"),
        ("127.0.0.1:1,[::1]:2", "mixes IPv4 and IPv6"),
        ("127.0.0.1,127.0.0.1:2", "has no :PORT"),
        ("::1:1,::1:2", "needs brackets"),
    ],
)
def test_an_address_list_gRPC_cannot_dial_is_refused_naming_why(address: str, named: str) -> None:
    with pytest.raises(InvalidArgument, match=named):
        parse_target(address)


def test_the_affinity_key_is_the_adapter_name_without_revision() -> None:
    assert affinity_key("alpha@7") == affinity_key("alpha") == "alpha"
    assert affinity_key("") == BASE_MODEL_HASH_KEY


def test_enabling_ring_hash_sets_the_variable_left_unset() -> None:
    environ: dict[str, str] = {}
    enable_ring_hash(environ)
    assert environ == {RING_HASH_ENV: "true"}


def test_a_variable_set_false_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RING_HASH_ENV, "false")
    with pytest.raises(RingHashDisabled, match=f"{RING_HASH_ENV}=true.*'false'"):
        InferenceClient("127.0.0.1:1,127.0.0.1:2", routing=RING_HASH)
    with pytest.raises(RingHashDisabled, match=RING_HASH_ENV):
        SyncInferenceClient("127.0.0.1:1,127.0.0.1:2", routing=RING_HASH)


@pytest.mark.parametrize("routing", [None, RING_HASH], ids=["bounded_load", "ring_hash"])
async def test_every_request_for_one_adapter_goes_to_one_replica(routing: str | None) -> None:
    async with (
        replicas(3) as running,
        InferenceClient(address_list(running), routing=routing) as client,
    ):
        owners = {adapter: await served_by(client, adapter, 8) for adapter in ADAPTERS}
    assert all(len(owner) == 1 for owner in owners.values()), owners
    # The ring spreads the adapters: a fleet of one would pass the line above.
    assert len(set().union(*owners.values())) > 1, owners


async def test_every_revision_and_the_name_go_to_one_replica_with_the_name_as_header() -> None:
    async with replicas(3) as running, InferenceClient(address_list(running)) as client:
        completions = [await client.generate(ref, "hi") for ref in ("alpha", "alpha@1", "alpha@2")]
        base = await served_by(client, "", 8)
    assert {c.text for c in completions} == {completions[0].text}
    assert {c.adapter_name for c in completions} == {"alpha"}
    assert len(base) == 1


async def test_a_stopped_replicas_adapters_move_to_another() -> None:
    async with (
        replicas(3) as running,
        InferenceClient(address_list(running), retry=FAST_RETRY) as client,
    ):
        owner = (await client.generate("alpha", "hi")).text
        await running[int(owner.removeprefix("replica-"))][0].stop(None)
        after = await served_by(client, "alpha", 4)
    assert len(after) == 1
    assert owner not in after


async def test_every_request_for_one_adapter_goes_to_one_replica_over_tls(
    tmp_path: Path,
) -> None:
    certs = make_certs(tmp_path)
    security = ClientSecurity(tls_ca_file=certs.ca_cert)
    async with (
        replicas(3, certs) as running,
        InferenceClient(address_list(running), security) as client,
    ):
        owners = {adapter: await served_by(client, adapter, 4) for adapter in ADAPTERS}
    assert all(len(owner) == 1 for owner in owners.values()), owners


async def test_server_info_answers_from_some_replica() -> None:
    async with replicas(3) as running, InferenceClient(address_list(running)) as client:
        info = await client.server_info()
    assert info.replica_id.startswith("replica-")


async def test_generate_across_replicas_from_adapterctl() -> None:
    async with replicas(3) as running, InferenceClient(address_list(running)) as client:
        owner = (await client.generate("alpha@3", "hi")).text
        result = await ctl("generate", "--inference", address_list(running), "alpha", "hi")
    assert (result.code, result.out.strip()) == (0, owner)


async def test_adapterctl_refuses_a_replica_list_it_cannot_dial() -> None:
    bad_list = await ctl("generate", "--inference", "a:1,b:2", "alpha", "hi")
    assert bad_list.code == 2
    assert "dns:///NAME:PORT" in bad_list.err


def test_a_fresh_process_routes_without_the_variable_set_by_the_user() -> None:
    """The variable is set for the user before the channel opens: in a process where grpc
    has already served and dialled without it."""
    script = (
        "import asyncio, sys\n"
        "from test_routing import replicas, address_list, served_by\n"
        "from loraserve.clients.inference import InferenceClient\n"
        "async def main():\n"
        "    async with replicas(3) as running:\n"
        "        async with InferenceClient(running[0][1]) as one:\n"
        "            await one.generate('alpha', 'hi')\n"
        "        async with InferenceClient(address_list(running)) as client:\n"
        "            print(len(await served_by(client, 'alpha', 4)))\n"
        "asyncio.run(main())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != RING_HASH_ENV}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout.strip()) == (0, "1"), done.stderr
