"""`python -m bench.engine_host --control-fd FD serve ...`: the real inference server
(InferenceApp, same flags as `inference serve`) plus a control channel, so the same
engine can also be driven in-process. Commands arrive as JSON lines on stdin, replies
leave as JSON lines on FD (stdout stays free for vLLM's own output).

    {"op": "run", "arm": "direct" | "generator", "workload": {...}} -> {"records": [...]}
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

from bench.calls import direct_caller, generator_caller, resolve_handles
from bench.workload import Workload, run_closed_loop
from loraserve.inference.__main__ import freeze_startup_heap
from loraserve.inference.app import InferenceApp
from loraserve.inference.engine import VllmEngine
from loraserve.inference.settings import parse_settings


async def _command(app: InferenceApp, message: dict[str, Any]) -> dict[str, Any]:
    runtime = app.runtime_ref.get()
    if message["op"] != "run":
        return {"error": f"unknown op {message['op']!r}"}
    workload = Workload.from_json(message["workload"])
    if message["arm"] == "generator":
        caller = generator_caller(runtime.generator)
    else:
        engine = runtime.engine
        assert isinstance(engine, VllmEngine)
        caller = direct_caller(engine, await resolve_handles(runtime.registry, workload.adapters))
    result = await run_closed_loop(workload, caller)
    return {"records": result.to_json()}


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
    try:
        await app.run_engine_and_sync()
        freeze_startup_heap()  # as `inference serve` does
        _reply(control, {"ready": True, "port": app.port})
        while line := await asyncio.to_thread(sys.stdin.readline):
            _reply(control, await _command(app, json.loads(line)))
    finally:
        await app.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_host")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("serve_argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    with os.fdopen(args.control_fd, "w") as control:
        asyncio.run(_serve(args.serve_argv, control))


# vLLM starts its engine process with `spawn`, which re-imports this module.
if __name__ == "__main__":
    main()
