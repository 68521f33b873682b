"""`inference serve --model PATH --store ADDR ...`: the inference server's entry point."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import sys
from collections.abc import Sequence

import uvloop

from loraserve.common.errors import LoraserveError, Unavailable
from loraserve.common.rpc import retrylog
from loraserve.common.rpc.server import install_stop_signals
from loraserve.common.tracing import LOG_FORMAT, start_tracing
from loraserve.inference.app import InferenceApp
from loraserve.inference.settings import InferenceSettings, parse_settings

log = logging.getLogger("loraserve.inference")


async def serve(settings: InferenceSettings) -> None:
    """Runs the server until SIGTERM or SIGINT, then shuts down gracefully. Where the
    gRPC front can serve no Generate any more (the native transport failed), it stops
    the same way (NOT_SERVING first) and raises: the process exits 1, for its
    supervisor to restart, instead of answering health SERVING while every call fails."""
    stop = asyncio.Event()
    install_stop_signals(stop)
    app = InferenceApp(settings)
    await app.start()
    starting = asyncio.create_task(app.run_engine_and_sync(), name="engine-start")
    stopping = asyncio.create_task(stop.wait())
    failing = asyncio.create_task(app.grpc_front.failure(), name="transport-failure")
    try:
        await asyncio.wait({starting, stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()  # re-raises why start-up failed
            if not failing.done():
                freeze_startup_heap()
                await asyncio.wait({stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
        if failing.done():
            raise Unavailable(f"the native transport can serve no call: {failing.result()}")
    finally:
        for task in (starting, stopping, failing):
            task.cancel()
        await asyncio.gather(starting, stopping, failing, return_exceptions=True)
        await app.stop()


def freeze_startup_heap() -> None:
    """Puts what start-up allocated (torch, vLLM, the engine client) out of the cyclic
    GC's reach, as vLLM's engine core does with its own heap. Profiled while streaming,
    full collections over that heap took about a fifth of the event loop's time;
    afterwards they scan only what serving allocates."""
    gc.collect()
    gc.freeze()
    log.info("server.heap_frozen objects=%d", gc.get_freeze_count())


def main(argv: Sequence[str] | None = None) -> None:
    try:
        settings = parse_settings(
            sys.argv[1:] if argv is None else argv, os.environ, socket.gethostname()
        )
    except LoraserveError as exc:
        sys.stderr.write(f"inference: {exc.message}\n")
        raise SystemExit(2) from exc
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT)
    retrylog.install()
    stop_tracing = start_tracing(settings.tracing, "loraserve-inference")
    try:
        # uvloop, as `vllm serve` runs: asyncio's own loop costs more per callback, and a
        # streamed message is several (grpc's completion, the task's step, vLLM's wake-up).
        uvloop.run(serve(settings))
    except LoraserveError as exc:
        log.error("server.failed error=%s", exc.message)
        raise SystemExit(1) from exc
    finally:
        # Flushes the spans still batched, so what happened just before a stop is traced.
        stop_tracing()


# vLLM starts its engine process with `spawn`, which re-imports this module.
if __name__ == "__main__":
    main()
