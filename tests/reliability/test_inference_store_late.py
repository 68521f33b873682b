"""A fleet brought up in any order: an inference replica started before its adapter
store waits for it (NOT_SERVING, retrying with backoff), then sizes its engine and
serves, whether `--max-lora-rank` is `auto` or a number.

Both are real processes; the store starts only once the replica's log shows it has
failed to reach the store several times, so the test proves the replica survived
those failures, whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path

import grpc
import pytest

from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import adapter_files, greedy
from loraserve.testing.processes.services import (
    StoreProcess,
    free_port,
    inference_process,
    store_process,
)
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import running_store
from loraserve.testing.waiting import FLEET_GUARD_S, eventually

pytestmark = [pytest.mark.faults, pytest.mark.engine, pytest.mark.slow]

FAILED_ATTEMPTS = 3
# Above the tests' default --max-lora-rank of 16, so only a replica sized from the
# store's adapters (or told 32) can serve it.
RANK = 32

# --max-lora-rank value -> the log event of one failed attempt to reach the store.
WAITS = {
    "auto": "engine.auto_rank_waiting",
    str(RANK): "sync.list_failed",
}


@pytest.mark.parametrize("max_lora_rank", WAITS, ids=[f"max-lora-rank-{r}" for r in WAITS])
async def test_replica_started_before_the_store_waits_then_serves_the_stores_adapters(
    max_lora_rank: str,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    s3_bucket: S3Bucket,
    tmp_path: Path,
) -> None:
    async with running_store(s3_bucket) as earlier, store_stub(earlier.address) as stub:
        await push(stub, "alpha", adapter_files(tiny_adapter(rank=RANK, seed=1)))
    port = free_port()
    inference_log = tmp_path / "inference.log"
    failed_attempt = WAITS[max_lora_rank]

    def failed_attempts() -> int:
        text = inference_log.read_text(errors="replace") if inference_log.exists() else ""
        return text.count(failed_attempt)

    async with AsyncExitStack() as later:

        async def start_store_once_the_replica_has_waited() -> StoreProcess:
            await eventually(
                lambda: failed_attempts() >= FAILED_ATTEMPTS,
                f"{FAILED_ATTEMPTS} x {failed_attempt} in the replica's log",
                guard_s=FLEET_GUARD_S,
            )
            return await later.enter_async_context(
                store_process(s3_bucket, tmp_path / "store.log", port=port)
            )

        starting_store = asyncio.ensure_future(start_store_once_the_replica_has_waited())
        try:
            async with (
                inference_process(
                    tiny_model_dir,
                    f"127.0.0.1:{port}",
                    tmp_path / "cache",
                    inference_log,
                    extra=["--max-lora-rank", max_lora_rank],
                    guard_s=FLEET_GUARD_S,
                ) as inference,
                grpc.aio.insecure_channel(inference.address) as channel,
            ):
                await starting_store
                replica = pb_grpc.InferenceServiceStub(channel)
                info = await replica.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
                revisions = {
                    message.revision
                    async for message in replica.Generate(greedy("alpha", 4), timeout=60)
                    if message.revision
                }
        finally:
            starting_store.cancel()
            await asyncio.gather(starting_store, return_exceptions=True)
    assert failed_attempts() >= FAILED_ATTEMPTS
    assert info.engine.max_lora_rank == RANK
    assert revisions == {1}
