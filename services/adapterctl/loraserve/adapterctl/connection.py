"""adapterctl's clients of the two servers, and turning their failures into `ServerError`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import grpc

from loraserve.adapterctl.failures import ServerError, UsageError
from loraserve.adapterctl.settings import CtlSettings
from loraserve.clients.store import store_channel, store_stub
from loraserve.common.errors import InvalidArgument, LoraserveError, error_from_rpc

if TYPE_CHECKING:
    from loraserve.clients.inference import InferenceClient

STORE = "adapter store"
INFERENCE = "inference service"


@asynccontextmanager
async def connect_store(settings: CtlSettings) -> AsyncIterator[Any]:
    """An AdapterStoreService stub; a failed call leaves the block as `ServerError`."""
    address = settings.store_address
    try:
        async with store_channel(address, settings.store_security) as channel:
            yield store_stub(channel)
    except grpc.aio.AioRpcError as exc:
        raise ServerError(error_from_rpc(exc), STORE, address) from None


@asynccontextmanager
async def connect_inference(settings: CtlSettings) -> AsyncIterator[InferenceClient]:
    """An `InferenceClient` (one server, or several replicas routed by adapter); a
    failed call leaves the block as `ServerError`, an address list it cannot route as
    `UsageError`."""
    # Imported here: the store's commands (push above all) need not load the inference protos.
    from loraserve.clients.inference import InferenceClient, RetryPolicy
    from loraserve.clients.routing import RingHashDisabled

    address = settings.inference_address
    try:
        # One attempt, as before: a person at a terminal retries by running it again
        # (across replicas, a dead one has left the ring by then).
        client = InferenceClient(
            address, settings.inference_security, retry=RetryPolicy(max_attempts=1)
        )
    except (InvalidArgument, RingHashDisabled) as exc:
        raise UsageError(f"--inference: {exc.message}") from None
    try:
        async with client:
            yield client
    except LoraserveError as exc:
        raise ServerError(exc, INFERENCE, address) from None
