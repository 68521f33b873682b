"""Row 1: the store SIGKILLed after uploading an adapter's blobs, before the log commit.

A fault proxy in front of S3 holds the store's conditional PUT to `log/`: at that
moment every blob is stored and nothing is committed. The store process is then
SIGKILLed, so no clean-up code runs, and the held PUT is dropped unforwarded.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.plugins.figures import add_figure
from loraserve.testing.processes.services import free_port, store_process
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import Fault, s3_fault_proxy
from loraserve.testing.store.calls import (
    first_watch_messages,
    keys_under,
    push,
    revision_numbers,
    store_stub,
)
from loraserve.testing.waiting import GUARD_S

pytestmark = [pytest.mark.faults, pytest.mark.slow]


async def _kill_store_before_commit(
    bucket: S3Bucket, log_dir: Path, port: int, config: pytest.Config
) -> None:
    """Pushes through a store that is SIGKILLed once its commit reaches S3."""
    s3_port = urlsplit(bucket.endpoint_url).port
    assert s3_port is not None
    async with s3_fault_proxy(s3_port) as proxy:
        commit = proxy.add(Fault.STALL, "PUT", "log/")
        async with (
            store_process(
                bucket, log_dir / "store-killed.log", port=port, endpoint_url=proxy.endpoint_url
            ) as store,
            store_stub(store.address) as stub,
        ):
            pushing = asyncio.ensure_future(push(stub, "crash", tiny_adapter()))
            async with asyncio.timeout(GUARD_S):
                await commit.hit.wait()
            assert len(keys_under(bucket.keys(), "blobs/")) == 2
            store.kill()
            await store.wait()
            add_figure(config, "faults.sigkill_store")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await pushing
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        proxy.drop()


async def test_store_killed_before_commit_leaves_no_revision_and_no_event(
    s3_bucket: S3Bucket, tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    port = free_port()
    await _kill_store_before_commit(s3_bucket, tmp_path, port, pytestconfig)
    assert keys_under(s3_bucket.keys(), "log/") == []
    async with (
        store_process(s3_bucket, tmp_path / "store-restarted.log", port=port) as store,
        store_stub(store.address) as stub,
    ):
        listed = await stub.ListAdapters(pb.ListAdaptersRequest())
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetAdapter(pb.GetAdapterRequest(name="crash"))
        watched = await first_watch_messages(stub, 0, 1)
    assert (list(listed.adapters), listed.seq) == ([], 0)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert watched[0].WhichOneof("message") == "heartbeat"
    assert watched[0].heartbeat.seq == 0


async def test_push_retried_after_the_kill_commits_revision_one_exactly_once(
    s3_bucket: S3Bucket, tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    port = free_port()
    await _kill_store_before_commit(s3_bucket, tmp_path, port, pytestconfig)
    async with (
        store_process(s3_bucket, tmp_path / "store-restarted.log", port=port) as store,
        store_stub(store.address) as stub,
    ):
        retried = await push(stub, "crash", tiny_adapter())
        revisions = await stub.ListRevisions(pb.ListRevisionsRequest(name="crash"))
        events = await first_watch_messages(stub, 0, 2)
    assert (retried.revision.revision, retried.seq) == (1, 1)
    assert revision_numbers(revisions) == [1]
    assert [m.WhichOneof("message") for m in events] == ["event", "heartbeat"]
    assert len(keys_under(s3_bucket.keys(), "log/")) == 1
