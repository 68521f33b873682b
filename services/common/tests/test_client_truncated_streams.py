"""A Generate stream that ends with no status and no message (a proxy's truncation of a
response whose server died after its headers) goes again, as UNAVAILABLE does; a
server's own status does not."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import h2.config
import h2.connection
import h2.events
import pytest

from loraserve.clients.inference import InferenceClient, RetryPolicy
from loraserve.common.errors import LoraserveError
from loraserve.inference.v1 import inference_pb2 as pb

RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.05)
RESPONSE_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]


class TruncatingServer:
    """HTTP/2 on 127.0.0.1 answering its first `truncated` Generate calls as HAProxy ends
    a response whose server died after its headers (headers, then an empty DATA frame
    with END_STREAM: no message, no trailers, haproxy/haproxy#736), or, with `status`,
    with that status in trailers; the rest with one message and OK."""

    def __init__(self, truncated: int, status: int | None = None) -> None:
        self.truncated = truncated
        self.status = status
        self.calls = 0
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> TruncatingServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.StreamEnded):
                        self._answer(conn, event.stream_id)
                writer.write(conn.data_to_send())
                await writer.drain()
        writer.close()

    def _answer(self, conn: h2.connection.H2Connection, stream_id: int) -> None:
        self.calls += 1
        conn.send_headers(stream_id, RESPONSE_HEADERS)
        if self.calls <= self.truncated and self.status is None:
            conn.send_data(stream_id, b"", end_stream=True)
            return
        if self.calls <= self.truncated:
            conn.send_headers(stream_id, [("grpc-status", str(self.status))], end_stream=True)
            return
        message = pb.GenerateResponse(text="served").SerializeToString()
        conn.send_data(stream_id, b"\0" + len(message).to_bytes(4, "big") + message)
        conn.send_headers(stream_id, [("grpc-status", "0")], end_stream=True)


async def _texts(client: InferenceClient) -> AsyncIterator[str]:
    async for delta in client.stream("alpha", "hi"):
        yield delta.text


async def test_a_stream_truncated_before_its_first_message_goes_again() -> None:
    async with (
        TruncatingServer(truncated=2) as server,
        InferenceClient(server.address, retry=RETRY) as client,
    ):
        texts = [text async for text in _texts(client)]
    assert (texts, server.calls) == (["served"], 3)


async def test_a_servers_own_unknown_status_does_not_go_again() -> None:
    async with (
        TruncatingServer(truncated=1, status=2) as server,
        InferenceClient(server.address, retry=RETRY) as client,
    ):
        with pytest.raises(LoraserveError):
            _ = [text async for text in _texts(client)]
    assert server.calls == 1
