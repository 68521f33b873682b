"""Row 11, store side: SIGTERM on `adapterstore serve` while calls are in flight.

Health turns NOT_SERVING at once (seen on a health Watch opened before), watch
streams end with UNAVAILABLE at once so their clients can move on, a push that was
mid-stream still completes and commits within the grace period, the process exits
cleanly, and a watcher resuming from its last seq on the restarted store gets
every later change exactly once, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.adapters.files import AdapterFiles, tiny_adapter
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.plugins.figures import add_figure
from loraserve.testing.processes.services import StoreProcess, free_port, store_process
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.waiting import GUARD_S

pytestmark = [pytest.mark.faults, pytest.mark.slow]

# Longer than the test could need: the push held in flight must not be cut by it.
GRACE_S = 60


class HeldPush:
    """A push whose last message waits until `finish` is set: a call in flight."""

    def __init__(self, name: str, files: AdapterFiles) -> None:
        self._requests = list(push_requests(name, files, chunk_size=512))
        self.started = asyncio.Event()
        self.finish = asyncio.Event()

    async def requests(self) -> AsyncIterator[pb.PushAdapterRequest]:
        for request in self._requests[:-1]:
            yield request
        self.started.set()
        await self.finish.wait()
        yield self._requests[-1]


async def _next_event(call: Any) -> pb.AdapterEvent:
    async with asyncio.timeout(GUARD_S):
        while True:
            message = await call.read()
            assert message is not grpc.aio.EOF, "watch ended"
            if message.HasField("event"):
                return message.event  # type: ignore[no-any-return]


async def _watch_end(call: Any) -> grpc.StatusCode:
    """Reads a watch until it ends; its final status."""
    async with asyncio.timeout(GUARD_S):
        try:
            while await call.read() is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


async def _health_updates(channel: grpc.aio.Channel) -> AsyncIterator[int]:
    async for response in health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest()
    ):
        yield response.status


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
async def terminated(
    s3_bucket: S3Bucket, tmp_path: Path, port: int, pytestconfig: pytest.Config
) -> dict[str, Any]:
    """Pushes revision 1, then SIGTERMs the store with a watch, a health watch and a
    push (revision 2) in flight, finishes the push, and records what each saw."""
    extra = ["--shutdown-grace", str(GRACE_S)]
    held = HeldPush("graceful", tiny_adapter(seed=2))
    seen: dict[str, Any] = {}
    store: StoreProcess
    async with store_process(s3_bucket, tmp_path / "store-1.log", port=port, extra=extra) as store:
        async with (
            grpc.aio.insecure_channel(store.address) as channel,
            store_stub(store.address, channel) as stub,
        ):
            await push(stub, "graceful", tiny_adapter(seed=1))
            watch = stub.WatchAdapters(pb.WatchAdaptersRequest(after_seq=0))
            seen["events"] = [await _next_event(watch)]
            health = _health_updates(channel)
            seen["health"] = [await anext(health)]
            pushing = asyncio.ensure_future(stub.PushAdapter(held.requests(), timeout=GUARD_S))
            async with asyncio.timeout(GUARD_S):
                await held.started.wait()
            # The push must be in a handler before the SIGTERM: grpc cancels calls the
            # server has received but not yet handed to a handler when it shuts down
            # (grpc/grpc#41785), which a loaded machine made happen here. The server
            # hands calls to handlers in the order they arrived, so once a later call
            # on the same connection has been answered, the push is being handled.
            await stub.GetAdapter(pb.GetAdapterRequest(name="graceful"), timeout=GUARD_S)
            store.terminate()
            add_figure(pytestconfig, "faults.sigterm_store")
            async with asyncio.timeout(GUARD_S):
                seen["health"].append(await anext(health))
            seen["watch_end"] = await _watch_end(watch)
            seen["push_done_before_watch_end"] = pushing.done()
            held.finish.set()
            seen["pushed"] = await pushing
        seen["exit_code"] = await store.wait()
    return seen


async def test_sigterm_turns_health_not_serving(terminated: dict[str, Any]) -> None:
    assert terminated["health"] == [
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    ]


async def test_sigterm_ends_watch_streams_unavailable_without_waiting_for_the_grace(
    terminated: dict[str, Any],
) -> None:
    assert terminated["watch_end"] == grpc.StatusCode.UNAVAILABLE
    assert not terminated["push_done_before_watch_end"]


async def test_push_in_flight_at_sigterm_commits_and_the_store_exits_cleanly(
    terminated: dict[str, Any],
) -> None:
    assert terminated["pushed"].revision.revision == 2
    assert terminated["exit_code"] == 0


async def test_watcher_resumes_on_the_restarted_store_with_each_later_change_once(
    terminated: dict[str, Any], s3_bucket: S3Bucket, tmp_path: Path, port: int
) -> None:
    last_seen = terminated["events"][-1].seq
    async with (
        store_process(s3_bucket, tmp_path / "store-2.log", port=port) as store,
        store_stub(store.address) as stub,
    ):
        await push(stub, "graceful", tiny_adapter(seed=3))
        resumed = stub.WatchAdapters(pb.WatchAdaptersRequest(after_seq=last_seen))
        events = [await _next_event(resumed), await _next_event(resumed)]
        resumed.cancel()
    assert [(e.seq, e.revision.revision) for e in events] == [(2, 2), (3, 3)]
