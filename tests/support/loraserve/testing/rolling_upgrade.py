"""The rolling upgrade of issue 58 (tests/reliability/test_rolling_upgrade.py), step by
step: what each party saw (`Upgrade`), the replicas of either release, the changes made
through both stores, the old release stopped under a closed-loop load, today's store
alone on the bucket and the downgrade; and the storage format of every snapshot on the
bucket (the lead's format checks build on this)."""

from __future__ import annotations

import asyncio
import gzip
import json
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.clients.inference import InferenceClient, RetryPolicy, Sampling
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import PROMPT, adapter_files, greedy
from loraserve.testing.processes.services import (
    InferenceProcess,
    StoreProcess,
    health_status,
    inference_process,
    store_process,
)
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import keys_under, push, store_stub
from loraserve.testing.upgrading import Event, Load, Watch, closed_loop, log_entries
from loraserve.testing.waiting import eventually

GUARD_S = 600.0
# Snapshots every other commit: both releases write several on the shared bucket.
STORE_FLAGS = ("--snapshot-every", "2")
# Flags only today's store knows: its presence on the bucket, announced often; and a
# short status TTL, so the old store's last sign of life ages out within the test.
HEAD_STORE_FLAGS = ("--presence-interval", "0.5", "--status-ttl", "15")
# Longer than any stream here could need: a stream running at the SIGTERM is not cut by
# it; reports often enough for the short TTL.
REPLICA_FLAGS = ("--shutdown-grace", "120", "--status-interval", "2")
A, B = "upgrade-a", "upgrade-b"
LOAD = Sampling(max_tokens=16, temperature=0.0, ignore_eos=True)
HELD_TOKENS = 300
# A request refused by a replica that is going away moves on quickly.
RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.05, max_backoff=0.2)
OLD, NEW = "old", "new"
SERVING = 1  # grpc.health.v1's HealthCheckResponse.SERVING


@dataclass
class Upgrade:
    """What each party saw during the upgrade."""

    served_by_old_replica: int = 0
    # The seq of B1's push, and the seq its retry through the other store answered.
    replayed: tuple[int, int] = (0, 0)
    head: int = 0
    watched: dict[str, list[Event]] = field(default_factory=dict)
    load: Load = field(default_factory=Load)
    # Requests R2 served after R1 exited, and after S1 exited too.
    served_after_exits: list[int] = field(default_factory=list)
    # Tokens of each stream running on R1 at its SIGTERM, or the status it ended with.
    held: list[int | str] = field(default_factory=list)
    exit_codes: dict[str, int] = field(default_factory=dict)
    replica_seq: int = 0
    serving: dict[str, int] = field(default_factory=dict)
    generated: dict[str, int] = field(default_factory=dict)
    log: list[dict[str, Any]] = field(default_factory=list)
    # Every snapshot's format while the old release ran, and once today's store was
    # alone on the bucket (the seq of its first change then).
    snapshots: dict[int, int] = field(default_factory=dict)
    alone_from: int = 0
    final_head: int = 0
    snapshots_alone: dict[int, int] = field(default_factory=dict)
    # The downgrade: whether the old release's store served on today's snapshots, what
    # it said instead, and the seq it served after today's store wrote format 1 again.
    old_store_served_on_format_2: bool = True
    old_store_said: str = ""
    log_after_refusal: int = 0
    old_store_seq_after_rewrite: int = 0


async def alone_on_the_bucket(
    seen: Upgrade, s2: StoreProcess, bucket: S3Bucket, tiny_adapter: TinyAdapterFactory
) -> None:
    """Once the old store's last sign of life has aged out, today's store moves to format
    2: two more changes through it reach a snapshot seq."""
    await eventually(
        lambda: "store.storage_format format=2" in s2.log_text(), "S2 moved to format 2", GUARD_S
    )
    seen.alone_from = seen.final_head = seen.head + 1
    async with store_stub(s2.address) as stub:
        for seed in (5, 6):
            seen.final_head = (await push(stub, A, adapter_files(tiny_adapter(seed=seed)))).seq
    seen.snapshots_alone = {
        seq: f for seq, f in snapshot_formats(bucket).items() if seq >= seen.alone_from
    }


async def rolled_back(
    seen: Upgrade, s2: StoreProcess, bucket: S3Bucket, old: str, directory: Path
) -> None:
    """The old release's store on the bucket today's store wrote format 2 on; then today's
    store restarted with --storage-format 1, and the old store again."""
    async with store_process(
        bucket, directory / "s3-old.log", extra=STORE_FLAGS, python=old, wait_serving=False
    ) as s3:
        await eventually(lambda: "corrupt" in s3.log_text(), "S3 said why", GUARD_S)
        seen.old_store_served_on_format_2 = await health_status(s3.address) == SERVING
        seen.old_store_said = next(line for line in s3.log_text().splitlines() if "corrupt" in line)
    seen.log_after_refusal = len(log_entries(bucket))
    s2.terminate()
    await s2.wait(GUARD_S)
    held = ("--storage-format", "1", *HEAD_STORE_FLAGS)
    async with store_process(bucket, directory / "s2-held.log", extra=(*STORE_FLAGS, *held)):
        await eventually(
            lambda: max(snapshot_formats(bucket).items())[1] == 1,
            "the newest snapshot in format 1 again",
            GUARD_S,
        )
    async with (
        store_process(bucket, directory / "s4-old.log", extra=STORE_FLAGS, python=old) as s4,
        store_stub(s4.address) as stub,
    ):
        listing = await stub.ListAdapters(store_pb.ListAdaptersRequest(), timeout=GUARD_S)
        seen.old_store_seq_after_rewrite = listing.seq


def replica_process(
    model_dir: Path, store: StoreProcess, directory: Path, name: str, python: str
) -> AbstractAsyncContextManager[InferenceProcess]:
    return inference_process(
        model_dir,
        store.address,
        directory / f"cache-{name}",
        directory / f"{name}.log",
        extra=("--replica-id", name, *REPLICA_FLAGS),
        guard_s=GUARD_S,
        python=python,
    )


async def watched_changes(
    seen: Upgrade, s1: StoreProcess, s2: StoreProcess, tiny_adapter: TinyAdapterFactory
) -> None:
    """Changes through both stores, interleaved, each store watched from seq 0."""
    b1 = adapter_files(tiny_adapter(seed=3))
    async with store_stub(s1.address) as old, store_stub(s2.address) as new:
        watches = {OLD: Watch(old), NEW: Watch(new)}
        await push(new, A, adapter_files(tiny_adapter(seed=2)), idempotency_key="a2")
        first = await push(old, B, b1, idempotency_key="b1")
        retried = await push(new, B, b1, idempotency_key="b1")
        seen.replayed = (first.seq, retried.seq)
        await old.SetCurrentRevision(
            store_pb.SetCurrentRevisionRequest(
                name=A, revision=1, expected_current_revision=2, idempotency_key="a-rollback"
            ),
            timeout=GUARD_S,
        )
        b2 = adapter_files(tiny_adapter(seed=4))
        await push(old, B, b2, no_promote=True, idempotency_key="b2")
        start = store_pb.StartRolloutRequest(
            name=B, revision=2, weight=50, idempotency_key="b-rollout-start"
        )
        await new.StartRollout(start, timeout=GUARD_S)
        promote = store_pb.PromoteRolloutRequest(
            name=B, expected_candidate_revision=2, idempotency_key="b-rollout-promote"
        )
        seen.head = (await new.PromoteRollout(promote, timeout=GUARD_S)).seq
        await eventually(
            lambda: all(w.quiet_at >= seen.head for w in watches.values()),
            "both watches delivered every change",
            GUARD_S,
        )
        for name, watch in watches.items():
            seen.watched[name] = await watch.close()


async def old_release_stopped_under_load(
    seen: Upgrade, r1: InferenceProcess, s1: StoreProcess, r2: InferenceProcess
) -> None:
    """SIGTERMs R1, then S1, while the closed-loop client generates on both replicas."""
    load, stop = seen.load, asyncio.Event()
    async with (
        InferenceClient(r1.address, retry=RETRY, timeout=GUARD_S) as old,
        InferenceClient(r2.address, retry=RETRY, timeout=GUARD_S) as new,
    ):
        orders = [[(OLD, old), (NEW, new)], [(NEW, new), (OLD, old)]]
        workers = [
            asyncio.create_task(closed_loop(order, adapter, LOAD, load, stop))
            for order in orders
            for adapter in (A, B)
        ]
        try:
            await eventually(
                lambda: min(load.served[OLD], load.served[NEW]) >= 2, "load on both", GUARD_S
            )
            seen.held = await _streams_across_sigterm(r1)
            seen.exit_codes[OLD + " replica"] = await r1.wait(GUARD_S)
            seen.served_after_exits.append(await _served_more(load))
            s1.terminate()
            seen.exit_codes[OLD + " store"] = await s1.wait(GUARD_S)
            seen.served_after_exits.append(await _served_more(load))
        finally:
            stop.set()
            await asyncio.gather(*workers)


async def _streams_across_sigterm(r1: InferenceProcess) -> list[int | str]:
    """Two long streams on R1 with a first token each, then R1's SIGTERM: the tokens each
    stream got in all, or the status it ended with."""
    async with grpc.aio.insecure_channel(r1.address) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        streams = [stub.Generate(greedy(A, HELD_TOKENS), timeout=GUARD_S) for _ in range(2)]
        firsts = [await anext(aiter(stream)) for stream in streams]
        r1.terminate()

        async def rest(first: pb.GenerateResponse, stream: Any) -> int | str:
            try:
                return len(first.token_ids) + sum([len(m.token_ids) async for m in stream])
            except grpc.aio.AioRpcError as e:
                return str(e.code().name)

        return list(await asyncio.gather(*map(rest, firsts, streams)))


async def _served_more(load: Load) -> int:
    """Waits until R2 has served a few more requests; how many it had by then."""
    at = load.served[NEW]
    await eventually(lambda: load.served[NEW] >= at + 4, "load goes on on R2", GUARD_S)
    return load.served[NEW] - at


async def applied(replica: InferenceProcess, seq: int) -> bool:
    async with InferenceClient(replica.address) as client:
        return (await client.list_adapters()).store_seq >= seq


async def served_once_current(replica: InferenceProcess, name: str, revision: int) -> int:
    """Waits until `replica` serves `name` at `revision`; the revision a Generate got."""
    async with InferenceClient(replica.address) as client:

        async def current() -> bool:
            listing = await client.list_adapters()
            return any(
                a.name == name and a.current and a.revision == revision for a in listing.adapters
            )

        await eventually(current, f"{name}@{revision} current", GUARD_S)
        return (await client.generate(name, PROMPT, LOAD)).revision


async def converged(seen: Upgrade, replica: InferenceProcess) -> None:
    async with InferenceClient(replica.address) as client:
        listing = await client.list_adapters()
        seen.replica_seq = listing.store_seq
        seen.serving = {
            a.name: a.revision
            for a in listing.adapters
            if a.current and a.state == pb.ADAPTER_STATE_READY
        }
        for name in (A, B):
            seen.generated[name] = (await client.generate(name, PROMPT, LOAD)).revision


_GZIP_MAGIC = b"\x1f\x8b"


def snapshot_formats(bucket: S3Bucket) -> dict[int, int]:
    """seq -> format of every snapshot in the bucket: format 1 is plain JSON saying
    `"format": 1`, format 2 gzip bytes whose JSON says `"format": 2`; any other shape
    fails the test that asked."""
    client = bucket.client()
    formats: dict[int, int] = {}
    for key in keys_under(bucket.keys(), "snapshots/"):
        data = client.get_object(Bucket=bucket.bucket, Key=key)["Body"].read()
        compressed = data.startswith(_GZIP_MAGIC)
        stated = json.loads(gzip.decompress(data) if compressed else data)["format"]
        assert (compressed, stated) in {(False, 1), (True, 2)}, (key, compressed, stated)
        formats[int(key.removeprefix("snapshots/").removesuffix(".json"))] = stated
    return formats
