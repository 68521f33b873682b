"""The native transport's limits: on a request's size and compression, on floods of
frames, and what it says when a fault leaves it serving nothing."""

from __future__ import annotations

import asyncio
import gzip
import urllib.parse

import grpc
import hpack
import pytest

from loraserve.common.config.sizes import MESSAGE_LIMIT
from loraserve.inference.serving import GENERATE_METHOD
from loraserve.inference.transport.native import Metadata, Write
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.inference.native import native_only
from loraserve.testing.inference.native_fronts import (
    forever,
    native_front,
    recording,
    recording_stub,
)
from loraserve.testing.inference.raw_h2 import RawClient, RawFrames, request_headers, whole_call
from loraserve.testing.streams import messages
from loraserve.testing.waiting import eventually

pytestmark = native_only


async def test_native_transport_refuses_a_request_over_the_message_limit() -> None:
    async with recording_stub() as (stub, seen):
        too_large = pb.GenerateRequest(text="a" * (MESSAGE_LIMIT + 1))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await messages(stub.Generate(too_large, timeout=60))
        at_the_limit = pb.GenerateRequest(text="a" * (MESSAGE_LIMIT - 16))
        assert await messages(stub.Generate(at_the_limit, timeout=60)) == []
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.value.details() == (
        f"the request is larger than the limit of {MESSAGE_LIMIT} bytes"
    )
    assert [len(request) for request, _ in seen] == [at_the_limit.ByteSize()]


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
async def test_native_transport_inflates_a_compressed_request(
    compression: grpc.Compression,
) -> None:
    seen: list[tuple[bytes, Metadata]] = []
    front = native_front(recording(seen))
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{front.port}", compression=compression
        ) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            # grpc core sends an empty message uncompressed: this one is not empty.
            request = pb.GenerateRequest(text="compress me " * 100)
            await messages(stub.Generate(request, timeout=30))
    finally:
        front.close()
    assert [message for message, _ in seen] == [request.SerializeToString()]


def _framed(message: bytes, flag: int = 1) -> bytes:
    """A message as gRPC frames it: its flag (1: compressed), length and bytes."""
    return bytes([flag]) + len(message).to_bytes(4, "big") + message


@pytest.mark.parametrize(
    ("framed", "encoding", "code", "refusal"),
    [
        (
            _framed(gzip.compress(bytes(MESSAGE_LIMIT + 1))),
            "gzip",
            b"8",
            f"the request is larger than the limit of {MESSAGE_LIMIT} bytes decompressed",
        ),
        (_framed(b"not gzip"), "gzip", b"3", "the request's message does not decompress"),
        (_framed(b"x"), "identity", b"3", "flagged compressed, but its grpc-encoding names none"),
        (
            _framed(b"x"),
            "br",
            b"12",
            "grpc-encoding br is not supported: send identity,deflate,gzip",
        ),
        (_framed(b"x", flag=2), "gzip", b"3", "compressed flag must be 0 or 1, not 2"),
    ],
    ids=["bomb", "corrupt", "no-encoding", "unknown-encoding", "bad-flag"],
)
async def test_native_transport_refuses_a_compressed_request_it_cannot_inflate(
    framed: bytes, encoding: str, code: bytes, refusal: str
) -> None:
    seen: list[tuple[bytes, Metadata]] = []
    front = native_front(recording(seen))
    client = RawClient(front.port)
    try:
        stream = await asyncio.to_thread(
            client.call,
            GENERATE_METHOD,
            ("grpc-encoding", encoding),
            message=framed,
        )
        trailers = await asyncio.to_thread(client.trailers, stream)
    finally:
        client.close()
        front.close()
    assert trailers[b"grpc-status"] == code
    assert refusal in urllib.parse.unquote(trailers[b"grpc-message"].decode())
    assert trailers[b"grpc-accept-encoding"] == b"identity,deflate,gzip"
    assert seen == []


ENHANCE_YOUR_CALM = 0xB


async def _goaway_after(flood: bytes) -> int | None:
    """The error code of the GOAWAY a native front answers `flood` with (see RawFrames)."""
    front = native_front(forever)
    peer = RawFrames(front.port)
    try:
        await asyncio.to_thread(peer.send, flood)
        return await asyncio.to_thread(peer.goaway_code)
    finally:
        peer.close()
        front.close()


async def test_native_transport_ends_a_connection_flooding_continuation_frames() -> None:
    frame = RawFrames.frame
    flood = frame(RawFrames.HEADERS, 0, 1, request_headers())
    flood += frame(RawFrames.CONTINUATION, 0, 1, b"") * 1000
    assert await _goaway_after(flood) == ENHANCE_YOUR_CALM


async def test_native_transport_ends_a_connection_that_keeps_provoking_stream_resets() -> None:
    # A connection-level header is malformed in HTTP/2: h2 resets the stream.
    malformed = request_headers(("connection", "keep-alive"))
    flags = RawFrames.END_HEADERS | RawFrames.END_STREAM
    flood = b"".join(
        RawFrames.frame(RawFrames.HEADERS, flags, 2 * i + 1, malformed) for i in range(1100)
    )
    assert await _goaway_after(flood) == ENHANCE_YOUR_CALM


def _first_data(peer: RawFrames, stream: int) -> None:
    """Reads the server's frames until the first DATA frame of `stream`."""
    for kind, _, on, _ in peer.frames():
        if kind == RawFrames.DATA and on == stream:
            return
    raise AssertionError(f"the server closed the connection before stream {stream} had data")


async def test_native_transport_says_once_when_a_fault_leaves_it_serving_no_call() -> None:
    """A request HEADERS frame carrying a response's `:status` makes h2 0.3.13 panic with
    its connection's lock held, and the dispatcher every call needs panics on it next: the
    front cannot serve any call after that, and says why once, for its owner to stop it
    (the service reports NOT_SERVING and exits) rather than answer every call CANCELLED."""
    failures: list[str] = []

    async def streaming(request: bytes, metadata: Metadata, write: Write) -> None:
        while True:
            write(pb.GenerateResponse(text="x").SerializeToString())
            # Paced, not synchronising: the dispatcher has a message to write every pass.
            await asyncio.sleep(0.01)

    front = native_front(streaming, on_failure=failures.append)
    encoder = hpack.Encoder()
    peer = await asyncio.to_thread(RawFrames, front.port)
    try:
        await asyncio.to_thread(peer.send, whole_call(1, GENERATE_METHOD, encoder))
        # Streaming: the dispatcher holds the call's stream, so it writes there next.
        await asyncio.to_thread(_first_data, peer, 1)
        informational = encoder.encode([(":status", "103")])
        flags = RawFrames.END_HEADERS | RawFrames.END_STREAM
        await asyncio.to_thread(
            peer.send, RawFrames.frame(RawFrames.HEADERS, flags, 3, informational)
        )
        await eventually(lambda: bool(failures), "the front said it failed")
        # What is tested here is that nothing more is said, and an absence has no event
        # to wait on: a while for a second report (the listener's, the thread's) to come.
        await asyncio.sleep(0.1)
    finally:
        peer.close()
        front.close()
    assert len(failures) == 1
    assert failures[0].startswith("the dispatcher panicked")
    assert front.failure == failures[0]
