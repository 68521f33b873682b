"""Store writes retried on UNAVAILABLE, safely: every retry carries the same
idempotency key, so a write that was committed before the failure (the store
crashed before answering, the answer was lost) is answered with its original
result instead of being made twice."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from loraserve.common.backoff import Backoff

T = TypeVar("T")

WRITE_ATTEMPTS = 3
_FIRST_S = 0.5
_MAX_S = 4.0


def new_idempotency_key() -> str:
    """A key for one intended change: made once, reused by every retry of it."""
    return str(uuid.uuid4())


def _ignore(exc: grpc.aio.AioRpcError, delay_s: float) -> None:
    return None


async def retry_unavailable(
    call: Callable[[], Awaitable[T]],
    on_retry: Callable[[grpc.aio.AioRpcError, float], None] = _ignore,
    attempts: int = WRITE_ATTEMPTS,
) -> T:
    """Awaits `call()`, again after a jittered backoff while it fails UNAVAILABLE,
    at most `attempts` times. `call` must send the same idempotency key each time."""
    backoff = Backoff(_FIRST_S, _MAX_S)
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.UNAVAILABLE or attempt == attempts:
                raise
            delay = backoff.next_delay()
            on_retry(exc, delay)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")
