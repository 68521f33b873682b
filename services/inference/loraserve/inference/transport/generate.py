"""Generate on the native transport: the grpc.aio servicer's translation and checks
(auth, the request's parse, the rollout key, the error mapping), the runtime's generator,
Rust's h2 for the wire. With `pushed`, a plain request's messages are made in the
engine's output handler (`loraserve.inference.serving.pushed`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from google.protobuf.message import DecodeError

from loraserve.common.errors import InvalidArgument
from loraserve.common.rpc.auth import TokenAuth
from loraserve.common.rpc.grpcutil import status_for
from loraserve.common.rpc.security import ServerSecurity
from loraserve.inference.serving import (
    GENERATE_METHOD,
    GRPC_GENERATE_SPAN,
    ChunkWriter,
    GenerationChunk,
    RuntimeRef,
    TraceOrigin,
    generate_command,
    generate_response,
    rollout_caller,
)
from loraserve.inference.transport.native import Ending, Metadata, NativeFront, Write
from loraserve.inference.v1 import inference_pb2 as pb

NATIVE_GENERATE_SPAN = {**GRPC_GENERATE_SPAN, "loraserve.transport": "native"}


def _ending(exc: Exception) -> Ending:
    code, message, trailers = status_for(exc, GENERATE_METHOD)
    return code.value[0], message, trailers


def _chunk_writer(write: Write) -> ChunkWriter:
    def write_chunk(chunk: GenerationChunk) -> None:
        write(generate_response(chunk).SerializeToString())

    return write_chunk


def start_generate_front(
    runtime_ref: RuntimeRef,
    *,
    host: str,
    port: int,
    security: ServerSecurity,
    upstream: str | None,
    max_connection_age_s: float | None,
    pushed: bool,
    on_failure: Callable[[str], None] | None = None,
) -> NativeFront:
    """A listening native front on `host`:`port` (0: ephemeral; see `.port`) serving
    Generate, and carrying every other call to the grpc.aio server at `upstream` (None:
    refusing them). A call needs a token as that server's guard asks for Generate; TLS
    comes from `security`. With `pushed`, a plain request's messages are made in the
    engine's output handler where the runtime's generator can push. `on_failure`: see
    NativeFront."""
    auth = TokenAuth(security) if security.auth_enabled else None
    tls = None
    if security.tls_cert_file is not None and security.tls_key_file is not None:
        tls = (security.tls_cert_file, security.tls_key_file, security.tls_client_ca_file)

    async def generate(request: bytes, metadata: Metadata, write: Write) -> None:
        try:
            parsed = pb.GenerateRequest.FromString(request)
        except DecodeError as exc:
            raise InvalidArgument(f"the request message does not parse: {exc}") from exc
        if auth is not None:
            auth.authenticate(metadata)
        # The transport knows no peer address: without a principal or a trusted key the
        # caller is unknown to the guard's count of callers.
        caller = rollout_caller(runtime_ref.rollout_keys, metadata)
        origin = TraceOrigin(metadata, NATIVE_GENERATE_SPAN)
        command = generate_command(parsed, caller, origin)
        chunks = runtime_ref.get().generator.generate(
            command, _chunk_writer(write) if pushed else None
        )
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                write(generate_response(chunk).SerializeToString())

    return NativeFront(
        generate,
        _ending,
        port,
        path=GENERATE_METHOD,
        host=host,
        upstream=upstream,
        tls=tls,
        max_connection_age_s=max_connection_age_s,
        on_failure=on_failure,
    )
