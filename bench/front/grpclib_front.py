"""The real `inference serve`, with Generate served again beside it:

    python -m bench.front.grpclib_front --grpclib-port N [--native-port M] [--pushed-port P]
        SERVE-FLAGS...

over grpclib with its writes coalesced per event-loop pass (bench/front/grpc_floor_h2.py)
on port N, and, if asked, over the service's native transport (Rust's h2,
loraserve.inference.transport) with the engine's outputs pulled on port M, and pushed (as
`inference serve --grpc-transport native` serves it) on port P.

Step (1) of issue 28's path in docs/design.md, measured on the real generation path rather
than the floor's synthetic tokens: the same engine, registry, generator and proto
translation as the grpc.aio servicer, only the transport differs. bench/front/stream_probe.py's
`grpclib` and `native` arms stream from them, so the `grpc`, `grpclib` and `native` arms
measure one process. A probe, not a server to ship: it has no auth, no health service of
its own and no metrics on these ports.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from bench.front import cpu_split
from bench.front.grpc_floor_h2 import coalesce_grpclib_writes
from bench.front.grpc_floor_servers import GENERATE
from loraserve.common.errors import LoraserveError
from loraserve.common.rpc.security import ServerSecurity
from loraserve.inference import __main__ as inference_main
from loraserve.inference.adapters import ROLLOUT_KEY_HEADER
from loraserve.inference.app import InferenceApp
from loraserve.inference.serving import generate_command, generate_response
from loraserve.inference.serving.runtime import RuntimeRef
from loraserve.inference.transport import start_generate_front
from loraserve.inference.transport.native import NativeFront
from loraserve.inference.v1 import inference_pb2 as pb

log = logging.getLogger(__name__)


class GrpclibGenerate:
    """Generate over grpclib: the grpc.aio servicer's translation, another transport."""

    def __init__(self, runtime_ref: RuntimeRef) -> None:
        self._runtime_ref = runtime_ref

    def __mapping__(self) -> dict[str, Any]:
        from grpclib.const import Cardinality, Handler

        return {
            GENERATE: Handler(
                self.generate, Cardinality.UNARY_STREAM, pb.GenerateRequest, pb.GenerateResponse
            )
        }

    async def generate(self, stream: Any) -> None:
        from grpclib.const import Status
        from grpclib.exceptions import GRPCError

        request = await stream.recv_message()
        key = stream.metadata.get(ROLLOUT_KEY_HEADER, "") if stream.metadata else ""
        caller = self._runtime_ref.rollout_keys.caller(key, "")
        try:
            chunks = self._runtime_ref.get().generator.generate(generate_command(request, caller))
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    await stream.send_message(generate_response(chunk))
        except LoraserveError as exc:
            raise GRPCError(Status(exc.code.value[0]), exc.message) from exc


async def serve_generate(runtime_ref: RuntimeRef, port: int = 0) -> tuple[Any, int]:
    """A started grpclib server with GrpclibGenerate on 127.0.0.1, and its port."""
    from grpclib.server import Server

    coalesce_grpclib_writes()
    server = Server([GrpclibGenerate(runtime_ref)])
    await server.start("127.0.0.1", port)
    return server, server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def _app_class(port: int, native_port: int, pushed_port: int) -> type[InferenceApp]:
    class GrpclibApp(InferenceApp):
        """The inference app with a grpclib Generate (and native ones, if asked)
        listening beside its own server."""

        async def start(self) -> None:
            self._split: asyncio.Task[None] | None = None
            self._natives: list[NativeFront] = []
            await super().start()
            split_dir = os.environ.get(cpu_split.ENV)
            if split_dir:
                self._split = cpu_split.install(Path(split_dir) / f"{os.getpid()}.jsonl")
            self._grpclib, _ = await serve_generate(self.runtime_ref, port)
            for front_port, pushed in ((native_port, False), (pushed_port, True)):
                if front_port:
                    front = start_generate_front(
                        self.runtime_ref,
                        host="127.0.0.1",
                        port=front_port,
                        security=ServerSecurity(),
                        upstream=None,
                        max_connection_age_s=None,
                        pushed=pushed,
                    )
                    self._natives.append(front)

        async def stop(self) -> None:
            if self._split is not None:
                self._split.cancel()
            for front in self._natives:
                front.close()
            self._grpclib.close()
            await self._grpclib.wait_closed()
            await super().stop()

    return GrpclibApp


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.front.grpclib_front", allow_abbrev=False)
    parser.add_argument("--grpclib-port", type=int, required=True)
    parser.add_argument("--native-port", type=int, default=0)
    parser.add_argument("--pushed-port", type=int, default=0)
    args, serve_argv = parser.parse_known_args()
    # `serve` builds its app by this module-level name; the rest of start-up is the product's.
    app = _app_class(args.grpclib_port, args.native_port, args.pushed_port)
    inference_main.InferenceApp = app  # type: ignore[attr-defined]
    inference_main.main(serve_argv)


# vLLM's engine process is started with `spawn`, which re-imports this module.
if __name__ == "__main__":
    main()
