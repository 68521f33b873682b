"""The native transport (loraserve.inference.transport.native) on its own (handlers
without an engine, a grpc.aio server upstream): what a handler is given, how a call ends,
and the calls it carries to upstream."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import re
import socket
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import hpack
import pytest

from loraserve.common.config.sizes import MESSAGE_LIMIT
from loraserve.inference.serving import GENERATE_METHOD
from loraserve.inference.transport.native import (
    Ending,
    Handler,
    Metadata,
    NativeFront,
    Write,
)
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.certs import CertFiles, make_certs
from loraserve.testing.inference.native import native_only
from loraserve.testing.processes.tcpproxy import tcp_proxy
from loraserve.testing.streams import messages
from loraserve.testing.waiting import eventually

pytestmark = native_only


def _front(handler: Handler, *args: Any, **options: Any) -> NativeFront:
    """A native front serving `handler` at Generate's path."""
    return NativeFront(handler, *args, path=GENERATE_METHOD, **options)


async def test_native_transport_ends_a_call_internal_when_its_handler_fails() -> None:
    async def failing(request: bytes, metadata: Metadata, write: Write) -> None:
        write(pb.GenerateResponse(text="x").SerializeToString())
        raise RuntimeError("a bug in the handler")

    front = _front(failing)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            call = stub.Generate(pb.GenerateRequest(), timeout=30)
            first = await call.read()
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call.read()
        assert first.text == "x"
        assert failed.value.code() == grpc.StatusCode.INTERNAL
    finally:
        front.close()


async def test_native_transport_ends_a_failed_call_with_its_status_and_trailing_metadata() -> None:
    async def refused(request: bytes, metadata: Metadata, write: Write) -> None:
        raise RuntimeError("over quota")

    def status(exc: Exception) -> Ending:
        return 8, str(exc), [("retry-after", "3"), ("grpc-status", "0"), ("bad key", "x")]

    front = _front(refused, status)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            call = stub.Generate(pb.GenerateRequest(), timeout=30)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call.read()
    finally:
        front.close()
    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert failed.value.details() == "over quota"
    assert ("retry-after", "3") in tuple(failed.value.trailing_metadata() or ())


async def test_native_transport_lets_grpc_retry_a_call_ended_before_its_first_message() -> None:
    # Response headers sent before a message would commit the call (gRPC's retry policy
    # and a proxy between both stop there); a trailers-only response does not.
    attempts = 0

    async def unavailable_once(request: bytes, metadata: Metadata, write: Write) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise RuntimeError("engine lost")
        write(pb.GenerateResponse(text="x").SerializeToString())

    def status(exc: Exception) -> Ending:
        return grpc.StatusCode.UNAVAILABLE.value[0], str(exc), []

    retry = {
        "name": [{"service": "loraserve.inference.v1.InferenceService"}],
        "retryPolicy": {
            "maxAttempts": 2,
            "initialBackoff": "0.01s",
            "maxBackoff": "0.01s",
            "backoffMultiplier": 1,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }
    options = [("grpc.service_config", json.dumps({"methodConfig": [retry]}))]
    front = _front(unavailable_once, status)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}", options) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            responses = [r async for r in stub.Generate(pb.GenerateRequest(), timeout=30)]
    finally:
        front.close()
    assert [r.text for r in responses] == ["x"]
    assert attempts == 2


async def _forever(request: bytes, metadata: Metadata, write: Write) -> None:
    write(pb.GenerateResponse(text="x").SerializeToString())
    await asyncio.Event().wait()


@contextlib.asynccontextmanager
async def _front_watching_cancels(**options: Any) -> AsyncIterator[tuple[int, asyncio.Event]]:
    """A native front (made with `options`) whose handler writes one message, then waits
    until cancelled; the event is set once it has been."""
    cancelled = asyncio.Event()

    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        try:
            await _forever(request, metadata, write)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    front = _front(handler, **options)
    try:
        yield front.port, cancelled
    finally:
        front.close()


async def test_native_transport_cancels_the_handler_of_a_call_its_client_cancels() -> None:
    async with (
        _front_watching_cancels() as (port, cancelled),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest())
        assert (await call.read()).text == "x"
        call.cancel()
        await eventually(cancelled.is_set, "the handler cancelled")


async def test_native_transport_cancels_the_handler_of_a_call_whose_connection_drops() -> None:
    async with (
        _front_watching_cancels() as (port, cancelled),
        tcp_proxy(port) as proxy,
        grpc.aio.insecure_channel(proxy.address) as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest())
        assert (await call.read()).text == "x"
        proxy.cut()
        await eventually(cancelled.is_set, "the handler cancelled")


def _recording(seen: list[tuple[bytes, Metadata]]) -> Handler:
    """A handler that records each call's request and metadata in `seen`, and ends the
    call at once with no message."""

    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        seen.append((request, metadata))

    return handler


@contextlib.asynccontextmanager
async def _recording_stub() -> AsyncIterator[tuple[Any, list[tuple[bytes, Metadata]]]]:
    """A stub on a native front whose handler records each call's request and metadata,
    and ends it at once with no message."""
    seen: list[tuple[bytes, Metadata]] = []
    front = _front(_recording(seen))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            yield pb_grpc.InferenceServiceStub(channel), seen
    finally:
        front.close()


async def test_native_transport_hands_its_handler_the_metadata_less_transport_headers() -> None:
    async with _recording_stub() as (stub, seen):
        call = stub.Generate(
            pb.GenerateRequest(),
            timeout=30,
            metadata=(("authorization", "Bearer s3cret"), ("x-rollout-key", "user-7")),
        )
        assert await messages(call) == []
    _, metadata = seen[0]
    assert ("authorization", "Bearer s3cret") in metadata
    assert ("x-rollout-key", "user-7") in metadata
    assert not {"content-type", "te", "grpc-timeout", "user-agent"} & {k for k, _ in metadata}


@pytest.mark.parametrize(
    ("target", "authority"),
    [("ipv4:{address},{address}", None), ("{address}", "/run/loraserve/grpc.sock")],
    ids=["address-list", "socket-path"],
)
async def test_native_transport_serves_a_call_whose_authority_is_no_uri_authority(
    target: str, authority: str | None
) -> None:
    """grpc core sends an `ipv4:` target's address list ("A,B") as the authority, and
    grpc-java a Unix socket's path; gRPC's own servers serve both."""
    seen: list[tuple[bytes, Metadata]] = []
    front = _front(_recording(seen))
    address = f"127.0.0.1:{front.port}"
    options = [("grpc.default_authority", authority)] if authority else []
    try:
        async with grpc.aio.insecure_channel(target.format(address=address), options) as channel:
            call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(), timeout=30)
            assert await messages(call) == []
            assert await call.code() == grpc.StatusCode.OK
    finally:
        front.close()
    assert len(seen) == 1


class _Upstream:
    """A grpc.aio server of raw-bytes methods under /test.Echo/, standing for the
    service's own server behind the native transport."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.metadata: list[tuple[str, str]] = []
        self.server: grpc.aio.Server | None = None

    async def chat(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        seen = 0
        async for request in requests:
            seen += 1
            yield request
        context.set_trailing_metadata((("x-seen", str(seen)),))

    async def fail(self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        context.set_trailing_metadata((("x-why", "asked to"),))
        await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing: ü")

    async def hang(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        metadata = context.invocation_metadata() or ()
        self.metadata = [(k, str(v)) for k, v in metadata if k.startswith("x-")]
        yield request
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def sleep(self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return request

    async def flood(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        for i in range(2000):
            yield bytes([i % 256]) * (64 << 10)

    async def refuse_early(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        async for _ in requests:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no thanks")
        yield b""

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            "test.Echo",
            {
                "Chat": grpc.stream_stream_rpc_method_handler(self.chat),
                "Fail": grpc.unary_unary_rpc_method_handler(self.fail),
                "Hang": grpc.unary_stream_rpc_method_handler(self.hang),
                "Sleep": grpc.unary_unary_rpc_method_handler(self.sleep),
                "Flood": grpc.unary_stream_rpc_method_handler(self.flood),
                "RefuseEarly": grpc.stream_stream_rpc_method_handler(self.refuse_early),
            },
        )


@contextlib.asynccontextmanager
async def _front_before_upstream(
    tls: tuple[Path, Path, Path | None] | None = None, socket_path: Path | None = None
) -> AsyncIterator[tuple[int, _Upstream]]:
    """The port of a native front (TLS with `tls`) whose every call but Generate goes to
    an upstream, on loopback TCP or at `socket_path`, a Unix socket."""
    upstream = _Upstream()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((upstream.handler(),))
    if socket_path is None:
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    else:
        address = f"unix:{socket_path}"
        server.add_insecure_port(address)
    await server.start()
    front = _front(_forever, upstream=address, tls=tls)
    upstream.server = server
    try:
        yield front.port, upstream
    finally:
        front.close()
        await server.stop(None)


def _method(channel: grpc.aio.Channel, name: str) -> Any:
    """A /test.Echo/ method of `channel`, raw bytes each way."""
    kinds = {
        "Chat": channel.stream_stream,
        "Fail": channel.unary_unary,
        "Hang": channel.unary_stream,
        "Sleep": channel.unary_unary,
        "Flood": channel.unary_stream,
        "RefuseEarly": channel.stream_stream,
    }
    return kinds[name](f"/test.Echo/{name}")


async def test_native_transport_carries_a_stream_of_large_messages_both_ways_to_upstream() -> None:
    sent = [bytes([i]) * (1 << 20) for i in range(8)]

    async def requests() -> AsyncIterator[bytes]:
        for message in sent:
            yield message

    async with (
        _front_before_upstream() as (port, _),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = _method(channel, "Chat")(requests(), timeout=60)
        echoed = [message async for message in call]
        trailing = await call.trailing_metadata()
    assert echoed == sent
    assert ("x-seen", "8") in tuple(trailing)


async def test_native_transport_carries_upstreams_refusal_with_its_status_and_metadata() -> None:
    async with (
        _front_before_upstream() as (port, _),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _method(channel, "Fail")(b"", timeout=30)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert refused.value.details() == "no such thing: ü"
    assert ("x-why", "asked to") in tuple(refused.value.trailing_metadata() or ())


async def test_native_transport_carries_the_calls_metadata_to_upstream() -> None:
    async with (
        _front_before_upstream() as (port, upstream),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = _method(channel, "Hang")(b"x", timeout=30, metadata=(("x-rollout-key", "user-7"),))
        assert await call.read() == b"x"
        call.cancel()
    assert upstream.metadata == [("x-rollout-key", "user-7")]


async def test_native_transport_cancels_upstreams_call_when_its_client_cancels() -> None:
    async with (
        _front_before_upstream() as (port, upstream),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = _method(channel, "Hang")(b"x")
        assert await call.read() == b"x"
        call.cancel()
        await eventually(upstream.cancelled.is_set, "upstream's handler cancelled")


async def test_native_transport_cancels_upstreams_call_when_its_clients_connection_drops() -> None:
    async with (
        _front_before_upstream() as (port, upstream),
        tcp_proxy(port) as proxy,
        grpc.aio.insecure_channel(proxy.address) as channel,
    ):
        call = _method(channel, "Hang")(b"x")
        assert await call.read() == b"x"
        proxy.cut()
        await eventually(upstream.cancelled.is_set, "upstream's handler cancelled")


async def test_native_transport_carries_the_deadline_to_upstream() -> None:
    async with _front_before_upstream() as (port, _):
        client = await asyncio.to_thread(_RawClient, port)
        try:
            stream = client.call("/test.Echo/Hang", ("grpc-timeout", "1S"))
            trailers = await asyncio.to_thread(client.trailers, stream)
        finally:
            client.close()
    assert trailers[b"grpc-status"] == b"4"


async def test_native_transport_refuses_other_methods_unimplemented_without_upstream() -> None:
    front = _front(_forever)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await pb_grpc.InferenceServiceStub(channel).GetServerInfo(
                    pb.GetServerInfoRequest(), timeout=30
                )
    finally:
        front.close()
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert refused.value.details() == (
        "method /loraserve.inference.v1.InferenceService/GetServerInfo is not served here"
    )


async def test_native_transport_answers_unavailable_when_upstream_cannot_be_reached() -> None:
    with socket.socket() as unused:
        # Bound and never listening: a port nothing answers on.
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
        front = _front(_forever, upstream=address)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await _method(channel, "Fail")(b"", timeout=30)
        finally:
            front.close()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (refused.value.details() or "").startswith(f"upstream {address} unreachable")


async def _first_text(channel: grpc.aio.Channel) -> str:
    """The text of a Generate call's first message (the call is then cancelled)."""
    call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(), timeout=30)
    first = await call.read()
    call.cancel()
    return str(first.text)


def _credentials(certs: CertFiles, *, client_cert: bool) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=certs.ca_cert.read_bytes(),
        private_key=certs.client_key.read_bytes() if client_cert else None,
        certificate_chain=certs.client_cert.read_bytes() if client_cert else None,
    )


async def test_native_transport_serves_tls_to_a_client_that_trusts_its_ca(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    front = _front(_forever, tls=(certs.server_cert, certs.server_key, None))
    try:
        credentials = _credentials(certs, client_cert=False)
        async with grpc.aio.secure_channel(f"127.0.0.1:{front.port}", credentials) as channel:
            assert await _first_text(channel) == "x"
    finally:
        front.close()


async def test_native_transport_refuses_a_plaintext_client_when_it_serves_tls(
    tmp_path: Path,
) -> None:
    certs = make_certs(tmp_path)
    front = _front(_forever, tls=(certs.server_cert, certs.server_key, None))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _first_text(channel)
    finally:
        front.close()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("client_cert", [True, False], ids=["with-cert", "without-cert"])
async def test_native_transport_with_a_client_ca_serves_only_clients_with_its_certificate(
    tmp_path: Path, client_cert: bool
) -> None:
    certs = make_certs(tmp_path)
    front = _front(_forever, tls=(certs.server_cert, certs.server_key, certs.ca_cert))
    try:
        credentials = _credentials(certs, client_cert=client_cert)
        async with grpc.aio.secure_channel(f"127.0.0.1:{front.port}", credentials) as channel:
            if client_cert:
                assert await _first_text(channel) == "x"
            else:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await _first_text(channel)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        front.close()


async def test_native_transport_carries_calls_to_upstream_over_tls(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    async with _front_before_upstream(tls=(certs.server_cert, certs.server_key, certs.ca_cert)) as (
        port,
        _,
    ):
        credentials = _credentials(certs, client_cert=True)
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _method(channel, "Fail")(b"", timeout=30)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("broken", ["cert", "key", "client-ca"])
async def test_native_transport_refuses_a_tls_file_it_cannot_use_naming_it(
    tmp_path: Path, broken: str
) -> None:
    certs = make_certs(tmp_path / "certs")
    files = {"cert": certs.server_cert, "key": certs.server_key, "client-ca": certs.ca_cert}
    files[broken] = tmp_path / "not-pem.txt"
    files[broken].write_text("not a PEM file\n")
    with pytest.raises(ValueError, match=re.escape(str(files[broken]))):
        _front(_forever, tls=(files["cert"], files["key"], files["client-ca"]))


def _x_then_y(go_on: asyncio.Event) -> Handler:
    """A handler that writes "x", waits for `go_on`, then writes "y"."""

    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        write(pb.GenerateResponse(text="x").SerializeToString())
        await go_on.wait()
        write(pb.GenerateResponse(text="y").SerializeToString())

    return handler


async def test_native_transport_moves_new_calls_to_a_new_connection_once_one_is_old() -> None:
    go_on = asyncio.Event()
    front = _front(_x_then_y(go_on), max_connection_age_s=0.2)
    try:
        async with (
            tcp_proxy(front.port) as proxy,
            grpc.aio.insecure_channel(proxy.address) as channel,
        ):
            stub = pb_grpc.InferenceServiceStub(channel)
            old = stub.Generate(pb.GenerateRequest(), timeout=60)
            assert (await old.read()).text == "x"

            async def on_a_new_connection() -> bool:
                # Refused UNIMPLEMENTED (no upstream): what counts is the connection it took.
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
                return proxy.connections >= 2

            await eventually(on_a_new_connection, "a call on a new connection")
            go_on.set()
            last = await old.read()
            ended = await old.read()
            code = await old.code()
    finally:
        front.close()
    assert last.text == "y"
    assert ended is grpc.aio.EOF
    assert code == grpc.StatusCode.OK


@pytest.mark.parametrize("age", [-1.0, float("inf"), float("nan")])
async def test_native_transport_refuses_a_max_connection_age_it_cannot_keep(age: float) -> None:
    with pytest.raises(ValueError, match="max_connection_age_s must be seconds in"):
        _front(_forever, max_connection_age_s=age)


async def test_native_transport_refuses_a_request_over_the_message_limit() -> None:
    async with _recording_stub() as (stub, seen):
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
    front = _front(_recording(seen))
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
    front = _front(_recording(seen))
    client = _RawClient(front.port)
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


@contextlib.asynccontextmanager
async def _front_holding_calls() -> AsyncIterator[tuple[NativeFront, asyncio.Event, asyncio.Event]]:
    """A native front whose calls write "x", wait for the first event, then write "y";
    the second event is set once a call has been cancelled."""
    go_on, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        write(pb.GenerateResponse(text="x").SerializeToString())
        try:
            await go_on.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        write(pb.GenerateResponse(text="y").SerializeToString())

    front = _front(handler)
    try:
        yield front, go_on, cancelled
    finally:
        front.close()


async def _refused(port: int) -> bool:
    """Whether a call on a fresh connection to `port` is refused."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as fresh:
        try:
            await _first_text(fresh)
        except grpc.aio.AioRpcError as e:
            return e.code() == grpc.StatusCode.UNAVAILABLE
    return False


async def test_native_transport_stopping_refuses_new_calls_and_lets_running_ones_finish() -> None:
    async with (
        _front_holding_calls() as (front, go_on, _),
        grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(), timeout=60)
        assert (await call.read()).text == "x"
        stopping = asyncio.create_task(front.stop(30))
        await eventually(lambda: _refused(front.port), "a new connection refused")
        go_on.set()
        last = await call.read()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
        await stopping
    assert last.text == "y"


async def test_native_transport_stopping_cancels_what_is_still_running_after_the_grace() -> None:
    async with (
        _front_holding_calls() as (front, _, cancelled),
        grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(), timeout=60)
        assert (await call.read()).text == "x"
        await front.stop(0.2)
        assert cancelled.is_set()
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await call.read()
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ended.value.details() == "the server stopped before the call finished"


async def test_native_transport_carries_calls_to_an_upstream_on_a_unix_socket(
    tmp_path: Path,
) -> None:
    async with (
        _front_before_upstream(socket_path=tmp_path / "upstream.sock") as (port, _),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _method(channel, "Fail")(b"", timeout=30)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert refused.value.details() == "no such thing: ü"


class _RawClient:
    """An HTTP/2 client without a gRPC library, on a blocking socket: it sends what a
    test says, never resets a stream or keeps a deadline of its own, and grants no flow
    control window beyond HTTP/2's first 64 KiB."""

    def __init__(self, port: int) -> None:
        self._socket = socket.create_connection(("127.0.0.1", port))
        self._socket.settimeout(60)
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self._h2.initiate_connection()
        self._socket.sendall(self._h2.data_to_send())

    def call(self, path: str, *headers: tuple[str, str], message: bytes = b"\0\0\0\0\0") -> int:
        """Starts a call with `message` as its whole body (an empty request message); its
        stream id."""
        stream = int(self._h2.get_next_available_stream_id())
        self._h2.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *headers,
            ],
        )
        for start in range(0, len(message), 16384):
            self._h2.send_data(stream, message[start : start + 16384])
        self._h2.end_stream(stream)
        self._socket.sendall(self._h2.data_to_send())
        return stream

    def trailers(self, stream: int) -> dict[bytes, bytes]:
        """Reads until the stream ends; its trailers (or its trailers-only headers)."""
        last: dict[bytes, bytes] = {}
        while True:
            data = self._socket.recv(1 << 16)
            if not data:
                raise ConnectionError("the server closed the connection")
            for event in self._h2.receive_data(data):
                if getattr(event, "stream_id", None) != stream:
                    continue
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    last = dict(event.headers)
                if isinstance(event, h2.events.StreamEnded):
                    return last
            self._socket.sendall(self._h2.data_to_send())

    def read_data(self, stream: int, size: int) -> None:
        """Reads until `size` bytes of the stream's data have come, acknowledging none."""
        received = 0
        while received < size:
            data = self._socket.recv(1 << 16)
            if not data:
                raise ConnectionError("the server closed the connection")
            for event in self._h2.receive_data(data):
                if isinstance(event, h2.events.DataReceived) and event.stream_id == stream:
                    received += len(event.data)
            self._socket.sendall(self._h2.data_to_send())

    def close(self) -> None:
        self._socket.close()


@contextlib.asynccontextmanager
async def _front_watching_starts() -> AsyncIterator[tuple[int, asyncio.Event, asyncio.Event]]:
    """A native front whose handler writes nothing and waits until cancelled: its port, and
    events set once a handler has started and once one has been cancelled."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    front = _front(handler)
    try:
        yield front.port, started, cancelled
    finally:
        front.close()


REFUSED_STREAM = 0x7


def _whole_call(stream: int, path: str, encoder: hpack.Encoder) -> bytes:
    """A call's frames: its headers and one empty request message."""
    frame = _RawFrames.frame
    headers = _request_headers(("te", "trailers"), path=path, encoder=encoder)
    return frame(_RawFrames.HEADERS, _RawFrames.END_HEADERS, stream, headers) + frame(
        _RawFrames.DATA, _RawFrames.END_STREAM, stream, b"\0\0\0\0\0"
    )


async def test_native_transport_refuses_a_call_upstream_cannot_take_while_it_stops() -> None:
    """Upstream stops with the transport: a call that comes on an open connection before
    its client has seen the GOAWAY was never processed, and is refused so that the
    client's channel sends it again on a new connection."""
    encoder, held = hpack.Encoder(), asyncio.Event()

    async def holding(request: bytes, metadata: Metadata, write: Write) -> None:
        held.set()
        await asyncio.Event().wait()

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        front = _front(holding, upstream=f"127.0.0.1:{unused.getsockname()[1]}")
        peer = await asyncio.to_thread(_RawFrames, front.port)
        try:
            # A call the stop waits for, so the connection stays open while it stops.
            await asyncio.to_thread(peer.send, _whole_call(1, GENERATE_METHOD, encoder))
            await asyncio.wait_for(held.wait(), 30)
            stopping = asyncio.create_task(front.stop(30))
            await asyncio.sleep(0)  # the stop has begun
            await asyncio.to_thread(peer.send, _whole_call(3, "/test.Echo/Fail", encoder))
            code = await asyncio.to_thread(peer.reset_code, 3)
        finally:
            peer.close()
            front.close()
        await stopping
    assert code == REFUSED_STREAM


async def test_native_transport_ends_a_call_past_its_deadline_itself() -> None:
    async with _front_watching_starts() as (port, _, _):
        client = await asyncio.to_thread(_RawClient, port)
        try:
            stream = client.call(GENERATE_METHOD, ("grpc-timeout", "1S"))
            trailers = await asyncio.to_thread(client.trailers, stream)
        finally:
            client.close()
    assert trailers[b"grpc-status"] == b"4"


async def test_native_transport_cancels_a_handler_yet_to_write_when_its_client_cancels() -> None:
    async with (
        _front_watching_starts() as (port, started, cancelled),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest())
        await eventually(started.is_set, "the handler running")
        call.cancel()
        await eventually(cancelled.is_set, "the handler cancelled")


async def test_native_transport_ends_a_call_its_handler_cancels_with_a_status() -> None:
    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        raise asyncio.CancelledError

    front = _front(handler)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await _first_text(channel)
    finally:
        front.close()
    assert ended.value.code() == grpc.StatusCode.CANCELLED
    assert ended.value.details() == "the call was cancelled on the server"


async def test_native_transport_cancels_upstreams_unary_call_when_its_client_cancels() -> None:
    async with (
        _front_before_upstream() as (port, upstream),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = _method(channel, "Sleep")(b"x")
        await eventually(upstream.started.is_set, "upstream's handler running")
        call.cancel()
        await eventually(upstream.cancelled.is_set, "upstream's handler cancelled")


async def test_native_transport_carries_upstreams_status_when_it_refuses_a_call_streaming_in() -> (
    None
):
    async def requests() -> AsyncIterator[bytes]:
        # One message, then the request stream stays open: upstream refuses meanwhile.
        yield b"r"
        await asyncio.Event().wait()

    async with (
        _front_before_upstream() as (port, _),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await messages(_method(channel, "RefuseEarly")(requests(), timeout=60))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "no thanks"


async def test_native_transport_ends_a_carried_call_unavailable_when_upstream_goes() -> None:
    async with (
        _front_before_upstream() as (port, upstream),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = _method(channel, "Hang")(b"x", timeout=60)
        assert await call.read() == b"x"
        assert upstream.server is not None
        await upstream.server.stop(None)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await call.read()
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_native_transport_keeps_a_client_that_stops_reading_from_holding_up_another() -> None:
    sent = [b"m" * (2 << 20)]

    async def requests() -> AsyncIterator[bytes]:
        for message in sent:
            yield message

    async with _front_before_upstream() as (port, _):
        stalled = await asyncio.to_thread(_RawClient, port)
        try:
            stream = stalled.call("/test.Echo/Flood")
            # HTTP/2's first window, taken and never given back: the flood stalls here.
            await asyncio.to_thread(stalled.read_data, stream, 65_535)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                echoed = await messages(_method(channel, "Chat")(requests(), timeout=60))
        finally:
            stalled.close()
    assert echoed == sent


async def test_native_transport_stop_takes_any_grace() -> None:
    front = _front(_forever)
    await front.stop(float("inf"))


async def test_native_transport_stop_refuses_a_grace_that_is_not_a_number() -> None:
    front = _front(_forever)
    try:
        with pytest.raises(ValueError, match="grace must be a number of seconds or None"):
            await front.stop(float("nan"))
    finally:
        front.close()


async def test_native_transport_drops_a_connection_whose_peer_stops_answering_pings() -> None:
    async with _front_watching_cancels(keepalive_s=(0.2, 0.2)) as (port, cancelled):
        # The raw client answers nothing once its call is sent: not the server's pings.
        client = await asyncio.to_thread(_RawClient, port)
        try:
            client.call(GENERATE_METHOD)
            await eventually(cancelled.is_set, "the call's handler cancelled")
        finally:
            client.close()


async def test_native_transport_keeps_a_connection_whose_peer_answers_pings() -> None:
    go_on = asyncio.Event()
    # Pinged every 50 ms; a peer that answers is given far longer than it needs.
    front = _front(_x_then_y(go_on), keepalive_s=(0.05, 30.0))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(), timeout=60)
            assert (await call.read()).text == "x"
            await asyncio.sleep(0.5)  # ten pings, each answered by grpc's client
            go_on.set()
            last = await call.read()
            assert await call.code() == grpc.StatusCode.OK
    finally:
        front.close()
    assert last.text == "y"


@pytest.mark.parametrize("keepalive", [(0.0, 1.0), (1.0, float("nan"))])
async def test_native_transport_refuses_a_keepalive_it_cannot_keep(
    keepalive: tuple[float, float],
) -> None:
    with pytest.raises(ValueError, match=r"keepalive \w+ must be seconds in"):
        _front(_forever, keepalive_s=keepalive)


class _RawFrames:
    """An HTTP/2 peer that writes frames byte by byte, for what no client library sends:
    floods of frames the server must refuse, or a call after the server's GOAWAY."""

    PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY, CONTINUATION = 0x0, 0x1, 0x3, 0x4, 0x7, 0x9
    END_STREAM, END_HEADERS = 0x1, 0x4

    def __init__(self, port: int) -> None:
        self._socket = socket.create_connection(("127.0.0.1", port))
        self._socket.settimeout(30)
        self._socket.sendall(self.PREFACE + self.frame(self.SETTINGS, 0, 0, b""))

    @staticmethod
    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return (
            len(payload).to_bytes(3, "big")
            + bytes([kind, flags])
            + (stream.to_bytes(4, "big") + payload)
        )

    def send(self, frames: bytes) -> None:
        """Sends `frames`; a server that closed the connection meanwhile is no error."""
        with contextlib.suppress(ConnectionError):
            self._socket.sendall(frames)

    def frames(self) -> Iterator[tuple[int, int, int, bytes]]:
        """The server's frames as (type, flags, stream, payload), until it closes."""
        buffer = b""
        while True:
            try:
                data = self._socket.recv(1 << 16)
            except ConnectionError:
                data = b""
            buffer += data
            while len(buffer) >= 9:
                length = int.from_bytes(buffer[:3], "big")
                if len(buffer) < 9 + length:
                    break
                stream = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
                yield buffer[3], buffer[4], stream, buffer[9 : 9 + length]
                buffer = buffer[9 + length :]
            if not data:
                return

    def goaway_code(self) -> int | None:
        """The error code of the GOAWAY the server sends before it closes; None if it
        closes without one."""
        for kind, _, _, payload in self.frames():
            if kind == self.GOAWAY:
                return int.from_bytes(payload[4:8], "big")
        return None

    def reset_code(self, stream: int) -> int | None:
        """The error code the server resets `stream` with; None if the stream ends
        otherwise (trailers) or the connection closes first."""
        for kind, flags, on, payload in self.frames():
            if on == stream and kind == self.RST_STREAM:
                return int.from_bytes(payload, "big")
            if on == stream and kind == self.HEADERS and flags & self.END_STREAM:
                return None
        return None

    def close(self) -> None:
        self._socket.close()


ENHANCE_YOUR_CALM = 0xB


def _request_headers(
    *extra: tuple[str, str], path: str = GENERATE_METHOD, encoder: hpack.Encoder | None = None
) -> bytes:
    return (encoder or hpack.Encoder()).encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            *extra,
        ]
    )


async def _goaway_after(flood: bytes) -> int | None:
    """The error code of the GOAWAY a native front answers `flood` with (see _RawFrames)."""
    front = _front(_forever)
    peer = _RawFrames(front.port)
    try:
        await asyncio.to_thread(peer.send, flood)
        return await asyncio.to_thread(peer.goaway_code)
    finally:
        peer.close()
        front.close()


async def test_native_transport_ends_a_connection_flooding_continuation_frames() -> None:
    frame = _RawFrames.frame
    flood = frame(_RawFrames.HEADERS, 0, 1, _request_headers())
    flood += frame(_RawFrames.CONTINUATION, 0, 1, b"") * 1000
    assert await _goaway_after(flood) == ENHANCE_YOUR_CALM


async def test_native_transport_ends_a_connection_that_keeps_provoking_stream_resets() -> None:
    # A connection-level header is malformed in HTTP/2: h2 resets the stream.
    malformed = _request_headers(("connection", "keep-alive"))
    flags = _RawFrames.END_HEADERS | _RawFrames.END_STREAM
    flood = b"".join(
        _RawFrames.frame(_RawFrames.HEADERS, flags, 2 * i + 1, malformed) for i in range(1100)
    )
    assert await _goaway_after(flood) == ENHANCE_YOUR_CALM


def _first_data(peer: _RawFrames, stream: int) -> None:
    """Reads the server's frames until the first DATA frame of `stream`."""
    for kind, _, on, _ in peer.frames():
        if kind == _RawFrames.DATA and on == stream:
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
            await asyncio.sleep(0.01)

    front = _front(streaming, on_failure=failures.append)
    encoder = hpack.Encoder()
    peer = await asyncio.to_thread(_RawFrames, front.port)
    try:
        await asyncio.to_thread(peer.send, _whole_call(1, GENERATE_METHOD, encoder))
        # Streaming: the dispatcher holds the call's stream, so it writes there next.
        await asyncio.to_thread(_first_data, peer, 1)
        informational = encoder.encode([(":status", "103")])
        flags = _RawFrames.END_HEADERS | _RawFrames.END_STREAM
        await asyncio.to_thread(
            peer.send, _RawFrames.frame(_RawFrames.HEADERS, flags, 3, informational)
        )
        await eventually(lambda: bool(failures), "the front said it failed")
        await asyncio.sleep(0.1)  # later doorbells say nothing more
    finally:
        peer.close()
        front.close()
    assert len(failures) == 1
    assert failures[0].startswith("the dispatcher panicked")
    assert front.failure == failures[0]
