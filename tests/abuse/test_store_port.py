"""Every attack of the abuse suite at full size that applies to the adapter store's port
(grpc.aio): downloads never read (b), unfinished bodies with no token on a streamed and a
unary method (c), idle connections (d), calls reset as soon as answered (e) and gzip bombs
(f). During and after each, 8 normal clients call GetAdapter in a closed loop with no
failure and a p99 within 2x of before; the store's peak RSS stays within 256 MiB of
before; Health says SERVING; and afterwards no attacker's connection is held."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from grpc_health.v1 import health_pb2

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.abuse import call_headers, grpc_frame
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.attack_figures import run_attack
from loraserve.testing.attacks import (
    gzip_bombs,
    idle_connections,
    reset_loop,
    unfinished_bodies,
    zero_window,
)
from loraserve.testing.processes.abused import (
    ATTACKER_ADAPTER,
    ATTACKER_TOKEN,
    AbusedStore,
    abused_store,
)
from loraserve.testing.s3.endpoint import S3Bucket

pytestmark = [pytest.mark.slow]

SERVICE = "/loraserve.adapterstore.v1.AdapterStoreService"
DOWNLOAD = call_headers(f"{SERVICE}/DownloadAdapter", ATTACKER_TOKEN)
DOWNLOAD_BODY = grpc_frame(pb.DownloadAdapterRequest(name=ATTACKER_ADAPTER).SerializeToString())
GET_BODY = grpc_frame(pb.GetAdapterRequest(name=ATTACKER_ADAPTER).SerializeToString())


@pytest.fixture(scope="module")
async def store(
    module_s3_bucket: S3Bucket,
    tiny_adapter: TinyAdapterFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[AbusedStore]:
    async with abused_store(
        module_s3_bucket, tiny_adapter, tmp_path_factory.mktemp("abused-store")
    ) as running:
        yield running


async def test_twenty_downloads_never_read(store: AbusedStore, pytestconfig: pytest.Config) -> None:
    attack = "b_zero_window"
    await run_attack(
        store, attack, lambda port: zero_window(port, DOWNLOAD, DOWNLOAD_BODY), pytestconfig
    )


@pytest.mark.parametrize("method", ["PushAdapter", "GetAdapter"])
async def test_two_hundred_unfinished_bodies_without_a_token(
    store: AbusedStore, pytestconfig: pytest.Config, method: str
) -> None:
    await run_attack(
        store,
        f"c_unfinished_bodies_{method.lower()}",
        lambda port: unfinished_bodies(port, f"{SERVICE}/{method}"),
        pytestconfig,
    )


async def test_five_thousand_idle_connections(
    store: AbusedStore, pytestconfig: pytest.Config
) -> None:
    await run_attack(
        store, "d_idle_connections", lambda port: idle_connections(port, 5000), pytestconfig
    )


@pytest.mark.parametrize("method", ["GetAdapter", "Health"])
async def test_calls_reset_as_soon_as_answered(
    store: AbusedStore, pytestconfig: pytest.Config, method: str
) -> None:
    if method == "Health":
        headers = call_headers("/grpc.health.v1.Health/Check", ATTACKER_TOKEN)
        body = grpc_frame(health_pb2.HealthCheckRequest().SerializeToString())
    else:
        headers, body = call_headers(f"{SERVICE}/GetAdapter", ATTACKER_TOKEN), GET_BODY
    await run_attack(
        store,
        f"e_reset_loop_{method.lower()}",
        lambda port: reset_loop(port, headers, body),
        pytestconfig,
    )


async def test_five_hundred_gzip_bombs_with_deadlines(
    store: AbusedStore, pytestconfig: pytest.Config
) -> None:
    headers = call_headers(f"{SERVICE}/GetAdapter", ATTACKER_TOKEN, encoding="gzip")
    await run_attack(store, "f_gzip_bombs", lambda port: gzip_bombs(port, headers), pytestconfig)
