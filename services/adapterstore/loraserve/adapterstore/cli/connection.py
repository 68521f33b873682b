"""Channels to the two servers, and turning their failures into `ServerError`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc

from loraserve.adapterstore.cli.failures import ServerError
from loraserve.adapterstore.cli.settings import CtlSettings
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc
from loraserve.common.errors import error_from_rpc
from loraserve.common.security import ClientSecurity, secure_channel

# Room for 1 MiB push chunks and long generations, as the servers allow.
_MESSAGE_LIMIT = 16 * 1024 * 1024
_CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", _MESSAGE_LIMIT),
    ("grpc.max_receive_message_length", _MESSAGE_LIMIT),
)

STORE = "adapter store"
INFERENCE = "inference service"


@asynccontextmanager
async def _channel(
    server: str, address: str, security: ClientSecurity
) -> AsyncIterator[grpc.aio.Channel]:
    try:
        async with secure_channel(address, security, _CHANNEL_OPTIONS) as channel:
            yield channel
    except grpc.aio.AioRpcError as exc:
        raise ServerError(error_from_rpc(exc), server, address) from None


@asynccontextmanager
async def store_stub(settings: CtlSettings) -> AsyncIterator[Any]:
    """An AdapterStoreService stub; a failed call leaves the block as `ServerError`."""
    async with _channel(STORE, settings.store_address, settings.store_security) as channel:
        yield adapterstore_pb2_grpc.AdapterStoreServiceStub(channel)


@asynccontextmanager
async def inference_stub(settings: CtlSettings) -> AsyncIterator[Any]:
    """An InferenceService stub; a failed call leaves the block as `ServerError`."""
    # Imported here: the store's commands (push above all) need not load these protos.
    from loraserve.inference.v1 import inference_pb2_grpc

    async with _channel(
        INFERENCE, settings.inference_address, settings.inference_security
    ) as channel:
        yield inference_pb2_grpc.InferenceServiceStub(channel)
