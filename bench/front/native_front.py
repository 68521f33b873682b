"""Generate on the native transport (bench/front/grpc_floor_native.py), on the real
generation path: the grpc.aio servicer's translation (`_command`, `_response`), the same
runtime and generator, Rust's h2 for the wire. bench/front/grpclib_front.py serves it
beside `inference serve` with `--native-port`; bench/front/stream_probe.py's `native` arm
streams from it. A probe, not a server to ship: no TLS, auth, deadlines, health or metrics
on its port, and a call the client cancels is not aborted in the engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from bench.front.grpc_floor_native import NativeFront
from loraserve.common.errors import LoraserveError
from loraserve.inference.serving.runtime import RuntimeRef
from loraserve.inference.serving.servicer import _command, _response
from loraserve.inference.v1 import inference_pb2 as pb


def _status(exc: Exception) -> tuple[int, str] | None:
    if isinstance(exc, LoraserveError):
        return int(exc.code.value[0]), exc.message
    return None


def serve_generate(runtime_ref: RuntimeRef, port: int = 0) -> NativeFront:
    """A listening native Generate on 127.0.0.1:`port` (0: ephemeral; see `.port`)."""

    async def generate(request: bytes, rollout_key: str) -> AsyncIterator[bytes]:
        command = _command(pb.GenerateRequest.FromString(request), rollout_key)
        chunks = runtime_ref.get().generator.generate(command)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                yield _response(chunk).SerializeToString()

    return NativeFront(generate, _status, port)
