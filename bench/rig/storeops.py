"""Talking to the adapter store the way users do: adapterctl's push, the inference
service's download cache."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from loraserve.adapterctl.adapter_dir import AdapterFiles, hash_files, list_adapter_dir
from loraserve.clients import push as pushes
from loraserve.clients.store import store_stub as _store_stub

# adapterctl's own limit on one push, so a 200 MB upload is not cut short.
PUSH_TIMEOUT_S = 600.0


def store_stub(channel: grpc.aio.Channel) -> Any:
    return _store_stub(channel)


async def hashed(directory: Path) -> AdapterFiles:
    """What `adapterctl push` sends: the directory's adapter files with their sha256."""
    listing = await asyncio.to_thread(list_adapter_dir, directory)
    return await asyncio.to_thread(hash_files, listing)


async def push(stub: Any, name: str, files: AdapterFiles, *, no_promote: bool = False) -> int:
    """Pushes one revision (made current unless `no_promote`); returns its number."""
    response = await pushes.push(
        stub,
        name,
        files,
        no_promote=no_promote,
        description="bench",
        timeout_s=PUSH_TIMEOUT_S,
        idempotency_key=pushes.new_idempotency_key(),
    )
    revision: int = response.revision.revision
    return revision
