"""A commit whose outcome the store cannot see is made once.

S3 applies the conditional PUT of `log/<seq>`, the fault proxy cuts the reply, and
botocore retries the PUT, which gets 412 because of the store's own first
attempt. The store must read the entry back, find its own commit id and report
success, not commit again at the next seq. A client retry with the same
idempotency key after UNAVAILABLE or a store crash must not make a second change.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.adapters.ctl import ctl, write_adapter_dir
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.processes.services import free_port, store_process
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import Fault, Rule, S3FaultProxy, s3_fault_proxy
from loraserve.testing.store.calls import keys_under, push, revision_numbers, store_stub
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import GUARD_S

pytestmark = pytest.mark.faults


def _env(store: RunningStore) -> dict[str, str]:
    return {"ADAPTERSTORE_ADDR": store.address}


def _lose_next_log_reply(fault_proxy: S3FaultProxy) -> Rule:
    """S3 applies the next log PUT; its reply never reaches the store."""
    return fault_proxy.add(Fault.CUT_RESPONSE, "PUT", "log/", after_bytes=0, times=1)


async def _revisions(store: RunningStore, name: str) -> list[int]:
    async with store_stub(store.address) as stub:
        listing = await stub.ListRevisions(pb.ListRevisionsRequest(name=name))
    return revision_numbers(listing)


async def test_push_whose_log_reply_is_lost_makes_exactly_one_revision(
    proxied_store: RunningStore, fault_proxy: S3FaultProxy, s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    lost = _lose_next_log_reply(fault_proxy)
    result = await ctl("push", "alpha", str(write_adapter_dir(tmp_path)), env=_env(proxied_store))
    assert lost.hits == 1
    assert (result.code, result.out) == (0, "alpha@1\n"), result.err
    assert await _revisions(proxied_store, "alpha") == [1]
    assert len(keys_under(s3_bucket.keys(), "log/")) == 1


async def test_rollback_whose_log_reply_is_lost_reports_success(
    proxied_store: RunningStore, fault_proxy: S3FaultProxy, s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    env = _env(proxied_store)
    await ctl("push", "alpha", str(write_adapter_dir(tmp_path / "a")), env=env)
    await ctl("push", "alpha", str(write_adapter_dir(tmp_path / "b", seed=1)), env=env)
    lost = _lose_next_log_reply(fault_proxy)
    result = await ctl("rollback", "alpha", "1", "--expect-current", "2", env=env)
    assert lost.hits == 1
    assert (result.code, result.out, result.err) == (0, "alpha@1\n", "")
    assert len(keys_under(s3_bucket.keys(), "log/")) == 3


async def test_delete_whose_log_reply_is_lost_reports_success(
    proxied_store: RunningStore, fault_proxy: S3FaultProxy, s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    env = _env(proxied_store)
    await ctl("push", "alpha", str(write_adapter_dir(tmp_path)), env=env)
    lost = _lose_next_log_reply(fault_proxy)
    result = await ctl("delete", "alpha", "--yes", env=env)
    assert lost.hits == 1
    assert (result.code, result.out, result.err) == (0, "deleted alpha\n", "")
    assert len(keys_under(s3_bucket.keys(), "log/")) == 2


async def test_cli_push_retried_after_unavailable_makes_one_revision(
    proxied_store: RunningStore, fault_proxy: S3FaultProxy, s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    """The commit lands, but the store cannot confirm it (the read-back is refused
    too) and answers UNAVAILABLE; adapterctl's retry carries the same key."""
    lost = _lose_next_log_reply(fault_proxy)
    # The commit holds the log's lock, so the first log GET after the lost reply
    # is the commit's own read-back, not the poller's.
    refused = fault_proxy.add(Fault.REFUSE, "GET", "log/", times=1, after=lost)
    result = await ctl("push", "alpha", str(write_adapter_dir(tmp_path)), env=_env(proxied_store))
    assert refused.hits == 1
    assert (result.code, result.out) == (0, "alpha@1\n"), result.err
    assert "UNAVAILABLE" in result.err
    assert "retrying" in result.err
    assert await _revisions(proxied_store, "alpha") == [1]
    assert len(keys_under(s3_bucket.keys(), "log/")) == 1


async def test_push_retried_with_its_key_after_a_store_kill_makes_one_revision(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    """The log PUT reaches S3 but its reply is lost, and the store is SIGKILLed while
    it reads the entry back. The client saw UNAVAILABLE and pushes again with its
    key to the restarted store: the answer is the revision the first push made."""
    s3_port = urlsplit(s3_bucket.endpoint_url).port
    assert s3_port is not None
    port = free_port()
    files = tiny_adapter()
    async with s3_fault_proxy(s3_port) as proxy:
        lost = _lose_next_log_reply(proxy)
        # The commit holds the log's lock: the next log GET is the commit's own.
        held = proxy.add(Fault.STALL, "GET", "log/", times=1, after=lost)
        async with (
            store_process(
                s3_bucket, tmp_path / "killed.log", port=port, endpoint_url=proxy.endpoint_url
            ) as store,
            store_stub(store.address) as stub,
        ):
            pushing = asyncio.ensure_future(push(stub, "crash", files, idempotency_key="k-1"))
            async with asyncio.timeout(GUARD_S):
                await held.hit.wait()
            store.kill()
            await store.wait()
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await pushing
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        proxy.drop()
    assert len(keys_under(s3_bucket.keys(), "log/")) == 1
    async with (
        store_process(s3_bucket, tmp_path / "restarted.log", port=port) as store,
        store_stub(store.address) as stub,
    ):
        retried = await push(stub, "crash", files, idempotency_key="k-1")
        listing = await stub.ListRevisions(pb.ListRevisionsRequest(name="crash"))
    assert (retried.revision.revision, retried.seq) == (1, 1)
    assert revision_numbers(listing) == [1]
    [entry] = keys_under(s3_bucket.keys(), "log/")
    stored = s3_bucket.client().get_object(Bucket=s3_bucket.bucket, Key=entry)["Body"].read()
    assert json.loads(stored)["request_key"] == "k-1"
