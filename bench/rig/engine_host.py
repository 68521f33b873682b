"""`python -m bench.rig.engine_host --control-fd FD serve ...`: the real inference server
(InferenceApp, same flags as `inference serve`) that also serves its engine through
bench.load.thin, so a load generator in another process can drive the same engine without
the service (arm "direct": VllmEngine.generate) or through the service's Generator
without gRPC (arm "generator"). It writes one JSON line on FD once SERVING:

    {"ready": true, "port": GRPC_PORT, "thin": {"direct": PORT, "generator": PORT}}

and serves until its stdin closes (stdout stays free for vLLM's own output).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
from typing import IO, Any

import uvloop

from bench.load import thin
from bench.rig.engine_callers import direct_caller, generator_caller
from loraserve.inference.__main__ import freeze_startup_heap
from loraserve.inference.app import InferenceApp
from loraserve.inference.engine import VllmEngine
from loraserve.inference.settings import parse_settings


def _reply(control: IO[str], message: dict[str, Any]) -> None:
    control.write(json.dumps(message) + "\n")
    control.flush()


async def _serve(argv: list[str], control: IO[str]) -> None:
    settings = parse_settings(argv, os.environ, socket.gethostname())
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    app = InferenceApp(settings)
    await app.start()
    servers: list[asyncio.Server] = []
    try:
        await app.run_engine_and_sync()
        runtime = app.runtime_ref.get()
        engine = runtime.engine
        assert isinstance(engine, VllmEngine)
        ports: dict[str, int] = {}
        for arm, caller in (
            ("direct", direct_caller(engine, runtime.registry)),
            ("generator", generator_caller(runtime.generator)),
        ):
            server, ports[arm] = await thin.serve(caller)
            servers.append(server)
        freeze_startup_heap()  # as `inference serve` does
        _reply(control, {"ready": True, "port": app.port, "thin": ports})
        while await asyncio.to_thread(sys.stdin.readline):
            pass
    finally:
        for server in servers:
            server.close()
        await app.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rig.engine_host")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("serve_argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    with os.fdopen(args.control_fd, "w") as control:
        # The event loop `inference serve` runs on (uvloop): the arms measure the product.
        uvloop.run(_serve(args.serve_argv, control))


# vLLM starts its engine process with `spawn`, which re-imports this module.
if __name__ == "__main__":
    main()
