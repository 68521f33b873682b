"""A replica whose store forgot what it knew converges on what the store holds now
(issue 29, items 2 and 3): the store restarted on an emptied bucket, and an adapter
deleted and pushed again while the replica's watch was cut off.

The store runs as a real process on S3 over HTTP (moto); the inference server is the
whole InferenceApp on the session's engine; the oracle is transformers + PEFT.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from loraserve.adapterstore.changelog.logstorage import log_key
from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import PROMPT, RunningInference, adapter_files, inference_app
from loraserve.testing.processes.services import free_port, store_process
from loraserve.testing.processes.tcpproxy import tcp_proxy
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.waiting import PROCESS_GUARD_S, eventually
from loraserve.tiny.oracle import greedy_tokens

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = [pytest.mark.faults, pytest.mark.engine, pytest.mark.slow]


async def _generate_code(inference: RunningInference, adapter: str) -> grpc.StatusCode:
    try:
        await inference.generate(adapter, 4)
    except grpc.aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


async def _serves(inference: RunningInference, name: str, tokens: list[int]) -> bool:
    """Whether `name` answers with revision 1 and `tokens` (it may be briefly unrouted
    while the replica forgets the old store's revisions)."""
    try:
        revision, got = await inference.generate(name, len(tokens))
    except grpc.aio.AioRpcError as e:
        if e.code() is not grpc.StatusCode.NOT_FOUND:
            raise
        return False
    return (revision, list(got)) == (1, tokens)


def _pruned(bucket: S3Bucket, seq: int) -> bool:
    keys = bucket.keys()
    return log_key(seq) not in keys


def _empty(bucket: S3Bucket) -> None:
    client = bucket.client()
    keys = bucket.keys()
    for key in keys:
        client.delete_object(Bucket=bucket.bucket, Key=key)


async def test_replica_follows_a_store_restarted_on_an_emptied_bucket(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    s3_bucket: S3Bucket,
    tmp_path: Path,
) -> None:
    port = free_port()
    renewed = tiny_adapter(seed=6)
    expected = await asyncio.to_thread(greedy_tokens, tiny_model_dir, renewed, PROMPT, 8)
    async with (
        store_process(s3_bucket, tmp_path / "store-1.log", port=port) as first,
        inference_app(
            vllm_engine,
            model_dir=tiny_model_dir,
            store_address=first.address,
            cache_dir=tmp_path / "cache",
        ) as inference,
    ):
        async with store_stub(first.address) as stub:
            await push(stub, "shared", adapter_files(tiny_adapter(seed=1)))
            for seed in (2, 3, 4, 5):
                await push(stub, "gone", adapter_files(tiny_adapter(seed=seed)))
        await eventually(lambda: inference.routes("gone", 4), "gone@4", PROCESS_GUARD_S)
        assert (await inference.generate("shared", 4))[0] == 1
        await first.kill_group()
        _empty(s3_bucket)
        async with (
            store_process(s3_bucket, tmp_path / "store-2.log", port=port) as second,
            store_stub(second.address) as stub,
        ):
            # Revision 1 again, of other content; then a name the old store never had.
            await push(stub, "shared", adapter_files(renewed))
            await push(stub, "fresh", adapter_files(tiny_adapter(seed=7)))
            await eventually(lambda: inference.routes("fresh", 1), "fresh@1", PROCESS_GUARD_S)
            await eventually(lambda: inference.routes("gone", 0), "gone unrouted", 30)
            await eventually(
                lambda: _serves(inference, "shared", expected), "shared@1 anew", PROCESS_GUARD_S
            )
            gone = await _generate_code(inference, "gone")
    assert gone == grpc.StatusCode.NOT_FOUND


async def test_pins_of_a_deleted_generation_go_when_a_relist_shows_the_name_reborn(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    s3_bucket: S3Bucket,
    tmp_path: Path,
) -> None:
    # A snapshot every 10 commits keeps only the newest entry, and the store is
    # restarted (no changes in its memory): the watch that was cut off resumes into
    # pruned seqs (OUT_OF_RANGE) and lists again, where the delete does not show.
    short_log = ("--snapshot-every", "10", "--log-retention", "1")
    port = free_port()
    reborn = tiny_adapter(seed=3)
    async with (
        store_process(s3_bucket, tmp_path / "store-1.log", port=port, extra=short_log) as first,
        tcp_proxy(port) as proxy,
        inference_app(
            vllm_engine,
            model_dir=tiny_model_dir,
            store_address=proxy.address,
            cache_dir=tmp_path / "cache",
            # x@1 is pinned once x@2 is current.
            extra=("--pin-policy", "any"),
        ) as inference,
    ):
        async with store_stub(first.address) as stub:
            for seed in (1, 2):
                await push(stub, "x", adapter_files(tiny_adapter(seed=seed)))
            await eventually(lambda: inference.routes("x", 2), "x@2 routed", PROCESS_GUARD_S)
            assert (await inference.generate("x@1", 4))[0] == 1  # pinned now
            proxy.cut()
            await stub.DeleteAdapter(store_pb.DeleteAdapterRequest(name="x"))
            await push(stub, "x", adapter_files(reborn))
            for seed in range(10, 20):
                await push(stub, "filler", adapter_files(tiny_adapter(seed=seed)))
        await eventually(
            lambda: _pruned(s3_bucket, 3), "the delete's entry pruned", PROCESS_GUARD_S
        )
        await first.kill_group()
        async with store_process(s3_bucket, tmp_path / "store-2.log", port=port, extra=short_log):
            proxy.restore()
            await eventually(lambda: inference.routes("x", 3), "x@3 routed", PROCESS_GUARD_S)
            pinned_old = await _generate_code(inference, "x@1")
            held = await inference.statuses("x")
            revision, tokens = await inference.generate("x", 8)
    expected = await asyncio.to_thread(greedy_tokens, tiny_model_dir, reborn, PROMPT, 8)
    assert pinned_old == grpc.StatusCode.NOT_FOUND
    assert 1 not in held
    assert (revision, list(tokens)) == (3, expected)
