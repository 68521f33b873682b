"""Talking to the running servers as a user would: health, pushes, what is served.

Pushes go through the adapter store's public API with the push adapterctl uses
(`loraserve.clients.push`), so the demo publishes adapters exactly as `adapterctl push` does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraserve.adapterctl.adapter_dir import hash_files, list_adapter_dir
from loraserve.clients.inference import InferenceClient
from loraserve.clients.push import new_idempotency_key, push
from loraserve.clients.store import store_channel, store_stub
from loraserve.common.errors import DeadlineExceeded, error_from_rpc
from loraserve.common.rpc.security import ClientSecurity, secure_channel
from loraserve.inference.v1 import inference_pb2 as inference_pb

log = logging.getLogger(__name__)

_POLL_S = 0.25


async def is_serving(address: str, security: ClientSecurity) -> bool:
    """Whether the server at `address` answers its health check with SERVING."""
    async with secure_channel(address, security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
        except grpc.aio.AioRpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def push_directory(
    store_address: str, security: ClientSecurity, name: str, directory: Path, description: str
) -> int:
    """Publishes `directory` as a new current revision of `name`; the revision number."""
    listing = await asyncio.to_thread(list_adapter_dir, directory)
    files = await asyncio.to_thread(hash_files, listing)
    key = new_idempotency_key()
    async with store_channel(store_address, security) as channel:
        try:
            response = await push(
                store_stub(channel),
                name,
                files,
                no_promote=False,
                description=description,
                timeout_s=60.0,
                idempotency_key=key,
            )
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
    revision = int(response.revision.revision)
    log.info("run.pushed name=%s revision=%d dir=%s", name, revision, directory)
    return revision


async def wait_until_routed(
    inference_address: str,
    security: ClientSecurity,
    wanted: dict[str, int],
    timeout_s: float,
) -> dict[tuple[str, int], str]:
    """Waits until the inference service routes each name to its wanted revision;
    then the state of every revision it holds, e.g. {("pirate", 1): "draining"}."""
    deadline = time.monotonic() + timeout_s
    async with InferenceClient(inference_address, security, timeout=5.0) as client:
        while True:
            reply = await client.list_adapters()
            routed = {
                status.name: int(status.revision)
                for status in reply.adapters
                if status.current and status.state == inference_pb.ADAPTER_STATE_READY
            }
            missing = {name: rev for name, rev in wanted.items() if routed.get(name) != rev}
            if not missing:
                return {
                    (status.name, int(status.revision)): inference_pb.AdapterState.Name(
                        status.state
                    )
                    .removeprefix("ADAPTER_STATE_")
                    .lower()
                    for status in reply.adapters
                }
            if time.monotonic() > deadline:
                raise DeadlineExceeded(
                    f"the inference service did not serve {missing} within {timeout_s:.0f} s"
                )
            await asyncio.sleep(_POLL_S)
