"""The OpenAI front's streamed responses: server-sent events that end the generation
however the response ends, its client gone or not reading."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

log = logging.getLogger(__name__)


class EventStream(StreamingResponse):
    """Server-sent events that close the generation however the response ends.

    Starlette stops iterating when the client disconnects but leaves the iterators
    open; closing them here aborts the engine request now, not at garbage collection.
    An event the client leaves unread for `stalled_write_s` (the socket's buffer full:
    uvicorn's send waits on it, with no clock of its own) ends the response the same way,
    so a client that stops reading holds no engine request, admission slot or lease.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncGenerator[str, None],
        chunks: Sequence[AsyncGenerator[Any, None]],
        headers: dict[str, str],
        stalled_write_s: float | None,
    ) -> None:
        # no-cache and x-accel-buffering: proxies must pass events on as they come.
        no_buffering = {"cache-control": "no-cache", "x-accel-buffering": "no"}
        super().__init__(events, headers=headers | no_buffering)
        self._events = events
        self._chunks = chunks
        self._stalled_write_s = stalled_write_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, self._clocked(send))
        except _Stalled:
            # Returning with the response unfinished: uvicorn closes the connection.
            log.warning(
                "openai.client_stalled path=%s seconds=%g", scope.get("path"), self._stalled_write_s
            )
        finally:
            await self._events.aclose()
            for chunks in self._chunks:
                await chunks.aclose()

    def _clocked(self, send: Send) -> Send:
        stalled_write_s = self._stalled_write_s
        if stalled_write_s is None:
            return send

        async def clocked(message: Message) -> None:
            try:
                async with asyncio.timeout(stalled_write_s):
                    await send(message)
            except TimeoutError:
                raise _Stalled from None

        return clocked


class _Stalled(Exception):
    """The client read none of the stream for the stalled-write timeout."""
