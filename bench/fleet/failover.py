"""Benchmark 10's failover: one replica SIGKILLed under uniform load, through HAProxy
or through the client library; failed requests counted before and after their first
token."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace

import grpc

from bench.fleet.rig import CALL_TIMEOUT_S, HAPROXY_CONFIG, Fleet
from bench.load.calls import grpc_caller, grpc_stub_caller
from bench.load.workload import Caller, RunResult, Workload, run_closed_loop
from bench.method.report import Section
from loraserve.clients.inference import InferenceClient
from loraserve.common.config.sizes import MESSAGE_LIMIT_OPTIONS
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc

# The gRPC service config deploy/README.md gives HAProxy's clients.
SERVICE_CONFIG = HAPROXY_CONFIG.with_name("grpc-service-config.json")
# Streams the victim runs or queues when it is killed, at least: killed idle, between
# two requests, it failed nothing and tested nothing.
MIN_HELD = 2


@asynccontextmanager
async def client_caller(fleet: Fleet) -> AsyncIterator[Caller]:
    async with InferenceClient(",".join(fleet.addresses), timeout=CALL_TIMEOUT_S) as client:
        yield grpc_caller(client)


@asynccontextmanager
async def proxy_caller(proxy: str) -> AsyncIterator[Caller]:
    """A plain gRPC channel to HAProxy with the service config deploy/README.md gives
    clients of other languages: Generate retried on UNAVAILABLE, which gRPC does only
    before the response's headers (the first token). HAProxy answers REFUSED_STREAM
    (UNAVAILABLE) for a stream a dead replica dropped before any response."""
    options = [*MESSAGE_LIMIT_OPTIONS, ("grpc.service_config", SERVICE_CONFIG.read_text())]
    async with grpc.aio.insecure_channel(proxy, options=options) as channel:
        yield grpc_stub_caller(channel, affinity=True, timeout=CALL_TIMEOUT_S)


@asynccontextmanager
async def proxy_client_caller(proxy: str) -> AsyncIterator[Caller]:
    """The project's client of HAProxy as one server: it sends Generate again on a
    stream that HAProxy ended with no status before its first message (haproxy#736),
    which gRPC's own retry policy cannot (the response's headers had arrived)."""
    async with InferenceClient(proxy, timeout=CALL_TIMEOUT_S) as client:
        yield grpc_caller(client)


@dataclass(frozen=True)
class CallPath:
    """A way to call the fleet: its name, its caller, and whether no request failing
    before its first token is a goal of it or only reported."""

    name: str
    caller: AbstractAsyncContextManager[Caller]
    goal: bool = True


async def failover(
    section: Section, fleet: Fleet, workload: Workload, paths: Sequence[CallPath], victim: int
) -> None:
    """`workload` through each of `paths` at once, its streams and requests split evenly
    between them; replica `victim` is SIGKILLed once it has served a few and holds
    streams (MIN_HELD). A call it held fails mid-stream; one it had not answered moves
    on."""
    replicas = len(fleet.addresses)
    share = replace(
        workload,
        concurrency=workload.concurrency // len(paths),
        requests=workload.requests // len(paths),
    )
    async with AsyncExitStack() as stack:
        callers = [await stack.enter_async_context(path.caller) for path in paths]
        before = (await fleet.served())[victim]
        loads = [asyncio.create_task(run_closed_loop(share, caller)) for caller in callers]
        held = 0
        while not any(load.done() for load in loads):
            served = (await fleet.served())[victim] - before
            if served.total() >= max(1, workload.concurrency // (2 * replicas)):
                held = await _in_flight(fleet.addresses[victim])
                if held >= MIN_HELD:
                    break
            await asyncio.sleep(0.05)
        killed_at = time.monotonic()
        fleet.kill(victim)
        results = await asyncio.gather(*loads)
    for path, result in zip(paths, results, strict=True):
        section.workload.append(
            f"failover through {path.name}: {share.describe()}; replica {victim} SIGKILLed"
            + (f", beside {len(paths) - 1} other path(s) as loaded" if len(paths) > 1 else "")
        )
        failover_figures(section, result, killed_at, held, replicas, path.name, goal=path.goal)


def failover_figures(
    section: Section,
    result: RunResult,
    killed_at: float,
    held: int,
    replicas: int,
    path: str = "InferenceClient",
    goal: bool = True,
) -> None:
    """Failures before the first token (none may: the call moves on; only reported where
    `goal` is false) and mid-stream (at most the streams the dead replica held, over
    every path that loaded it)."""
    failed = [r for r in result.records if r.error]
    before_first = [r for r in failed if not r.first_token]
    mid_stream = len(failed) - len(before_first)
    after_kill = [r for r in result.records if r.submitted >= killed_at]
    counts = {
        "requests": len(result.records),
        "sent_after_the_kill": len(after_kill),
        "failed_before_first_token": len(before_first),
        "failed_mid_stream": mid_stream,
        "held_by_the_killed_replica": held,
    }
    section.record(f"failover ({path})", [counts])
    section.table(
        f"one of {replicas} replicas SIGKILLed mid-load, through {path}",
        list(counts),
        [list(counts.values())],
    )
    if before_first:
        section.notes.append(f"first failure before a token: {before_first[0].error}")
    figure = f"requests failed before their first token, a replica SIGKILLed ({path})"
    if goal:
        section.check(figure, len(before_first), "0", not before_first)
    else:
        section.reported(figure, len(before_first), "d")
    section.check(
        f"requests failed mid-stream, a replica SIGKILLed ({path})",
        mid_stream,
        f"<= the {held} it was running or queueing when killed (a stream cannot move)",
        mid_stream <= held,
    )


async def _in_flight(address: str) -> int:
    """Sequences a replica runs or queues now, as it counts them itself when it admits
    and ends each (`GetReplicaLoad`): the engine's own running and waiting counts
    (`GetServerInfo`) are as of its last scheduler step, and once read 2 of the 17
    streams a replica killed a second into the load had."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        load = await stub.GetReplicaLoad(pb.GetReplicaLoadRequest())
    return int(load.pending_sequences)
