"""The benchmarks' own server hosts run on the event loop of the servers they stand for:
`inference serve` and `vllm serve` both run on uvloop, and asyncio's loop costs more per
callback, which the front-CPU figures would charge to the server."""

from __future__ import annotations

import asyncio
import os
import sys
from types import ModuleType
from typing import Any

import pytest
import uvloop

from bench.rig import engine_host, raw_engine


@pytest.mark.parametrize("host", [engine_host, raw_engine], ids=lambda m: m.__name__)
def test_a_bench_host_serves_on_uvloop(host: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    loops: list[type[asyncio.AbstractEventLoop]] = []

    async def serve(*_: Any) -> None:
        loops.append(type(asyncio.get_running_loop()))

    monkeypatch.setattr(host, "_serve", serve)
    read, write = os.pipe()
    monkeypatch.setattr(sys, "argv", [host.__name__, f"--control-fd={write}"])
    try:
        host.main()
    finally:
        os.close(read)

    assert loops == [uvloop.Loop]
