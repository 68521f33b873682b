"""Benchmark 22: canary rollouts on three replicas under load (issue 25).

Three plain `inference serve` replicas (bench.fleet.rig, max_loras 4 each) on one
store, each under its own closed loop of requests for one adapter, half of them with a
caller key (`x-rollout-key`). Each repeat pushes a revision with new weights without
promoting it, starts a rollout of it at 20 %, waits until every replica splits with the
candidate loaded, holds the split, then promotes it (even repeats) or aborts it (odd
ones) and keeps the load on for a while after every replica applied the change.

Timed from the moment the promote or abort is sent: until every request any replica
was sent from then on was served by the revision the change names (the candidate, or
the current revision), read from the answers, which name the revision that served
them; and until every replica has applied the change's seq (its ListAdapters
`store_seq`, polled every 10 ms), after which a replica sends every request to that
revision (tests/test_fleet.py checks it). The goal is on the later of the two: the
answers show a switch only between two requests, the poll adds its round trip.
Counted: requests failed from the rollout's start to the end of its promote or abort
(goal 0), and the candidate's share of each replica's requests while the split held.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.fleet import rollout_figures
from bench.fleet.rig import CALL_TIMEOUT_S, Fleet
from bench.fleet.rollout_figures import Served
from bench.method.report import Cell, Report, Section
from bench.method.stats import median_interval
from bench.rig import storeops
from bench.rig.stack import PROFILES, Stack, tenant
from bench.swap.hot import fresh_variants
from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.inference.adapters import ROLLOUT_KEY_HEADER
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc

NUMBER = 22
ADAPTER = "canary"
WEIGHT = 20.0
POLL_S = 0.01
# Stops a hung wait only; the figures are the times measured.
GUARD_S = 120.0
PROMPT = [1, 40, 41, 42, 43, 44, 45]
CHANGES = ("promote", "abort")


@dataclass(frozen=True)
class RolloutScale:
    replicas: int = 3
    # Repeats of each change (promote, abort), alternating.
    repeats: int = 5
    # Closed-loop clients per replica.
    clients: int = 8
    max_tokens: int = 8
    # Seconds the split holds at WEIGHT before the change.
    hold_s: float = 2.0
    # Seconds the load runs on once every replica applied the change.
    after_s: float = 1.0


QUICK = RolloutScale(repeats=2, clients=4, hold_s=1.0)


@dataclass(frozen=True)
class Repeat:
    change: str
    # Change sent -> every request on every replica served by its target revision.
    to_all_s: float
    # Change sent -> every replica applied its seq.
    applied_s: float
    requests: int
    failed: int
    # Per replica, the candidate's share of the requests sent while the split held.
    shares: tuple[float, ...]


async def _client(
    stub: pb_grpc.InferenceServiceStub,
    replica: int,
    client: int,
    scale: RolloutScale,
    records: list[Served],
    stop: asyncio.Event,
) -> None:
    """Requests one after another until `stop`; odd clients send a caller key."""
    request = pb.GenerateRequest(
        adapter=ADAPTER,
        token_ids=pb.TokenIds(ids=PROMPT),
        sampling=pb.SamplingParams(max_tokens=scale.max_tokens, temperature=0.0, ignore_eos=True),
    )
    sent = 0
    while not stop.is_set():
        sent += 1
        key = f"user-{replica}-{client}-{sent % 64}" if client % 2 else ""
        metadata = ((ROLLOUT_KEY_HEADER, key),) if key else ()
        submitted, revision, error = time.monotonic(), 0, ""
        try:
            async for message in stub.Generate(request, metadata=metadata, timeout=CALL_TIMEOUT_S):
                revision = revision or int(message.revision)
        except grpc.aio.AioRpcError as exc:
            error = exc.code().name
        records.append(Served(replica, submitted, revision, error))


@asynccontextmanager
async def _load(addresses: Sequence[str], scale: RolloutScale) -> AsyncIterator[list[Served]]:
    """Every replica under its own closed loop for the block; the requests' records."""
    records: list[Served] = []
    stop = asyncio.Event()
    async with AsyncExitStack() as channels:
        tasks = []
        for replica, address in enumerate(addresses):
            channel = await channels.enter_async_context(grpc.aio.insecure_channel(address))
            stub = pb_grpc.InferenceServiceStub(channel)
            tasks += [
                asyncio.create_task(_client(stub, replica, client, scale, records, stop))
                for client in range(scale.clients)
            ]
        try:
            yield records
        finally:
            stop.set()
            await asyncio.gather(*tasks)


async def _listing(address: str) -> pb.ListAdaptersResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        response: pb.ListAdaptersResponse = await pb_grpc.InferenceServiceStub(
            channel
        ).ListAdapters(pb.ListAdaptersRequest(), timeout=GUARD_S)
    return response


async def _until_split(address: str, candidate: int) -> None:
    """Until the replica splits at WEIGHT with the candidate loaded."""
    while True:
        listing = await _listing(address)
        if any(
            a.name == ADAPTER
            and a.revision == candidate
            and a.candidate
            and a.rollout_weight == WEIGHT
            and a.state == pb.ADAPTER_STATE_READY
            for a in listing.adapters
        ):
            return
        await asyncio.sleep(POLL_S)


async def _until_applied(address: str, seq: int) -> float:
    """The moment the replica has applied every store change up to `seq`."""
    while True:
        if (await _listing(address)).store_seq >= seq:
            return time.monotonic()
        await asyncio.sleep(POLL_S)


async def _settle(
    addresses: Sequence[str], records: list[Served], seq: int, scale: RolloutScale
) -> float:
    """Waits until every replica applied `seq` (returns when the last one had), then
    `after_s` more and until every replica finished a request sent after that moment:
    the figure needs one on each."""
    async with asyncio.timeout(GUARD_S):
        applied = max(await asyncio.gather(*(_until_applied(a, seq) for a in addresses)))
        await asyncio.sleep(scale.after_s)
        while True:
            if rollout_figures.covered(records, len(addresses), applied):
                return applied
            await asyncio.sleep(POLL_S)


async def _repeat(
    fleet: Fleet, store: Any, scale: RolloutScale, change: str, directory: Path
) -> Repeat:
    """One rollout under load: start, hold, then `change` (promote or abort)."""
    files = await storeops.hashed(directory)
    candidate = await storeops.push(store, ADAPTER, files, no_promote=True)
    adapter = await store.GetAdapter(store_pb.GetAdapterRequest(name=ADAPTER), timeout=GUARD_S)
    current = int(adapter.adapter.current_revision)
    guards = store_pb.RolloutGuards(abort_on_nack=True)
    start = store_pb.StartRolloutRequest(
        name=ADAPTER, revision=candidate, weight=WEIGHT, guards=guards
    )
    async with _load(fleet.addresses, scale) as records:
        await store.StartRollout(start, timeout=GUARD_S)
        async with asyncio.timeout(GUARD_S):
            await asyncio.gather(*(_until_split(a, candidate) for a in fleet.addresses))
        held_from = time.monotonic()
        await asyncio.sleep(scale.hold_s)
        changed_at = time.monotonic()
        if change == "promote":
            ended = await store.PromoteRollout(
                store_pb.PromoteRolloutRequest(name=ADAPTER, expected_candidate_revision=candidate),
                timeout=GUARD_S,
            )
        else:
            ended = await store.AbortRollout(
                store_pb.AbortRolloutRequest(name=ADAPTER, reason="bench"), timeout=GUARD_S
            )
        applied = await _settle(fleet.addresses, records, int(ended.seq), scale)
    target = candidate if change == "promote" else current
    shares = rollout_figures.candidate_shares(records, candidate, held_from, changed_at)
    return Repeat(
        change,
        rollout_figures.time_to_all(records, target, changed_at),
        applied - changed_at,
        len(records),
        rollout_figures.failures(records),
        tuple(shares.values()),
    )


def _change_figures(section: Section, change: str, done: list[Repeat]) -> list[Cell]:
    """One change's repeats: kept, judged, and its row of the table."""
    section.record(
        change,
        [
            {
                "to_all_s": r.to_all_s,
                "applied_s": r.applied_s,
                "requests": r.requests,
                "failed": r.failed,
                "candidate_share_min": min(r.shares, default=float("nan")),
                "candidate_share_max": max(r.shares, default=float("nan")),
            }
            for r in done
        ],
    )
    to_all = [r.to_all_s for r in done]
    # The answers can only show a switch between two requests, so with few requests a
    # second they may place it early; the seq's poll places it late (the poll's own
    # round trip). The later of the two bounds the time from above.
    bound = [max(r.to_all_s, r.applied_s) for r in done]
    shares = [s for r in done for s in r.shares]
    failed = sum(r.failed for r in done)
    section.goal(
        f"{change} -> 100 % of requests on every replica to its revision (s, upper bound)",
        median_interval(bound),
        "<",
        1.0,
        ".3f",
    )
    section.check(
        f"{change} -> 100 % on every replica, slowest of {len(done)} (s, upper bound)",
        max(bound),
        "< 1 s",
        max(bound) < 1.0,
        ".3f",
    )
    section.check(f"requests failed from start to {change}, under load", failed, "0", failed == 0)
    return [
        change,
        len(done),
        sum(r.requests for r in done),
        failed,
        median_interval(to_all).text(".3f"),
        median_interval([r.applied_s for r in done]).text(".3f"),
        max(bound),
        f"{100 * min(shares):.1f}-{100 * max(shares):.1f}" if shares else "n/a",
    ]


def _figures(section: Section, scale: RolloutScale, repeats: list[Repeat]) -> None:
    rows = [_change_figures(section, c, [r for r in repeats if r.change == c]) for c in CHANGES]
    section.table(
        f"rollouts at {WEIGHT:g} % under load ({scale.clients} clients per replica)",
        [
            "change",
            "repeats",
            "requests",
            "failed",
            "last other revision served, median [interval] s",
            "seq applied on all, median [interval] s",
            "slowest, upper bound s",
            f"candidate share at {WEIGHT:g} % (%, min-max)",
        ],
        rows,
    )


async def run(
    report: Report, *, quick: bool, engine: str = "cpu", scale: RolloutScale | None = None
) -> None:
    """Benchmark 22."""
    scale = scale or (QUICK if quick else RolloutScale())
    section = report.section(NUMBER, f"Canary rollouts: {scale.replicas} replicas under load")
    work = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    stack = Stack(report.results_dir, work, PROFILES[engine])
    fleet = Fleet(stack, scale.replicas)
    started = time.monotonic()
    try:
        stack.build_models()
        await stack.start_store()
        first = await stack.push(ADAPTER, tenant(0))
        await fleet.start()
        await fleet.wait_routed({ADAPTER: first})
        assert stack.store_channel is not None
        store = storeops.store_stub(stack.store_channel)
        variants = await fresh_variants(stack, len(CHANGES) * scale.repeats)
        section.workload.append(
            f"{scale.repeats} rollouts of each change, alternating; {scale.clients} closed-loop "
            f"clients per replica ({scale.max_tokens} tokens, half with a caller key); "
            f"{scale.hold_s:g} s at {WEIGHT:g} %, {scale.after_s:g} s after the change"
        )
        repeats = [
            await _repeat(fleet, store, scale, CHANGES[i % len(CHANGES)], directory)
            for i, directory in enumerate(variants)
        ]
        _figures(section, scale, repeats)
    except Exception as exc:
        section.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        section.seconds = time.monotonic() - started
        report.print_section(section)
        await stack.close()
